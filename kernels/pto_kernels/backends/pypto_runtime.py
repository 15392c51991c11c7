"""The PyPTO 0.2 runtime every kernel of the package uses: the jit per device (PyPTO's NPU mode; on the CPU
its verify interpreter, made to compute real outputs; SIM for the cost model), the bounded cache of built
kernels and its counts, the launch (the tensor's NPU made current, the interpreter's report kept off
stdout), the row axis and cache key a tiling gives, and the NaN-poisoned outputs tests ask for. The kernels
themselves live in pypto_ops.py (RMSNorm, MRoPE, SwiGLU MLP), pypto_blocks.py, pypto_prologue.py and
pypto_attention.py.

On the CPU, PyPTO's SIM mode only estimates cycles, so CPU tensors go through PyPTO's verify interpreter
instead (slow: for correctness checks, never for generation); see `use_cpu_interpreter`. Compiled kernels
live in a bounded LRU cache (`KERNEL_CACHE_SIZE`); `kernel_stats()` counts per op the kernels built, the
times pypto compiled them and the cache hits.
"""

import contextlib
import ctypes
import importlib
import importlib.metadata
import os
import shutil
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import torch

from ..tiling.tile_table import TileConfig
from . import pypto_device
from .interpreter_output import quiet_interpreter

CACHE_ENV = pypto_device.CACHE_ENV
_TORCH_TO_PYPTO = {torch.float32: "DT_FP32", torch.float16: "DT_FP16", torch.bfloat16: "DT_BF16"}

# Compiled kernels kept per process. A model uses about 2 per (op, width, dtype): RMSNorm at two widths
# (text and vision), MRoPE with unmixed or mixed tables, the MLP: about 12, so 32 leaves room.
KERNEL_CACHE_SIZE = 32
# Tests set this: outputs start as NaN, so an element the kernel never writes cannot pass as correct.
POISON_OUTPUTS = False


def new_output(like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, float("nan")) if POISON_OUTPUTS else torch.empty_like(like)


def pypto_module():
    return importlib.import_module("pypto")


def pypto_dtype(dtype: torch.dtype):
    name = _TORCH_TO_PYPTO.get(dtype)
    if name is None:
        raise TypeError(f"pypto kernels take float32, float16 or bfloat16 tensors, not {dtype}")
    return getattr(pypto_module(), name)


# --- running on the CPU through PyPTO's verify interpreter -------------------------------------------


def calculator_dir() -> Path:
    version = f"pypto{importlib.metadata.version('pypto')}-torch{torch.__version__}"
    return pypto_device.cache_root() / f"calculator-{version}"


def _load_calculator() -> None:
    """Build PyPTO's interpreter library once into a persistent cache (pypto builds it in a temp dir
    on every process otherwise, 25-37 s) and load it."""
    from pypto._utils import BuildOnlineManager

    manager = BuildOnlineManager()
    if manager.calculator_loaded:
        return
    root = calculator_dir()
    library = root / "install" / "lib" / "libtile_fwk_calculator.so"
    if not library.exists():
        import fcntl

        root.mkdir(parents=True, exist_ok=True)
        with open(root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not library.exists():
                torch_ctx = manager._TorchContext()
                cmake_ctx = manager._CMakeContext()
                ctx = cmake_ctx.CompileContext(src_dir=_calculator_source(manager, root), tmp_dir=root)
                ctx.cfg_cmd_ext = (
                    f"-DPY3_MOD_TORCH_VERSION={torch_ctx.torch_version}"
                    f" -DPY3_MOD_TORCH_ROOT_PATH={torch_ctx.torch_root_dir}"
                    f" -DPY3_MOD_TORCH_C_GLIBCXX_USE_CXX11_ABI={torch_ctx.torch_c_use_cxx11_abi}"
                )
                ctx.build_job_num = max(1, min(4, os.cpu_count() or 1))
                cmake_ctx.compile(ctx)
    ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    manager.calculator_loaded = True


def torch_headers_need_cxx20() -> bool:
    """torch 2.14's C++ headers stop any compile below C++20 (`torch/all.h`: "C++20 or later compatible
    compiler is required"); pypto 0.2's interpreter sources pin C++17 in their CMakeLists."""
    header = (
        Path(torch.__file__).parent / "include" / "torch" / "csrc" / "api" / "include" / "torch" / "all.h"
    )
    try:
        return "C++20 or later" in header.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def _calculator_source(manager, root: Path) -> Path:
    """pypto's interpreter sources; where torch's headers need C++20, a copy beside the build that asks for
    C++20 (the copy's parent links to pypto's libraries, which its CMakeLists finds in `..`)."""
    source = Path(manager.pkg_lib_dir, "calculator")
    if not torch_headers_need_cxx20():
        return source
    done = root / "src"
    if (done / "calculator").is_dir():
        return done / "calculator"
    partial = root / "src.partial"  # renamed whole when ready: a killed copy is never taken for one
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial / "calculator")
    cmake = partial / "calculator" / "CMakeLists.txt"
    text = cmake.read_text(encoding="utf-8")
    if "set(CMAKE_CXX_STANDARD 17)" not in text:
        raise RuntimeError(f"{cmake} does not pin C++17 as pypto 0.2's does: cannot build it for this torch")
    cmake.write_text(
        text.replace("set(CMAKE_CXX_STANDARD 17)", "set(CMAKE_CXX_STANDARD 20)"), encoding="utf-8"
    )
    for library in Path(manager.pkg_lib_dir).iterdir():
        if library.is_file():
            (partial / library.name).symlink_to(library)
    shutil.rmtree(done, ignore_errors=True)
    partial.rename(done)
    return done / "calculator"


def _hand_inputs_to_interpreter(pto_tensors) -> None:
    # pypto 0.2 copies the inputs "device to host" into fresh zero buffers, which the CPU stub runtime
    # never fills, so the interpreter computes on zeros. CPU tensors are already on the host: register
    # their own buffers (the interpreter also writes the outputs into them).
    pypto = pypto_module()
    if not pypto.get_verify_options().get("enable_pass_verify"):
        return
    from pypto import pypto_impl
    from pypto.frontend.parser import entry
    from pypto.runtime import _pto_verify_datas

    _load_calculator()
    pypto_impl.SetVerifyData(entry._pto_to_tensor_data(pto_tensors), [], _pto_verify_datas.get_data())


_interpreter_ready = False


def use_cpu_interpreter() -> None:
    """Make CPU-tensor calls compute real outputs through the verify interpreter (pypto 0.2.* only)."""
    global _interpreter_ready
    if _interpreter_ready:
        return
    os.environ.setdefault("TILE_FWK_OUTPUT_DIR", os.path.join(tempfile.gettempdir(), "pto_kernels_traces"))
    pypto_module()
    from pypto.frontend.parser.entry import JitCallableWrapper

    JitCallableWrapper._setup_verify_data = staticmethod(_hand_inputs_to_interpreter)
    _interpreter_ready = True


def jit(device_type: str, config: TileConfig, runtime_options: dict | None = None):
    """pypto's jit for `device_type`; `runtime_options`: runtime options beside the run mode (pypto's
    tile_fwk_config_schema.json names them, e.g. stitch_function_inner_memory)."""
    pypto = pypto_module()
    options = {"pass_options": config.pass_options()}
    extra = dict(runtime_options or {})
    if device_type == "npu":
        return pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.NPU} | extra, **options)
    if device_type == "sim":  # cost model only: a cycle report under TILE_FWK_OUTPUT_DIR, outputs unwritten
        return pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM} | extra, **options)
    if device_type != "cpu":
        raise RuntimeError(f"pypto kernels run on npu (or cpu through the interpreter), not {device_type}")
    use_cpu_interpreter()
    return pypto.frontend.jit(
        runtime_options={"run_mode": pypto.RunMode.SIM} | extra,
        verify_options={"enable_pass_verify": True},
        **options,
    )


class KernelCache:
    """Compiled kernels by key (the op first), least recently used dropped past `capacity`.

    Counts per op: `built` (kernels made), `compiles` (times pypto compiled one: pypto 0.2 compiles on
    every SIM/interpreter call), `compile_s` (seconds spent in those compiles, apart from the runs),
    `cache_hits`, `evicted`; `cached` is how many are held now.
    """

    def __init__(self, capacity: int = KERNEL_CACHE_SIZE) -> None:
        self.capacity = capacity
        self._kernels: OrderedDict[tuple, object] = OrderedDict()
        self._counts: dict[str, dict[str, int]] = {}

    def _count(self, op: str) -> dict[str, int]:
        return self._counts.setdefault(
            op, {"built": 0, "compiles": 0, "compile_s": 0.0, "cache_hits": 0, "evicted": 0}
        )

    def get(self, key: tuple, build):
        op = key[0]
        kernel = self._kernels.get(key)
        if kernel is not None:
            self._kernels.move_to_end(key)
            self._count(op)["cache_hits"] += 1
            return kernel
        kernel = build()
        self._count_compiles(kernel, op)
        self._kernels[key] = kernel
        self._count(op)["built"] += 1
        while len(self._kernels) > self.capacity:
            evicted, _ = self._kernels.popitem(last=False)
            self._count(evicted[0])["evicted"] += 1
        return kernel

    def _count_compiles(self, kernel, op: str) -> None:
        compile_once = kernel.compile

        def compile_counted(*args, **kwargs):
            counts = self._count(op)
            counts["compiles"] += 1
            start = time.perf_counter()
            try:
                return compile_once(*args, **kwargs)
            finally:
                counts["compile_s"] += time.perf_counter() - start

        # the jit wrapper calls self.compile before each run (on the NPU, its launcher on the first one)
        kernel.compile = compile_counted

    def __contains__(self, key: tuple) -> bool:
        return key in self._kernels

    def stats(self) -> dict[str, dict[str, int]]:
        held: dict[str, int] = {}
        for key in self._kernels:
            held[key[0]] = held.get(key[0], 0) + 1
        ops = set(self._counts) | set(held)
        return {op: dict(self._count(op), cached=held.get(op, 0)) for op in sorted(ops)}

    def reset_counts(self) -> None:
        self._counts.clear()

    def clear(self) -> None:
        self._kernels.clear()


KERNELS = KernelCache()


def kernel_stats() -> dict[str, dict[str, int]]:
    """Per op: kernels built, pypto compiles, cache hits, evictions and kernels held (since reset)."""
    return KERNELS.stats()


def reset_kernel_stats() -> None:
    KERNELS.reset_counts()


def device_type_of(tensor: torch.Tensor) -> str:
    return tensor.device.type


def cached_kernel(key: tuple, device_type: str, build):
    """The compiled kernel for `key`, built by `build()` if not cached. On an NPU: PyPTO's pre-flight
    checks and settings first (pypto_device.prepare: DeviceNotReadyError with the reason). On any device,
    no compile inside a device-graph capture (CompileDuringCaptureError: run the model eagerly once
    first): the capture would record the torch fallback, and every replay would run it."""
    if device_type == "npu":
        pypto_device.prepare()
    if key not in KERNELS and pypto_device.capturing(device_type):
        raise pypto_device.CompileDuringCaptureError(
            f"pypto kernel {key[0]} is not compiled yet and a device graph is being captured:"
            " run the model eagerly once before capturing"
        )
    return KERNELS.get(key, build)


@contextlib.contextmanager
def launching(tensor: torch.Tensor):
    """Around a kernel call: the tensor's NPU made current (pypto launches on the current one); on the
    CPU, the interpreter's per-call report kept off stdout."""
    device_type = device_type_of(tensor)
    if device_type == "npu":
        with pypto_device.on_device(tensor.device):
            yield
    else:
        with quiet_stdout(device_type):
            yield


def row_axis(config: TileConfig, rows: int, name: str = "rows"):
    return rows if config.static else pypto_module().frontend.dynamic(name)


def kernel_key(op: str, config: TileConfig, rows: int, *rest) -> tuple:
    return (op, rows if config.static else "dynamic", config, *rest)


quiet_stdout = quiet_interpreter  # stdout and pypto's drawing tracebacks (interpreter_output)
