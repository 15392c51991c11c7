"""Faster torch paths for every device (CPU, CUDA): fewer passes over memory, no per-call weight copies.

Each function returns the same math as `reference` within the golden tolerances; where a fused form was
measured slower than the eager one (see benchmarks/bench_kernels.py), it uses the eager form instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import decode_lengths, reference

# Above ~64 rows of 2048 the fused form measured no faster (0.78-1.00x, bf16, 2-core CPU), so larger
# inputs (prefill, the vision tower) take the eager body: `auto` must never pick a slower path.
RMS_NORM_FUSED_MAX_ELEMENTS = 64 * 2048


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The eager body's exact result, with the normalisation in one fused op.

    F.rms_norm straight on bf16 was 1.2-1.3x faster at decode sizes but rounds differently from the
    eager fp32-upcast body (up to 0.03 per element); through GutenOCR's 32 vision layers that grew into
    failing logits in verify. Normalising in fp32 and multiplying by the weight afterwards, in the eager
    order, gives the same bits (measured 1.0-1.2x faster, 1-256 tokens of width 2048, bf16).
    """
    if weight.dim() != 1 or hidden_states.numel() > RMS_NORM_FUSED_MAX_ELEMENTS:
        return reference.rms_norm(hidden_states, weight, eps)
    normed = F.rms_norm(hidden_states.to(torch.float32), (hidden_states.shape[-1],), None, eps)
    return weight * normed.to(hidden_states.dtype)


class _MixedTableCache:
    """Section-mixed cos/sin tables, built once per forward and reused by every decoder layer.

    Keyed on the identity and version counter of the input tables: the rotary embedding produces new
    cos/sin tensors once per forward, and every layer passes those same tensors. Strong references to
    the last inputs are held so an id can never be recycled while its entry is live.
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._inputs: tuple[torch.Tensor, torch.Tensor] | None = None
        self._value: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.builds = 0

    def get(self, cos: torch.Tensor, sin: torch.Tensor, section: tuple[int, ...] | None, unsqueeze_dim: int):
        key = (
            decode_lengths.version_of(cos),  # the rotary embedding makes new ones every forward
            decode_lengths.version_of(sin),
            tuple(cos.shape),
            cos.dtype,
            cos.device,
            section,
            unsqueeze_dim,
        )
        inputs = self._inputs
        if key == self._key and inputs is not None and inputs[0] is cos and inputs[1] is sin:
            return self._value
        if section is None:
            mixed_cos, mixed_sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        else:
            mixed_cos, mixed_sin = reference.mix_sections(cos, sin, section, unsqueeze_dim)
        half = mixed_sin.shape[-1] // 2
        # sin with the rotate_half sign folded in: rotate_half(x) * sin == swap_halves(x) * signed_sin
        signed_sin = torch.cat((-mixed_sin[..., :half], mixed_sin[..., half:]), dim=-1)
        self._key, self._inputs = key, (cos, sin)
        self._value = (mixed_cos.contiguous(), mixed_sin.contiguous(), signed_sin)
        self.builds += 1
        return self._value

    def clear(self) -> None:
        self._key = self._inputs = self._value = None


MIXED_TABLES = _MixedTableCache()


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    out = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    out.mul_(signed_sin)
    # Two rounded products, then the sum: the eager `q * cos + rotate_half(q) * sin` bit for bit
    # (a fused multiply-add rounds once and drifts from it in bf16).
    return out.add_(x * cos)


def _rotary(q, k, cos, sin, section, unsqueeze_dim):
    mixed_cos, _, signed_sin = MIXED_TABLES.get(cos, sin, section, unsqueeze_dim)
    out_dtype = torch.promote_types(q.dtype, mixed_cos.dtype)
    if out_dtype != q.dtype or out_dtype != k.dtype:
        return reference.apply_rotary(q, k, *reference.mix_sections(cos, sin, section, unsqueeze_dim))
    return _rotate(q, mixed_cos, signed_sin), _rotate(k, mixed_cos, signed_sin)


def mrope(q, k, cos, sin, mrope_section, unsqueeze_dim: int = 1):
    return _rotary(q, k, cos, sin, tuple(int(s) for s in mrope_section), unsqueeze_dim)


def mrope_mixed(q, k, cos, sin, unsqueeze_dim: int = 1):
    if cos.dtype != q.dtype:
        return reference.mrope_mixed(q, k, cos, sin, unsqueeze_dim)
    return _rotary(q, k, cos, sin, None, unsqueeze_dim)


def swiglu_mlp_weights(hidden_states, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias):
    """A SiLU MLP from its weights: the activation and the product in place, the weights as stored."""
    if torch.is_grad_enabled() and hidden_states.requires_grad:  # in-place activation would break backward
        return reference.swiglu_mlp_weights(
            hidden_states, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias
        )
    g = F.silu(F.linear(hidden_states, gate_weight, gate_bias), inplace=True)
    g.mul_(F.linear(hidden_states, up_weight, up_bias))
    return F.linear(g, down_weight, down_bias)


def swiglu_mlp(mlp_module: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    gate, up, down = mlp_module.gate_proj, mlp_module.up_proj, mlp_module.down_proj
    act = mlp_module.act_fn
    if torch.is_grad_enabled() and hidden_states.requires_grad:
        return reference.swiglu_mlp(mlp_module, hidden_states)  # in-place activation would break backward
    if reference.is_silu(act):  # the weights are used as stored (nn.Linear layout): never copied per call
        return swiglu_mlp_weights(
            hidden_states, gate.weight, gate.bias, up.weight, up.bias, down.weight, down.bias
        )
    g = act(F.linear(hidden_states, gate.weight, gate.bias))
    g.mul_(F.linear(hidden_states, up.weight, up.bias))
    return F.linear(g, down.weight, down.bias)


def add_rms_norm(hidden_states, residual, weight, eps: float = 1e-6):
    """The residual sum in fp32 once, then the fused normalisation, in the reference's order (same bits)."""
    if weight.dim() != 1 or hidden_states.numel() > RMS_NORM_FUSED_MAX_ELEMENTS:
        return reference.add_rms_norm(hidden_states, residual, weight, eps)
    summed = hidden_states.to(torch.float32) + residual.to(torch.float32)
    normed = F.rms_norm(summed, (summed.shape[-1],), None, eps)
    return weight * normed.to(hidden_states.dtype), summed.to(hidden_states.dtype)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up with the product written into the activation's output: one temporary fewer."""
    half = gate_up.shape[-1] // 2
    out = F.silu(gate_up[..., :half])
    return out.mul_(gate_up[..., half:])


# Decoder-layer blocks: the fused pieces above composed, with the adds written in place (same bits as the
# reference: each add is one rounding either way).


def residual_rms_norm(hidden_states, residual, weight, eps: float = 1e-6):
    summed = residual + hidden_states
    return rms_norm(summed, weight, eps), summed


def mlp_block(
    residual,
    attn_output,
    o_weight,
    o_bias,
    norm_weight,
    eps,
    gate_weight,
    gate_bias,
    up_weight,
    up_bias,
    down_weight,
    down_bias,
):
    if torch.is_grad_enabled() and (residual.requires_grad or attn_output.requires_grad):
        return reference.mlp_block(
            residual, attn_output, o_weight, o_bias, norm_weight, eps,
            gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias,
        )  # fmt: skip
    summed = F.linear(attn_output, o_weight, o_bias)
    if summed.dtype != torch.promote_types(summed.dtype, residual.dtype):
        summed = residual + summed
    else:
        summed.add_(residual)
    mlp = swiglu_mlp_weights(
        rms_norm(summed, norm_weight, eps), gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias
    )
    if mlp.dtype != torch.promote_types(mlp.dtype, summed.dtype):
        return summed + mlp
    return mlp.add_(summed)


# the four prologue entries: this backend's RMSNorm and MRoPE, then the cache write as transformers makes it
attention_prologue, attention_prologue_mixed, attention_prologue_cached, attention_prologue_mixed_cached = (
    reference.prologue_entries(globals())
)


def attention_core(query, key_cache, value_cache, kv_lens, scale, kv_starts=None):
    """The attention core by torch's scaled_dot_product_attention (grouped heads, no repeat_kv copy) over
    the cache positions some sequence still uses: a static cache's unused tail is never read. A sequence's
    positions before kv_starts[b] (left padding) are masked."""
    reference.check_attention_core(query, key_cache, value_cache, kv_lens, kv_starts)
    batch, q_heads, rows, dim = query.shape
    used = key_cache.shape[2]
    if not (query.is_cuda and torch.cuda.is_current_stream_capturing()):  # a capture cannot read lengths
        ends = kv_lens if kv_starts is None else kv_starts + kv_lens
        used = int(ends.max())
        if not (rows <= int(kv_lens.min()) and used <= key_cache.shape[2]):
            raise ValueError(
                f"attention_core: kv_lens {kv_lens.tolist()} do not hold {rows} new rows in the cache"
            )
        if kv_starts is not None and int(kv_starts.min()) < 0:
            raise ValueError(f"attention_core: kv_starts {kv_starts.tolist()} are before the cache")
    allowed = reference.decode_positions_allowed(kv_lens, rows, used, kv_starts)[:, None]
    out = F.scaled_dot_product_attention(
        query,
        key_cache[:, :, :used],
        value_cache[:, :, :used],
        attn_mask=allowed,
        scale=scale,
        enable_gqa=q_heads != key_cache.shape[1],
    )
    return out.transpose(1, 2).reshape(batch, rows, q_heads * dim)


def attention_core_masked(query, key_cache, value_cache, attention_mask, scale):
    """attention_core with each sequence's range read from the model's attention mask, once per forward."""
    kv_starts, kv_lens = decode_lengths.LENGTHS.get(attention_mask, key_cache)
    return attention_core(query, key_cache, value_cache, kv_lens, scale, kv_starts)
