"""A decoder layer's source as transformers writes it, for the codemods to rewrite."""

# A decoder layer shaped like transformers 5.16's (sectioned rotary) in a few lines that run.
DECODER = """\
import torch
from torch import nn


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section, unsqueeze_dim=1):
    mrope_section = mrope_section * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(mrope_section, dim=-1))], dim=-1).unsqueeze(unsqueeze_dim)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(mrope_section, dim=-1))], dim=-1).unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Qwen2_5_VLRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size) + 0.1 * torch.randn(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


class Qwen2MLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def sdpa_attention_forward(module, query, key, value, attention_mask, scaling=None, **kwargs):
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling, is_causal=attention_mask is None and query.shape[2] > 1
    )
    return out.transpose(1, 2), None


class Qwen2_5_VLAttention(nn.Module):
    def __init__(self, hidden, heads, kv_heads):
        super().__init__()
        self.head_dim = hidden // heads
        self.scaling = self.head_dim**-0.5
        self.section = [2, 1, 1]
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        bsz, q_len, _ = hidden_states.size()

        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)

        query_states = query_states.view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        key_states = key_states.view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        value_states = value_states.view(bsz, q_len, -1, self.head_dim).transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_multimodal_rotary_pos_emb(
            query_states, key_states, cos, sin, self.section
        )
        attention_interface = sdpa_attention_forward
        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask, scaling=self.scaling, **kwargs
        )
        attn_output = attn_output.reshape(bsz, q_len, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output, None


class Qwen2_5_VLDecoderLayer(nn.Module):
    def __init__(self, hidden=32, heads=4, kv_heads=2, inter=48):
        super().__init__()
        self.self_attn = Qwen2_5_VLAttention(hidden, heads, kv_heads)
        self.mlp = Qwen2MLP(hidden, inter)
        self.input_layernorm = Qwen2_5_VLRMSNorm(hidden)
        self.post_attention_layernorm = Qwen2_5_VLRMSNorm(hidden)

    def forward(self, hidden_states, position_embeddings=None, **kwargs):
        \"\"\"A decoder layer.\"\"\"
        residual = hidden_states

        hidden_states = self.input_layernorm(hidden_states)

        # Self Attention
        hidden_states, _ = self.self_attn(
            hidden_states=hidden_states,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        hidden_states = residual + hidden_states

        # Fully Connected
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states
"""
