"""pto_kernels: fused RMSNorm, MRoPE and SwiGLU MLP for Qwen2.5-VL (GutenOCR-3B) with per-call dispatch.

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

from . import _dispatch, ops, reference
from ._dispatch import BACKENDS, OPS, KernelFailedError, count_replays, reset_stats, stats
from .ops import refuse_graph_mode as _refuse_graph_mode
from .tuning import TuningError, TuningMismatchError, apply_tuning

__all__ = [
    "BACKENDS",
    "OPS",
    "USE_PTO_MROPE",
    "USE_PTO_RMS_NORM",
    "USE_PTO_SWIGLU_MLP",
    "KernelFailedError",
    "TuningError",
    "TuningMismatchError",
    "apply_tuning",
    "backend",
    "backends",
    "count_replays",
    "disable",
    "enable",
    "enabled",
    "mrope_mixed_wrapper",
    "mrope_pto_correct",
    "reset_stats",
    "rms_norm_wrapper",
    "stats",
    "swiglu_mlp_wrapper",
    "switched_on",
]

USE_PTO_RMS_NORM = False
USE_PTO_MROPE = False
USE_PTO_SWIGLU_MLP = False

SWITCHES = {"rms_norm": "USE_PTO_RMS_NORM", "mrope": "USE_PTO_MROPE", "swiglu_mlp": "USE_PTO_SWIGLU_MLP"}

# Per op: "auto" unless PTO_KERNELS_BACKEND says otherwise; enable(backend=...) overrides both.
_backends: dict[str, str] = dict.fromkeys(OPS, _dispatch.backend_from_env())


# True while torch.compile or torch.export traces: the tracer reads it as a constant
_tracing = torch.compiler.is_compiling


def _bind() -> None:
    """Route each entry for its op's backend now (every time a backend changes), never per call."""
    global _rms_norm, _mrope, _mrope_mixed, _swiglu_mlp
    routes = {entry: _dispatch.bind(entry, _backends[op]) for entry, op in _dispatch._ENTRY_OP.items()}
    _dispatch.ROUTES.update(routes)
    _rms_norm, _mrope, _mrope_mixed = routes["rms_norm"], routes["mrope"], routes["mrope_mixed"]
    _swiglu_mlp = routes["swiglu_mlp"]


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


def enable(ops: Iterable[str] | str = OPS, backend: str | Mapping[str, str] | None = None) -> None:
    """Switch exactly `ops` on (the others off) and choose the backend.

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


def switched_on() -> tuple[str, ...]:
    """The ops whose switch is on, in OPS order."""
    return tuple(op for op in OPS if globals()[SWITCHES[op]])


@contextlib.contextmanager
def enabled(ops: Iterable[str] | str = OPS, backend: str | Mapping[str, str] | None = None) -> Iterator[None]:
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
    return _rms_norm(hidden_states, weight, eps)


def mrope_pto_correct(q, k, cos, sin, mrope_section, unsqueeze_dim: int = 1):
    """apply_multimodal_rotary_pos_emb (transformers <= 5.16): cos/sin are [3, b, s, d], unmixed."""
    if _tracing():
        return ops.mrope(q, k, cos, sin, [int(s) for s in mrope_section], int(unsqueeze_dim))
    return _mrope(q, k, cos, sin, mrope_section, unsqueeze_dim)


def mrope_mixed_wrapper(q, k, cos, sin, unsqueeze_dim: int = 1):
    """apply_rotary_pos_emb (transformers 5.20+): cos/sin arrive section-mixed as [b, s, d]."""
    if _tracing():
        return ops.mrope_mixed(q, k, cos, sin, int(unsqueeze_dim))
    return _mrope_mixed(q, k, cos, sin, unsqueeze_dim)


def swiglu_mlp_wrapper(mlp_module, hidden_states):
    """down_proj(act_fn(gate_proj(x)) * up_proj(x)) for a module with gate/up/down nn.Linear."""
    if _tracing():
        if not reference.is_silu(mlp_module.act_fn):  # the op computes SiLU: trace the module's own math
            return reference.swiglu_mlp(mlp_module, hidden_states)
        gate, up, down = mlp_module.gate_proj, mlp_module.up_proj, mlp_module.down_proj
        return ops.swiglu_mlp(
            hidden_states, gate.weight, gate.bias, up.weight, up.bias, down.weight, down.bias
        )
    return _swiglu_mlp(mlp_module, hidden_states)
