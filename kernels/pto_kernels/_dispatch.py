"""Per-call backend choice, call statistics and the fallback policy. No kernel math lives here."""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass, field
from types import ModuleType

OPS = ("rms_norm", "mrope", "swiglu_mlp")
BACKENDS = ("auto", "pypto", "npu", "torch", "fused")
BACKEND_ENV = "PTO_KERNELS_BACKEND"
STRICT_ENV = "PTO_KERNELS_STRICT"

_log = logging.getLogger("pto_kernels")

# backend name -> module (relative to this package) holding one function per kernel entry
_BACKEND_MODULES = {"torch": "reference", "fused": "fused", "npu": "npu", "pypto": "pypto_kernels"}
# kernel entry -> the op it is counted under
_ENTRY_OP = {"rms_norm": "rms_norm", "mrope": "mrope", "mrope_mixed": "mrope", "swiglu_mlp": "swiglu_mlp"}


class KernelFailedError(RuntimeError):
    """A kernel raised while PTO_KERNELS_STRICT=1 was set (otherwise the torch path runs instead)."""


@dataclass
class OpStats:
    calls: int = 0
    backend: str | None = None
    backends: dict[str, int] = field(default_factory=dict)
    fallbacks: int = 0
    first_fallback_error: str | None = None

    def as_dict(self) -> dict:
        return {
            "calls": self.calls,
            "backend": self.backend,
            "backends": dict(self.backends),
            "fallbacks": self.fallbacks,
            "first_fallback_error": self.first_fallback_error,
        }


_STATS: dict[str, OpStats] = {op: OpStats() for op in OPS}
_modules: dict[str, ModuleType] = {}
_pypto_importable: bool | None = None


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"unknown pto_kernels backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return name


def backend_from_env() -> str:
    value = os.environ.get(BACKEND_ENV, "").strip().lower() or "auto"
    if value not in BACKENDS:
        _log.warning("ignoring %s=%r: not one of %s; using auto", BACKEND_ENV, value, ", ".join(BACKENDS))
        return "auto"
    return value


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def pypto_importable() -> bool:
    """True when `import pypto` succeeds (checked once; a broken install counts as absent)."""
    global _pypto_importable
    if _pypto_importable is None:
        try:
            importlib.import_module("pypto")
            _pypto_importable = True
        except Exception:  # noqa: BLE001 - a broken native install raises OSError and others
            _pypto_importable = False
    return _pypto_importable


def resolve(requested: str, device_type: str) -> str:
    if requested != "auto":
        return requested
    if device_type == "npu":
        return "pypto" if pypto_importable() else "npu"
    return "fused"


def _module(backend: str) -> ModuleType:
    mod = _modules.get(backend)
    if mod is None:
        mod = importlib.import_module(f"{__package__}.{_BACKEND_MODULES[backend]}")
        _modules[backend] = mod
    return mod


# (entry, requested backend, device type, pypto importable) -> (op, backend, backend module), resolved
# once: the per-call cost of choosing was 1.7 us, more than the fused RMSNorm saves at decode.
_routes: dict[tuple, tuple[str, str, ModuleType]] = {}


def _route(entry: str, requested: str, device_type: str) -> tuple[str, str, ModuleType]:
    key = (entry, requested, device_type, _pypto_importable)
    route = _routes.get(key)
    if route is None:
        backend = resolve(requested, device_type)
        route = _routes[key] = (_ENTRY_OP[entry], backend, _module(backend))
    return route


def run(entry: str, requested: str, device_type: str, args: tuple):
    """Run kernel `entry` on the backend chosen for this call; fall back to torch on failure."""
    op, backend, module = _route(entry, requested, device_type)
    stats = _STATS[op]
    stats.calls += 1
    try:
        result = getattr(module, entry)(*args)
    except Exception as exc:
        if backend == "torch":
            raise
        reason = f"{type(exc).__name__}: {exc}"
        if strict():
            raise KernelFailedError(f"pto_kernels {op} on backend {backend!r} failed: {reason}") from exc
        stats.fallbacks += 1
        if stats.first_fallback_error is None:
            stats.first_fallback_error = f"{backend}: {reason}"
            _log.warning(
                "pto_kernels: %s on backend %r failed (%s); using the torch path instead "
                "(logged once; set %s=1 to raise)",
                op,
                backend,
                reason,
                STRICT_ENV,
            )
        backend = "torch"
        result = getattr(_module("torch"), entry)(*args)
    stats.backend = backend
    stats.backends[backend] = stats.backends.get(backend, 0) + 1
    return result


_NO_KERNELS = {"built": 0, "compiles": 0, "cache_hits": 0, "evicted": 0, "cached": 0}


def stats() -> dict[str, dict]:
    """Per op: calls, backends, fallbacks, and `pypto_kernels` (built, compiles, cache hits, held)."""
    kernels = _modules["pypto"].kernel_stats() if "pypto" in _modules else {}
    return {
        op: s.as_dict() | {"pypto_kernels": kernels.get(op, dict(_NO_KERNELS))} for op, s in _STATS.items()
    }


def reset_stats() -> None:
    for op in OPS:
        _STATS[op] = OpStats()
    if "pypto" in _modules:
        _modules["pypto"].reset_kernel_stats()
