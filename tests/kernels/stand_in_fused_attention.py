"""The stand-in torch_npu's `npu_fused_infer_attention_score`, refusing what the real one refuses.

Mirrors its schema and API page in Ascend/op-plugin, as on master (commit 517f2e7, 2026-08-21): the page is
`docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md` there (older branches:
`docs/context/torch_npu-npu_fused_infer_attention_score.md`), with
`op_plugin/ops/opapi/FusedInferAttentionScoreKernelNpuOpApi.cpp`, Atlas A2; as on op-plugin master
(the 26.1.0 branch stand_in_torch_npu.py mirrors; its signature carries query_rope / key_rope, which older
branches lack): query, key, value positional, everything else keyword-only; returns (attention_out,
softmax_lse). It refuses on the call, where the real op's aclnn parameter check raises: eagerly, and inside
a capture on the first (recording) call, which is when torchair and npugraph_ex run the op once.
Refused as the real op refuses them: a non-contiguous query, key or value; a query dtype other than
float16 / bfloat16 (key and value: the query's; the int8 / int4 paths are quantised ones, not mirrored); key
and value shapes that differ; under BNSD, num_heads other than the query's N or num_key_value_heads other
than the key's N; num_heads not a multiple of num_key_value_heads or more than 64 times it;
actual_seq_lengths_kv that is not an int list (its type is SymInt[]: a host list, never a tensor), of a
count other than 1 or at least the batch, or with a length past the key's S; an atten_mask not bool /
int8 / uint8, or not of a shape the page's atten_mask entry lists for sparse_mode 0 / 1 without rope:
(1, Q_S, KV_S), (B, 1, Q_S, KV_S), (1, 1, Q_S, KV_S), and under BNSD (B, KV_S) when Q_S is 1, (Q_S, KV_S)
when Q_S is more (so (B, Q_S, KV_S) is refused for B > 1, and (Q_S, KV_S) at one row for B > 1); inner_precise other than 0 / 1
when Q_S is 1. Not mirrored (refused here although the real op may take them): every layout but BNSD,
sparse modes other than 0, and the quantisation, paged-attention, shared-prefix, padding, rope and pse
inputs; pto_kernels uses none of them. The arithmetic: softmax(scale * Q K^T + mask) V in fp32, masked
positions (True / nonzero) and positions past each batch's actual length left out.
"""

from __future__ import annotations

import torch

OP = "npu_fused_infer_attention_score"
HALVES = (torch.float16, torch.bfloat16)
# keyword-only inputs this stand-in does not model: each must stay None
UNMODELLED = (
    "pse_shift", "actual_seq_lengths", "dequant_scale1", "quant_scale1", "dequant_scale2", "quant_scale2",
    "quant_offset2", "antiquant_scale", "antiquant_offset", "block_table", "query_padding_size",
    "kv_padding_size", "key_antiquant_scale", "key_antiquant_offset", "value_antiquant_scale",
    "value_antiquant_offset", "key_shared_prefix", "value_shared_prefix", "actual_shared_prefix_len",
    "query_rope", "key_rope", "key_rope_antiquant_scale",
)  # fmt: skip


def _refuse(why: str):
    raise RuntimeError(f"{OP}: {why} (stand-in for torch_npu.{OP}, op-plugin)")


def _lengths(actual, batch: int, kv_s: int) -> list[int]:
    if actual is None:
        return [kv_s] * batch
    if isinstance(actual, torch.Tensor) or not all(isinstance(n, int) for n in actual):
        raise TypeError(
            f"{OP}(): argument 'actual_seq_lengths_kv' must be a list of ints (SymInt[]), not {type(actual).__name__}"
        )
    if len(actual) != 1 and len(actual) < batch:
        _refuse(f"actual_seq_lengths_kv has {len(actual)} values for batch {batch}: 1, or at least the batch")
    lengths = list(actual) * batch if len(actual) == 1 else list(actual[:batch])
    if any(n < 0 or n > kv_s for n in lengths):
        _refuse(f"actual_seq_lengths_kv {lengths}: each at most the key's S ({kv_s}) and not negative")
    return lengths


def _mask(atten_mask, batch: int, q_s: int, kv_s: int):
    if atten_mask is None:
        return None
    if atten_mask.dtype not in (torch.bool, torch.int8, torch.uint8):
        _refuse(f"atten_mask dtype {atten_mask.dtype}: bool, int8 or uint8")
    if not atten_mask.is_contiguous():
        _refuse("atten_mask must be contiguous")
    shape = tuple(atten_mask.shape)
    shapes = {
        (1, q_s, kv_s),
        (batch, 1, q_s, kv_s),
        (1, 1, q_s, kv_s),
        (batch, kv_s) if q_s == 1 else (q_s, kv_s),
    }
    if shape not in shapes:
        _refuse(f"atten_mask {shape} does not fit Q_S {q_s} x KV_S {kv_s} (batch {batch})")
    if q_s == 1 and shape == (batch, kv_s):
        return atten_mask.bool().reshape(batch, 1, 1, kv_s)  # one row: each sequence's own mask row
    return atten_mask.bool().reshape(-1, 1, q_s, kv_s)  # a leading 1 broadcasts over the batch


def make_op():
    def npu_fused_infer_attention_score(
        query, key, value, *, atten_mask=None, actual_seq_lengths_kv=None, num_heads=1, scale=1.0,
        pre_tokens=2147483647, next_tokens=2147483647, input_layout="BSH", num_key_value_heads=0,
        sparse_mode=0, inner_precise=0, block_size=0, antiquant_mode=0, softmax_lse_flag=False,
        key_antiquant_mode=0, value_antiquant_mode=0, **unmodelled,
    ):  # fmt: skip
        unknown = set(unmodelled) - set(UNMODELLED)
        if unknown:
            raise TypeError(f"{OP}() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        given = sorted(name for name, value in unmodelled.items() if value is not None)
        if given:
            _refuse(f"{', '.join(given)}: not modelled by the stand-in")
        if input_layout != "BNSD":
            _refuse(f"input_layout {input_layout!r}: the stand-in models BNSD only")
        if sparse_mode != 0:
            _refuse(f"sparse_mode {sparse_mode}: the stand-in models 0 only")
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not t.is_contiguous():
                _refuse(f"{name} must be contiguous (the op takes no strided tensor)")
        if query.dtype not in HALVES or key.dtype != query.dtype or value.dtype != query.dtype:
            _refuse(
                f"query {query.dtype}, key {key.dtype}, value {value.dtype}: float16 or bfloat16, one dtype"
            )
        if query.dim() != 4 or key.dim() != 4 or key.shape != value.shape:
            _refuse(
                f"BNSD takes 4-D query and equal key/value, not {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
            )
        batch, heads, q_s, dim = query.shape
        kv_heads = num_key_value_heads or num_heads
        if num_heads != heads or kv_heads != key.shape[1]:
            _refuse(
                f"num_heads {num_heads} / num_key_value_heads {num_key_value_heads} do not match query N {heads} / key N {key.shape[1]}"
            )
        if num_heads % kv_heads or num_heads // kv_heads > 64:
            _refuse(
                f"num_heads {num_heads} must be a multiple of num_key_value_heads {kv_heads}, at most 64 times it"
            )
        if key.shape[0] != batch or key.shape[3] != dim:
            _refuse(f"key {tuple(key.shape)} does not fit query {tuple(query.shape)}")
        if q_s == 1 and inner_precise not in (0, 1):
            _refuse(f"inner_precise {inner_precise}: 0 or 1 when Q_S is 1")
        kv_s = key.shape[2]
        lengths = _lengths(actual_seq_lengths_kv, batch, kv_s)
        masked = _mask(atten_mask, batch, q_s, kv_s)
        group = heads // kv_heads
        k = key.float().repeat_interleave(group, dim=1)
        v = value.float().repeat_interleave(group, dim=1)
        scores = torch.matmul(query.float(), k.transpose(2, 3)) * scale
        beyond = torch.arange(kv_s).reshape(1, 1, 1, -1) >= torch.tensor(lengths).reshape(-1, 1, 1, 1)
        hidden = beyond if masked is None else beyond | masked
        scores = scores.masked_fill(hidden, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v).to(query.dtype)
        lse = torch.logsumexp(scores, dim=-1, keepdim=True) if softmax_lse_flag else torch.zeros(1)
        return out, lse

    return npu_fused_infer_attention_score
