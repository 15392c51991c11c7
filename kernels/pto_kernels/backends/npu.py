"""torch_npu fused ops, for Ascend hosts without PyPTO: the cheapest real op for each job.

- RMSNorm: `npu_rms_norm`; with the residual add, `npu_add_rms_norm` (the add and the norm in one kernel).
- MRoPE: `npu_mrope`, one kernel for q and k, fed a position table built once per forward (the
  section-mixed cos/sin of every token, in its half-width `cos | sin` cache form, and positions
  0..tokens-1). Where npu_mrope's rules do not hold (head size not a multiple of 32 in fp16/bf16, 16 in
  fp32; dtypes that differ), `npu_rotary_mul` on the BSND layout q and k already have in memory, with
  `[B, S, 1, D]` tables: no transposed view for aclnn to copy first. (`npu_apply_rotary_pos_emb` would also
  be one launch, but it rotates in place, and these entries promise not to change their inputs.)
- SwiGLU MLP: one GEMM over gate and up merged (built once per weight pair and kept beside it), then
  `npu_swiglu`, then the down GEMM: what vLLM and vllm-ascend run. The merged copy costs the gate and up
  weights' memory once more.

The tables are the rotary embedding's: both halves of each cos/sin row equal (`cat((freqs, freqs))`), which
is what npu_mrope's half-width cache holds. torch_npu is looked up on each call, never at import: on a host
that has it, `import torch` has already loaded it (torch's backend autoload); elsewhere importing this
module does not need it. Unverified on hardware here; the tests drive it through a stand-in torch_npu
(tests/kernels/stand_in_torch_npu.py) that refuses what the real ops refuse.
"""

from __future__ import annotations

import importlib
import weakref

import torch
import torch.nn.functional as F

from . import decode_lengths, fused, pypto_device, reference


def _torch_npu():
    return importlib.import_module("torch_npu")


def _out_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    # torch.promote_types goes through the dispatcher; most calls have one dtype
    return x.dtype if weight.dtype == x.dtype else torch.promote_types(x.dtype, weight.dtype)


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    out_dtype = _out_dtype(hidden_states, weight)
    y, _rstd = _torch_npu().npu_rms_norm(hidden_states, weight.to(hidden_states.dtype), epsilon=eps)
    return y.to(out_dtype)


class _RopeTableCache:
    """npu_mrope's inputs for one forward's mixed tables: positions [B*S] and cos_sin_cache [B*S, D] (each
    token's cos half, then its sin half).

    Keyed on the identity and version of the mixed tables (new ones each forward, the same ones for every
    layer), as fused.MIXED_TABLES is; the last inputs are held so an id is never recycled while live.
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._inputs: tuple[torch.Tensor, torch.Tensor] | None = None
        self._value: tuple[torch.Tensor, torch.Tensor] | None = None
        self.builds = 0

    def get(self, cos, sin, unsqueeze_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: fused.MIXED_TABLES' mixed tables (the same tensors for every layer of a forward)."""
        key = (
            decode_lengths.version_of(cos),
            decode_lengths.version_of(sin),
            tuple(cos.shape),
            cos.dtype,
            cos.device,
            unsqueeze_dim,
            dtype,
        )
        inputs = self._inputs
        if key == self._key and inputs is not None and inputs[0] is cos and inputs[1] is sin:
            return self._value
        cos_t, sin_t = (cos.transpose(1, 2), sin.transpose(1, 2)) if unsqueeze_dim == 1 else (cos, sin)
        half = cos.shape[-1] // 2
        tokens = cos_t.shape[0] * cos_t.shape[1]
        cache = torch.cat((cos_t[..., :half], sin_t[..., :half]), dim=-1).reshape(tokens, 2 * half).to(dtype)
        positions = torch.arange(tokens, device=cos.device)
        self._key, self._inputs, self._value = key, (cos, sin), (positions, cache)
        self.builds += 1
        return self._value


ROPE_TABLES = _RopeTableCache()


def _npu_mrope_takes(q: torch.Tensor, k: torch.Tensor) -> bool:
    multiple = 16 if q.dtype == torch.float32 else 32
    return q.dim() == 4 and q.dtype == k.dtype and q.shape[-1] % multiple == 0


def _rotary(q, k, cos, sin, unsqueeze_dim: int):
    """q, k [B, N, S, D] (unsqueeze_dim 1) or [B, S, N, D] (2); cos, sin mixed, unsqueezed at that dim."""
    if unsqueeze_dim not in (1, 2):  # no layout these ops know: the reference's math
        return reference.apply_rotary(q, k, cos, sin)
    npu = _torch_npu()
    to_bsnd = (lambda t: t.transpose(1, 2)) if unsqueeze_dim == 1 else (lambda t: t)
    q_bsnd, k_bsnd = to_bsnd(q), to_bsnd(k)  # as the projections wrote them: contiguous
    if _npu_mrope_takes(q, k):
        b, s, _heads, d = q_bsnd.shape
        positions, cache = ROPE_TABLES.get(cos, sin, unsqueeze_dim, q.dtype)
        q_out, k_out = npu.npu_mrope(
            positions, q_bsnd.reshape(b * s, -1), k_bsnd.reshape(b * s, -1), cache, d, rotary_mode="half"
        )
        return to_bsnd(q_out.view(q_bsnd.shape)), to_bsnd(k_out.view(k_bsnd.shape))
    cos_t, sin_t = to_bsnd(cos).to(q.dtype), to_bsnd(sin).to(q.dtype)  # [B, S, 1, D]
    q_embed = npu.npu_rotary_mul(q_bsnd, cos_t, sin_t, rotary_mode="half")
    k_embed = npu.npu_rotary_mul(k_bsnd, cos_t.to(k.dtype), sin_t.to(k.dtype), rotary_mode="half")
    return to_bsnd(q_embed), to_bsnd(k_embed)


def mrope(q, k, cos, sin, mrope_section, unsqueeze_dim: int = 1):
    # Section mixing is shared with the fused path: built once per forward, reused by every layer.
    cos_m, sin_m, _ = fused.MIXED_TABLES.get(cos, sin, tuple(int(s) for s in mrope_section), unsqueeze_dim)
    return _rotary(q, k, cos_m, sin_m, unsqueeze_dim)


def mrope_mixed(q, k, cos, sin, unsqueeze_dim: int = 1):
    cos_m, sin_m, _ = fused.MIXED_TABLES.get(cos, sin, None, unsqueeze_dim)
    return _rotary(q, k, cos_m, sin_m, unsqueeze_dim)


class _MergedGateUp:
    """[gate; up] weights (and biases) as one matrix per MLP, built on first use and kept while the gate
    weight lives; rebuilt when either weight is replaced or changed in place (its version counter)."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple] = {}
        self.builds = 0

    def get(self, gate_weight, gate_bias, up_weight, up_bias):
        key = (
            decode_lengths.version_of(gate_weight), decode_lengths.version_of(up_weight), gate_weight.data_ptr(), up_weight.data_ptr(),
            gate_weight.dtype, gate_weight.device,
        )  # fmt: skip
        entry = self._entries.get(id(gate_weight))
        if entry is not None and entry[0]() is gate_weight and entry[1]() is up_weight and entry[2] == key:
            return entry[3], entry[4]
        with torch.no_grad():
            merged = torch.cat((gate_weight, up_weight), dim=0)
            bias = None
            if gate_bias is not None or up_bias is not None:
                zeros = gate_weight.new_zeros
                bias = torch.cat((
                    gate_bias if gate_bias is not None else zeros(gate_weight.shape[0]),
                    up_bias if up_bias is not None else zeros(up_weight.shape[0]),
                ))  # fmt: skip
        if entry is None:
            weakref.finalize(gate_weight, self._entries.pop, id(gate_weight), None)
        self._entries[id(gate_weight)] = (weakref.ref(gate_weight), weakref.ref(up_weight), key, merged, bias)
        self.builds += 1
        return merged, bias


MERGED_GATE_UP = _MergedGateUp()


def swiglu_mlp_weights(hidden_states, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias):
    # one GEMM over [gate; up], then npu_swiglu: silu(first half) * second half of the last dim
    merged, merged_bias = MERGED_GATE_UP.get(gate_weight, gate_bias, up_weight, up_bias)
    gate_up = F.linear(hidden_states, merged, merged_bias)
    return F.linear(_torch_npu().npu_swiglu(gate_up, dim=-1), down_weight, down_bias)


def swiglu_mlp(mlp_module: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    gate, up, down = mlp_module.gate_proj, mlp_module.up_proj, mlp_module.down_proj
    if not fused.reference.is_silu(mlp_module.act_fn):
        return fused.swiglu_mlp(mlp_module, hidden_states)
    return swiglu_mlp_weights(
        hidden_states, gate.weight, gate.bias, up.weight, up.bias, down.weight, down.bias
    )


def add_rms_norm(hidden_states, residual, weight, eps: float = 1e-6):
    # npu_add_rms_norm returns (normed, rstd, x + residual): the add and the norm in one kernel.
    out_dtype = _out_dtype(hidden_states, weight)
    y, _rstd, summed = _torch_npu().npu_add_rms_norm(
        hidden_states, residual.to(hidden_states.dtype), weight.to(hidden_states.dtype), epsilon=eps
    )
    return y.to(out_dtype), summed


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    return _torch_npu().npu_swiglu(gate_up, dim=-1)


# Decoder-layer blocks from torch_npu's fused ops: npu_add_rms_norm carries the residual add, npu_rms_norm
# the input norm, npu_mrope (or npu_rotary_mul) the rotation, npu_swiglu after one merged gate/up GEMM.


def residual_rms_norm(hidden_states, residual, weight, eps: float = 1e-6):
    return add_rms_norm(hidden_states, residual, weight, eps)


def mlp_block(
    residual, attn_output, o_weight, o_bias, norm_weight, eps,
    gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias,
):  # fmt: skip
    normed, summed = add_rms_norm(F.linear(attn_output, o_weight, o_bias), residual, norm_weight, eps)
    return summed + swiglu_mlp_weights(
        normed, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias
    )


# the four prologue entries: this backend's RMSNorm and MRoPE, then the cache write as transformers makes it
attention_prologue, attention_prologue_mixed, attention_prologue_cached, attention_prologue_mixed_cached = (
    reference.prologue_entries(globals())
)


def attention_core(query, key_cache, value_cache, kv_lens, scale, kv_starts=None):
    """The attention core by `npu_fused_infer_attention_score`, the fused attention op vllm-ascend calls,
    in its BNSD layout: query [b, q_heads, s, d] and the caches [b, kv_heads, cache_len, d] as they are
    (contiguous: the op takes no strided input), GQA by num_key_value_heads, each sequence's valid end as
    actual_seq_lengths_kv (kv_starts[b] + kv_lens[b]). Its schema takes those as a host int list
    (SymInt[]), so they are read back to the host here: one device-to-host copy a call. With more than one
    new row, or a left-padded sequence (kv_starts[b] > 0: positions before its start are hidden), a bool
    mask [b, 1, s, cache_len] (True: masked, sparse_mode 0) keeps them out; one row of an unpadded batch
    needs none. The op's own kv_padding_size is not used: its documented meaning (data aligned to the
    right of the key's S) is not this cache's layout, whose unused positions follow each sequence. Inside a
    device-graph capture no host copy can run: the lengths then go into the mask too, made on the device,
    and the op gets no length list. fp16 / bf16 only, as the op."""
    reference.check_attention_core(query, key_cache, value_cache, kv_lens, kv_starts)
    batch, q_heads, rows, dim = query.shape
    capturing = pypto_device.capturing(query.device.type)
    starts = torch.zeros_like(kv_lens) if kv_starts is None else kv_starts.to(kv_lens.dtype)
    lengths, padded = None, kv_starts is not None
    if not capturing:  # one copy to the host: the ends, then the starts
        ends, firsts = torch.stack((starts + kv_lens, starts)).tolist()
        lengths, padded = [int(n) for n in ends], any(firsts)
    mask = None
    if rows > 1 or capturing or padded:
        mask = ~reference.decode_positions_allowed(kv_lens, rows, key_cache.shape[2], kv_starts)[:, None]
    out, _ = _torch_npu().npu_fused_infer_attention_score(
        query.contiguous(),
        key_cache.contiguous(),
        value_cache.contiguous(),
        atten_mask=mask,
        actual_seq_lengths_kv=lengths,
        num_heads=q_heads,
        scale=float(scale),
        input_layout="BNSD",
        num_key_value_heads=key_cache.shape[1],
        sparse_mode=0,
    )
    return out.transpose(1, 2).reshape(batch, rows, q_heads * dim)


def attention_core_masked(query, key_cache, value_cache, attention_mask, scale):
    """attention_core with each sequence's range read from the model's attention mask, once per forward."""
    kv_starts, kv_lens = decode_lengths.LENGTHS.get(attention_mask, key_cache)
    return attention_core(query, key_cache, value_cache, kv_lens, scale, kv_starts)
