"""Where a run happens and in which dtype: device choice, dtype names, synchronisation, peak memory.

pto-patch imports torch_npu itself only here (`npu_available`). On a host that has it, `import torch` has
already loaded it (torch's backend autoload, unless TORCH_DEVICE_BACKEND_AUTOLOAD=0); installing it without
CANN is what breaks `import torch`, which is why nothing here needs it.
"""

from __future__ import annotations

import importlib.util
import re
import resource
import sys
from dataclasses import dataclass

from pto_patch.errors import EXIT_USAGE, PtoPatchError

# name -> torch dtype attribute
DTYPE_NAMES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
}


@dataclass(frozen=True)
class DeviceChoice:
    name: str  # "cpu", "cuda:0", "npu:1"
    kind: str  # "cpu", "cuda", "npu"
    reason: str


_DEVICE_RE = re.compile(r"^(cpu|cuda|npu)(?::(\d+))?$")


def parse_device(text: str) -> tuple[str, int | None]:
    """'cpu' -> ('cpu', None); 'cuda:1' -> ('cuda', 1); '3' -> ('npu', 3), as the reference's card number."""
    value = text.strip().lower()
    if value.isdigit():
        return "npu", int(value)
    match = _DEVICE_RE.match(value)
    if not match or (match.group(1) == "cpu" and match.group(2) is not None):
        raise PtoPatchError(
            f"--device '{text}' is not a device",
            "use cpu, cuda, cuda:N, npu, npu:N, or a bare NPU card number",
            exit_code=EXIT_USAGE,
        )
    index = match.group(2)
    return match.group(1), (int(index) if index is not None else None)


def npu_available() -> bool:
    """True when torch_npu imports and sees a device (pto-patch's one import of it; torch may have loaded it)."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch
        import torch_npu  # noqa: F401

        return bool(torch.npu.is_available())
    except Exception:  # torch_npu without CANN raises a range of errors on import
        return False


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def resolve_device(text: str | None) -> DeviceChoice:
    if text is None or not text.strip():
        if npu_available():
            return DeviceChoice("npu:0", "npu", "default: an NPU is present")
        if cuda_available():
            return DeviceChoice("cuda:0", "cuda", "default: no NPU, CUDA is present")
        return DeviceChoice("cpu", "cpu", "default: no NPU or CUDA device found")
    kind, index = parse_device(text)
    if kind == "cpu":
        return DeviceChoice("cpu", "cpu", "requested")
    if kind == "npu":
        if not npu_available():
            raise PtoPatchError(
                f"--device {text} asks for an Ascend NPU, but torch_npu is not importable or sees no NPU",
                "on a host with CANN, install the torch_npu release for your torch and CANN (the doctor command checks the pair); elsewhere pass --device cpu",
            )
        import torch

        count = torch.npu.device_count()
    else:
        if not cuda_available():
            raise PtoPatchError(
                f"--device {text} asks for CUDA, but this torch build sees no CUDA device",
                "pass --device cpu, or install a CUDA build of torch",
            )
        import torch

        count = torch.cuda.device_count()
    index = 0 if index is None else index
    if index >= count:
        raise PtoPatchError(
            f"--device {text}: there are only {count} {kind} device(s)",
            f"pick an index below {count}",
        )
    return DeviceChoice(f"{kind}:{index}", kind, "requested")


def dtype_key(name: str) -> str:
    """The torch dtype attribute for a --dtype name ('bf16' -> 'bfloat16'); a usage error otherwise."""
    key = DTYPE_NAMES.get(name.strip().lower())
    if key is None:
        raise PtoPatchError(
            f"--dtype '{name}' is not supported",
            "use bf16, fp16 or fp32 (or bfloat16, float16, half, float32, float)",
            exit_code=EXIT_USAGE,
        )
    return key


def resolve_dtype(name: str):
    import torch

    return getattr(torch, dtype_key(name))


def synchronize(device: DeviceChoice) -> None:
    import torch

    if device.kind == "cuda":
        torch.cuda.synchronize(device.name)
    elif device.kind == "npu":
        torch.npu.synchronize(device.name)


def empty_cache(device: DeviceChoice) -> None:
    """Hand the allocator's free blocks back (after a model is let go)."""
    import torch

    if device.kind == "cuda":
        torch.cuda.empty_cache()
    elif device.kind == "npu":
        torch.npu.empty_cache()


# --- peak memory ----------------------------------------------------------------------------------

RSS_SOURCE = "process peak RSS (monotonic over the process: a later mode's figure includes earlier ones)"


def reset_peak_memory(device: DeviceChoice) -> None:
    import torch

    if device.kind == "cuda":
        torch.cuda.reset_peak_memory_stats(device.name)
    elif device.kind == "npu":
        torch.npu.reset_peak_memory_stats(device.name)


def peak_memory_mb(device: DeviceChoice) -> float:
    import torch

    if device.kind == "cuda":
        return torch.cuda.max_memory_allocated(device.name) / 2**20
    if device.kind == "npu":
        return torch.npu.max_memory_allocated(device.name) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def peak_memory_source(device: DeviceChoice) -> str:
    if device.kind == "cpu":
        return RSS_SOURCE
    return f"{device.kind} allocator peak (reset before each mode)"
