"""Backend routes (bound at enable time), call statistics and the fallback policy. No kernel math lives here."""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

from .entries import BY_NAME, ENTRIES, OPS

BACKENDS = ("auto", "pypto", "npu", "torch", "fused")
BACKEND_ENV = "PTO_KERNELS_BACKEND"
STRICT_ENV = "PTO_KERNELS_STRICT"

_log = logging.getLogger("pto_kernels")

# backend name -> module (relative to this package) holding one function per kernel entry
_BACKEND_MODULES = {
    "torch": "backends.reference",
    "fused": "backends.fused",
    "npu": "backends.npu",
    "pypto": "backends.pypto",
}
# kernel entry -> the op it is counted under, and the position of the tensor whose device decides the
# route under "auto" (entries.py declares both)
_ENTRY_OP = {entry.name: entry.op for entry in ENTRIES}
_DEVICE_ARG = {entry.name: entry.device_arg for entry in ENTRIES}


class KernelFailedError(RuntimeError):
    """A kernel raised while PTO_KERNELS_STRICT=1 was set (otherwise the torch path runs instead)."""


class _Count:
    """Calls that one backend served for one op: a slot bumped on the hot path, summed by `stats()`."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls = 0


@dataclass
class OpStats:
    backend: str | None = None  # the backend of the latest call
    counts: dict[str, _Count] = field(default_factory=dict)
    fallbacks: int = 0
    first_fallback_error: str | None = None
    captured: int = 0  # calls made while a device graph was captured: replays run them without Python
    replays: int = 0  # calls of a `count_replays` callable that replayed this op's captured kernels
    cache_writes: int = 0  # calls that also wrote a static KV cache (attention_prologue's `_cached` entries)

    def calls(self) -> int:
        return sum(count.calls for count in self.counts.values())

    def count(self, backend: str) -> _Count:
        return self.counts.setdefault(backend, _Count())

    def clear(self) -> None:
        self.backend, self.fallbacks, self.first_fallback_error = None, 0, None
        self.captured = self.replays = self.cache_writes = 0
        for count in self.counts.values():  # in place: bound routes hold these objects
            count.calls = 0

    def as_dict(self) -> dict:
        backends = {name: count.calls for name, count in self.counts.items() if count.calls}
        return {
            "calls": sum(backends.values()),
            "backend": self.backend,
            "backends": backends,
            "fallbacks": self.fallbacks,
            "first_fallback_error": self.first_fallback_error,
            "captured": self.captured,
            "replays": self.replays,
            "cache_writes": self.cache_writes,
        }


_STATS: dict[str, OpStats] = {op: OpStats() for op in OPS}
# kernel entry -> the route bound at enable(): what the wrappers call in eager mode and the custom ops'
# bodies call under torch.compile (see ops.py)
ROUTES: dict[str, Callable] = {}
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


def _runner(entry: str, backend: str, elsewhere: Callable | None = None) -> Callable:
    """Call `entry` on `backend`, counted; on failure, the torch path (or KernelFailedError if strict).

    With `elsewhere`, only tensors on the CPU take this route; others are handed to `elsewhere(args)`.
    """
    op = _ENTRY_OP[entry]
    stats = _STATS[op]
    count = stats.count(backend)
    index = _DEVICE_ARG[entry]
    module: ModuleType | None = _modules.get(backend)
    writes_cache = BY_NAME[entry].writes_cache  # every backend's entry writes the cache, the torch path too

    def run(*args):
        nonlocal module
        if elsewhere is not None and not args[index].is_cpu:
            return elsewhere(args)
        count.calls += 1
        stats.backend = backend
        try:
            if module is None:
                module = _module(backend)  # imported on first use: pypto may be absent or broken
            out = getattr(module, entry)(*args)  # looked up per call, so a replaced kernel is seen
        except Exception as exc:
            if backend == "torch":
                raise
            count.calls -= 1
            out = _fall_back(op, entry, backend, args, exc)
        stats.cache_writes += writes_cache
        return out

    return run


def _fall_back(op: str, entry: str, backend: str, args: tuple, exc: Exception):
    stats = _STATS[op]
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
    stats.count("torch").calls += 1
    stats.backend = "torch"
    return getattr(_module("torch"), entry)(*args)


def bind(entry: str, requested: str) -> Callable:
    """The call for kernel `entry` under backend `requested`, routed now, at enable(), not per call.

    Routing per call cost more than the fused RMSNorm saves at decode (reading `tensor.device.type`
    alone is ~1.4 us on this CPU). Only "auto" still looks at the tensor: `is_cpu` is cheap, and other
    devices are resolved once per device type.
    """
    if requested != "auto":
        return _runner(entry, requested)
    index = _DEVICE_ARG[entry]
    by_type: dict[str, Callable] = {}

    def elsewhere(args: tuple):
        device_type = args[index].device.type
        route = by_type.get(device_type)
        if route is None:
            route = by_type[device_type] = _runner(entry, resolve("auto", device_type))
        return route(*args)

    return _runner(entry, resolve("auto", "cpu"), elsewhere)


def capturing(device_type: str) -> bool:
    """True while the current stream of `device_type` is being captured into a device graph (CUDA graph,
    the NPU's ACL graph): kernels launched now are replayed later without running any Python."""
    import torch

    if device_type == "cuda":
        return torch.cuda.is_current_stream_capturing()
    # torch.npu's stream query; torch.cpu has none (a stand-in capture on the CPU sets one: tests/)
    probe = getattr(getattr(torch, device_type, None), "is_current_stream_capturing", None)
    return bool(probe()) if callable(probe) else False


def note_capture(entry: str) -> None:
    _STATS[_ENTRY_OP[entry]].captured += 1


def count_replays(fn: Callable) -> Callable:
    """Wrap a compiled callable whose device graphs may replay without Python: after each call, every op
    that was captured and whose calls did not move is counted as replayed (stats: "replays")."""
    import functools

    @functools.wraps(fn)
    def run(*args, **kwargs):
        before = {op: s.calls() for op, s in _STATS.items() if s.captured}
        out = fn(*args, **kwargs)
        for op, calls in before.items():
            if _STATS[op].calls() == calls:
                _STATS[op].replays += 1
        return out

    return run


_NO_KERNELS = {"built": 0, "compiles": 0, "compile_s": 0.0, "cache_hits": 0, "evicted": 0, "cached": 0}


def stats() -> dict[str, dict]:
    """Per op: calls, backends, fallbacks, and `pypto_kernels` (built, compiles, cache hits, held)."""
    kernels = _modules["pypto"].kernel_stats() if "pypto" in _modules else {}
    return {
        op: s.as_dict() | {"pypto_kernels": kernels.get(op, dict(_NO_KERNELS))} for op, s in _STATS.items()
    }


def reset_stats() -> None:
    for op_stats in _STATS.values():
        op_stats.clear()
    if "pypto" in _modules:
        _modules["pypto"].reset_kernel_stats()
