"""pto_kernels: fused RMSNorm, MRoPE and SwiGLU MLP for Qwen2.5-VL (GutenOCR-3B) with per-call dispatch.

Beside the reference system's three ops, three decoder-layer blocks cut a layer's launches: the residual
add with the RMSNorm after it (`residual_rms_norm`), everything after the attention core (`mlp_block`: o_proj,
add, norm, MLP, add) and everything before it (`attention_prologue`: norm, q/k/v projections, MRoPE).
`enable()` with no ops switches on the reference's three (REFERENCE_OPS); name the blocks to add them.

The patched modeling code reads the switches below at every call and, when one is on, calls the matching
wrapper. Each wrapper runs the backend bound at `enable` time (under "auto", per device type), records what ran in
`stats()`, and falls back to the eager torch path if a kernel fails (PTO_KERNELS_STRICT=1 raises instead).

Under torch.compile (and torch.export) the wrappers call the same routes through PyTorch custom ops,
`torch.ops.pto_kernels.*` (ops.py): one opaque node per call, so PTO mode compiles without graph breaks.
In eager mode they call the route directly: the dispatcher would add ~17 us a call on a CPU.

A tuning written by `pto-patch tune` (`.pto_patch/tuning.json`) switches on what measured faster for a
batch size: `apply_tuning(path, batch_size, device, dtype)`; one made on another device, dtype or release is refused.

Importing this package needs torch only; pypto and torch_npu are imported on first use.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator, Mapping

import torch

from . import _dispatch, entries, ops, static_cache, tuning
from ._dispatch import BACKENDS, OPS, KernelFailedError, count_replays, reset_stats, stats
from .backends import decode_lengths, reference
from .ops import refuse_graph_mode as _refuse_graph_mode
from .tuning import TuningError, TuningMismatchError

__all__ = [
    "BACKENDS",
    "BLOCK_OPS",
    "OPS",
    "REFERENCE_OPS",
    "USE_PTO_ATTENTION_CORE",
    "USE_PTO_ATTENTION_PROLOGUE",
    "USE_PTO_MLP_BLOCK",
    "USE_PTO_MROPE",
    "USE_PTO_RESIDUAL_RMS_NORM",
    "USE_PTO_RMS_NORM",
    "USE_PTO_SWIGLU_MLP",
    "KernelFailedError",
    "TuningError",
    "TuningMismatchError",
    "apply_tuning",
    "attention_core_model_wrapper",
    "attention_core_wrapper",
    "attention_prologue_cache_wrapper",
    "attention_prologue_mixed_cache_wrapper",
    "attention_prologue_mixed_wrapper",
    "attention_prologue_wrapper",
    "backend",
    "backends",
    "count_replays",
    "disable",
    "enable",
    "enabled",
    "mlp_block_wrapper",
    "mrope_mixed_wrapper",
    "mrope_pto_correct",
    "op_of",
    "reset_stats",
    "residual_rms_norm_wrapper",
    "rms_norm_wrapper",
    "stats",
    "swiglu_mlp_wrapper",
    "switched_on",
]

USE_PTO_RMS_NORM = False
USE_PTO_MROPE = False
USE_PTO_SWIGLU_MLP = False
USE_PTO_RESIDUAL_RMS_NORM = False
USE_PTO_MLP_BLOCK = False
USE_PTO_ATTENTION_PROLOGUE = False
USE_PTO_ATTENTION_CORE = False

SWITCHES = {op: f"USE_PTO_{op.upper()}" for op in OPS}
REFERENCE_OPS = ("rms_norm", "mrope", "swiglu_mlp")  # the reference system's flags: enable()'s default
BLOCK_OPS = ("residual_rms_norm", "mlp_block", "attention_prologue", "attention_core")

# Per op: "auto" unless PTO_KERNELS_BACKEND says otherwise; enable(backend=...) overrides both.
_backends: dict[str, str] = dict.fromkeys(OPS, _dispatch.backend_from_env())


# True while torch.compile or torch.export traces: the tracer reads it as a constant
_tracing = torch.compiler.is_compiling


# kernel entry -> its bound route: the wrappers call `_routes[entry]` (one dict lookup, measured with
# benchmarks/bench_dispatch.py), the custom ops' bodies the same dict (ops._run)
_routes = _dispatch.ROUTES


def _bind() -> None:
    """Route each entry for its op's backend now (every time a backend changes), never per call."""
    _routes.update({entry.name: _dispatch.bind(entry.name, _backends[entry.op]) for entry in entries.ENTRIES})


_bind()


def backend() -> str:
    """The backend requested for every op ("auto" resolves by the tensor's device), or "per-op" when
    enable() was given one backend per op (see `backends()`)."""
    chosen = set(_backends.values())
    return chosen.pop() if len(chosen) == 1 else "per-op"


def backends() -> dict[str, str]:
    """The backend requested for each op."""
    return dict(_backends)


def _check_ops(ops: Iterable[str] | str) -> tuple[str, ...]:
    if ops == "all":
        return OPS
    ops = (ops,) if isinstance(ops, str) else tuple(ops)
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise ValueError(
            f"unknown pto_kernels op(s) {', '.join(map(repr, unknown))}; choose from {', '.join(OPS)}"
        )
    return ops


def _requested_backends(backend: str | Mapping[str, str] | None) -> dict[str, str]:
    default = _dispatch.backend_from_env()
    if backend is None:
        return dict.fromkeys(OPS, default)
    if isinstance(backend, str):
        return dict.fromkeys(OPS, _dispatch.check_backend(backend))
    _check_ops(tuple(backend))
    return {op: _dispatch.check_backend(backend[op]) if op in backend else default for op in OPS}


def enable(ops: Iterable[str] | str = REFERENCE_OPS, backend: str | Mapping[str, str] | None = None) -> None:
    """Switch exactly `ops` on (the others off) and choose the backend. Without ops: REFERENCE_OPS;
    "all" or OPS: every op, blocks included.

    backend: "auto" (npu tensors -> pypto if it imports, else npu; every other device -> fused),
    "pypto", "npu", "fused" or "torch"; or a mapping op -> backend (ops it leaves out get the default).
    None means $PTO_KERNELS_BACKEND, else "auto".
    """
    global _backends
    chosen = _check_ops(ops)
    _backends = _requested_backends(backend)
    _bind()
    if "torchair" in sys.modules:  # a torchair compile may follow: GE mode must name the op it cannot lower
        _refuse_graph_mode()
    for op, switch in SWITCHES.items():
        globals()[switch] = op in chosen


def disable() -> None:
    """Switch every op off: the patched model runs its original code."""
    for switch in SWITCHES.values():
        globals()[switch] = False


def apply_tuning(source, batch_size: int, device=None, dtype=None) -> tuning.BatchChoice:
    """Switch on what the tuning `source` (a path, or its parsed JSON) chose for `batch_size` on `device`
    (default: NPU, else CUDA, else CPU) for a model in `dtype` (a torch.dtype such as model.dtype, or a
    name such as "bf16"); nothing on where it chose nothing.

    Raises TuningMismatchError (one line: what differs) if the tuning was made on another device, in
    another dtype (or `dtype` is not given while the tuning records one), or with other torch /
    transformers / pypto / torch_npu releases; the switches are then left as they were.
    """
    choice = tuning.choose(source, batch_size, device, dtype)
    if choice.ops:
        enable(ops=tuple(choice.ops), backend=dict(choice.ops))
    else:
        disable()
    return choice


def op_of(name: str) -> str:
    """The op (as `stats()` and the switches name it) a dispatch entry or registered custom op runs:
    mrope_mixed -> mrope, attention_prologue_cached_at -> attention_prologue."""
    return entries.op_of(name)


def switched_on() -> tuple[str, ...]:
    """The ops whose switch is on, in OPS order."""
    return tuple(op for op in OPS if globals()[SWITCHES[op]])


@contextlib.contextmanager
def enabled(
    ops: Iterable[str] | str = REFERENCE_OPS, backend: str | Mapping[str, str] | None = None
) -> Iterator[None]:
    """enable(ops, backend) for the duration of a with-block, then restore the previous state."""
    global _backends
    saved = ({switch: globals()[switch] for switch in SWITCHES.values()}, _backends)
    enable(ops, backend)
    try:
        yield
    finally:
        globals().update(saved[0])
        _backends = saved[1]
        _bind()


# Each wrapper: under a tracer, the custom op (one opaque node); in eager mode, the bound route itself.


def rms_norm_wrapper(hidden_states, weight, eps: float = 1e-6):
    """RMSNorm over the last dim: weight * (x / sqrt(mean(x^2) + eps)), computed as transformers does."""
    if _tracing():
        return ops.rms_norm(hidden_states, weight, float(eps))
    return _routes["rms_norm"](hidden_states, weight, eps)


def mrope_pto_correct(q, k, cos, sin, mrope_section, unsqueeze_dim: int = 1):
    """apply_multimodal_rotary_pos_emb (transformers <= 5.16): cos/sin are [3, b, s, d], unmixed."""
    if _tracing():
        return ops.mrope(q, k, cos, sin, [int(s) for s in mrope_section], int(unsqueeze_dim))
    return _routes["mrope"](q, k, cos, sin, mrope_section, unsqueeze_dim)


def mrope_mixed_wrapper(q, k, cos, sin, unsqueeze_dim: int = 1):
    """apply_rotary_pos_emb (transformers 5.20+): cos/sin arrive section-mixed as [b, s, d]."""
    if _tracing():
        return ops.mrope_mixed(q, k, cos, sin, int(unsqueeze_dim))
    return _routes["mrope_mixed"](q, k, cos, sin, unsqueeze_dim)


def swiglu_mlp_wrapper(mlp_module, hidden_states):
    """down_proj(act_fn(gate_proj(x)) * up_proj(x)) for a module with gate/up/down nn.Linear."""
    if _tracing():
        if not reference.is_silu(mlp_module.act_fn):  # the op computes SiLU: trace the module's own math
            return reference.swiglu_mlp(mlp_module, hidden_states)
        gate, up, down = mlp_module.gate_proj, mlp_module.up_proj, mlp_module.down_proj
        return ops.swiglu_mlp(
            hidden_states, gate.weight, gate.bias, up.weight, up.bias, down.weight, down.bias
        )
    return _routes["swiglu_mlp"](mlp_module, hidden_states)


# Decoder-layer blocks. Each takes the modules the patched layer hands it and reads their weights per call.


def _eps(norm) -> float:
    """An RMSNorm module's epsilon (transformers' `variance_epsilon`; `eps` elsewhere)."""
    eps = getattr(norm, "variance_epsilon", None)
    return float(norm.eps if eps is None else eps)


def residual_rms_norm_wrapper(hidden_states, residual, norm):
    """(norm(residual + hidden_states), residual + hidden_states) for an RMSNorm module `norm`: the add
    rounded as transformers rounds it. The sum is the next residual."""
    weight, eps = norm.weight, _eps(norm)
    if _tracing():
        return ops.residual_rms_norm(hidden_states, residual, weight, eps)
    return _routes["residual_rms_norm"](hidden_states, residual, weight, eps)


def mlp_block_wrapper(residual, attn_output, o_proj, norm, mlp):
    """A decoder layer after its attention core: h = residual + o_proj(attn_output); h + mlp(norm(h)).

    attn_output is the core's output before o_proj. An MLP whose activation is not SiLU runs the modules'
    own math (uncounted): the block computes SiLU."""
    if not reference.is_silu(mlp.act_fn):
        summed = residual + o_proj(attn_output)
        return summed + mlp(norm(summed))
    gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    args = (residual, attn_output, o_proj.weight, o_proj.bias, norm.weight, _eps(norm))
    args += (gate.weight, gate.bias, up.weight, up.bias, down.weight, down.bias)
    if _tracing():
        return ops.mlp_block(*args)
    return _routes["mlp_block"](*args)


def _prologue_args(attention, norm, hidden_states):
    q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
    return (hidden_states, norm.weight, _eps(norm), q.weight, q.bias, k.weight, k.bias, v.weight, v.bias)


def attention_prologue_wrapper(attention, norm, hidden_states, cos, sin, mrope_section):
    """A decoder layer before its attention core (transformers <= 5.16): (q, k, v) as [b, heads, s, d] from
    the un-normed hidden_states, the layer's input norm, the attention's projections and MRoPE."""
    args = _prologue_args(attention, norm, hidden_states)
    if _tracing():
        return ops.attention_prologue(
            *args, cos, sin, [int(s) for s in mrope_section], int(attention.head_dim)
        )
    return _routes["attention_prologue"](*args, cos, sin, mrope_section, attention.head_dim)


def attention_prologue_mixed_wrapper(attention, norm, hidden_states, cos, sin):
    """attention_prologue_wrapper for transformers 5.20+ (cos/sin section-mixed, [b, s, d])."""
    args = _prologue_args(attention, norm, hidden_states)
    if _tracing():
        return ops.attention_prologue_mixed(*args, cos, sin, int(attention.head_dim))
    return _routes["attention_prologue_mixed"](*args, cos, sin, attention.head_dim)


def attention_prologue_cache_wrapper(
    attention, norm, hidden_states, cos, sin, mrope_section, cache, position
):
    """attention_prologue_wrapper where the attention's cache update follows: (q, k, v, written). When the
    cache is transformers' static cache and the call a decode step, one row a sequence (static_cache.write_target), the
    op also writes k and v into the layer's caches at the update's position and advances the layer's
    length where the release keeps one (one kernel on the pypto backend), and hands back the caches as k
    and v with written True: the attention then skips its update. Otherwise (q, k, v, False), as
    attention_prologue_wrapper. `position`: the attention's `cache_position` argument (4.57 - 5.0) or None."""
    target = static_cache.write_target(cache, attention.layer_idx, hidden_states, position)
    if target is None:
        return (*attention_prologue_wrapper(attention, norm, hidden_states, cos, sin, mrope_section), False)
    args = _prologue_args(attention, norm, hidden_states)
    args += (cos, sin, [int(s) for s in mrope_section], int(attention.head_dim))
    args += (target.keys, target.values, target.position, target.advance)
    if _tracing():  # the position marked written only where the op advances it (5.8+: the layer's own)
        op = ops.attention_prologue_cached if target.advance else ops.attention_prologue_cached_at
        return op(*args), target.keys, target.values, True
    return _routes["attention_prologue_cached"](*args), target.keys, target.values, True


def attention_prologue_mixed_cache_wrapper(attention, norm, hidden_states, cos, sin, cache, position):
    """attention_prologue_cache_wrapper for transformers 5.20+ (cos/sin section-mixed, [b, s, d])."""
    target = static_cache.write_target(cache, attention.layer_idx, hidden_states, position)
    if target is None:
        return (*attention_prologue_mixed_wrapper(attention, norm, hidden_states, cos, sin), False)
    args = _prologue_args(attention, norm, hidden_states) + (cos, sin, int(attention.head_dim))
    args += (target.keys, target.values, target.position, target.advance)
    if _tracing():
        op = ops.attention_prologue_mixed_cached if target.advance else ops.attention_prologue_mixed_cached_at
        return op(*args), target.keys, target.values, True
    return _routes["attention_prologue_mixed_cached"](*args), target.keys, target.values, True


def attention_core_wrapper(query, key_cache, value_cache, kv_lens, scale, kv_starts=None):
    """A decode step's attention core over a static KV cache: query [b, q_heads, s, d] (s <= 16 new rows,
    the last s of each sequence's kv_lens[b] valid positions, causal among themselves), key_cache /
    value_cache [b, kv_heads, cache_len, d] already holding the new rows, kv_lens [b] integers, kv_starts
    [b] integers (each sequence's first valid position: left padding before it; None: 0); softmax in
    fp32. Returns [b, s, q_heads * d], the input of o_proj (and of mlp_block)."""
    if _tracing():
        return ops.attention_core(query, key_cache, value_cache, kv_lens, float(scale), kv_starts)
    return _routes["attention_core"](query, key_cache, value_cache, kv_lens, scale, kv_starts)


def _implementation(attention) -> str | None:
    """The attention function a model runs (transformers' `config._attn_implementation`)."""
    return getattr(getattr(attention, "config", None), "_attn_implementation", None)


def attention_core_model_wrapper(attention, query, key_cache, value_cache, attention_mask):
    """attention_core_wrapper as a patched attention calls it, in place of its attention function: each
    sequence's range (its first valid position and its length: a left-padded batch) read from the mask the
    attention received (backends/decode_lengths.py: once per forward, not per layer), the scale the
    attention's own (`attention.scaling`). Returns [b, s, q_heads * d], or None when the mask is not one
    range a sequence (a hole inside one: checked eagerly, once per forward, with one value read back), and
    the attention then runs its own function.

    Without a mask, sdpa runs several new rows as `is_causal`, which aligns them to the keys' start (row i
    sees keys 0 .. i): a static cache's short prefill, whose positions after the rows were never written;
    the op gets the first `rows` positions then. Flash attention aligns them to the keys' end, as the op
    does, and one row sees every key under both: the op gets them all."""
    scale = float(attention.scaling)
    rows = query.shape[2]
    if not _tracing() and not _dispatch.capturing(query.device.type):
        if not decode_lengths.LENGTHS.one_range_each(attention_mask, key_cache):
            return None
    if attention_mask is None and rows > 1 and _implementation(attention) == "sdpa":
        key_cache, value_cache = key_cache[:, :, :rows], value_cache[:, :, :rows]
    if _tracing():
        return ops.attention_core_masked(query, key_cache, value_cache, attention_mask, scale)
    return _routes["attention_core_masked"](query, key_cache, value_cache, attention_mask, scale)
