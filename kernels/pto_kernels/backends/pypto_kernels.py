"""PyPTO 0.2 kernels (`@pypto.frontend.jit`): RMSNorm, MRoPE with in-kernel section mixing, SwiGLU MLP; and the
machinery the decoder-layer blocks (pypto_blocks.py) share with them. pypto.py hands both to the dispatcher.

On an Ascend NPU the kernels run in PyPTO's NPU mode. On the CPU, PyPTO's SIM mode only estimates cycles,
so CPU tensors go through PyPTO's verify interpreter instead (slow: for correctness checks, never for
generation); see `use_cpu_interpreter`.

Each kernel loops over its row axis (tokens, or batch x positions for MRoPE) in tiles and that axis is
dynamic, so one compiled kernel serves every prompt length and batch size of a given width and dtype.
Tilings come from tile_table.TILE_TABLE, one per shape class (decode, prefill). Compiled kernels live in
a bounded LRU cache (`KERNEL_CACHE_SIZE`); `kernel_stats()` counts per op the kernels built, the times
pypto compiled them and the cache hits. MLP weights are used in nn.Linear layout (matmul with
b_trans=True) and prepared once per module; they are prepared again only when a weight tensor changes
(data pointer, version counter, shape or dtype).
"""

# No `from __future__ import annotations`: pypto reads the kernels' annotations as objects.
import contextlib
import ctypes
import importlib
import importlib.metadata
import os
import shutil
import tempfile
import time
import weakref
from collections import OrderedDict
from pathlib import Path

import torch

from ..tiling import tile_budget
from ..tiling.tile_table import TileConfig, tile_config
from . import fused, pypto_device
from .interpreter_output import quiet_interpreter

CACHE_ENV = pypto_device.CACHE_ENV
_TORCH_TO_PYPTO = {torch.float32: "DT_FP32", torch.float16: "DT_FP16", torch.bfloat16: "DT_BF16"}

# Compiled kernels kept per process. A model uses about 2 per (op, width, dtype): RMSNorm at two widths
# (text and vision), MRoPE with unmixed or mixed tables, the MLP: about 12, so 32 leaves room.
KERNEL_CACHE_SIZE = 32
# Tests set this: outputs start as NaN, so an element the kernel never writes cannot pass as correct.
POISON_OUTPUTS = False


def _new_output(like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, float("nan")) if POISON_OUTPUTS else torch.empty_like(like)


def _pypto():
    return importlib.import_module("pypto")


def _dtype(dtype: torch.dtype):
    name = _TORCH_TO_PYPTO.get(dtype)
    if name is None:
        raise TypeError(f"pypto kernels take float32, float16 or bfloat16 tensors, not {dtype}")
    return getattr(_pypto(), name)


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
    pypto = _pypto()
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
    _pypto()
    from pypto.frontend.parser.entry import JitCallableWrapper

    JitCallableWrapper._setup_verify_data = staticmethod(_hand_inputs_to_interpreter)
    _interpreter_ready = True


def _jit(device_type: str, config: TileConfig, runtime: dict | None = None):
    """pypto's jit for `device_type`; `runtime`: runtime options beside the run mode (pypto's
    tile_fwk_config_schema.json names them, e.g. stitch_function_inner_memory)."""
    pypto = _pypto()
    options = {"pass_options": config.pass_options()}
    extra = dict(runtime or {})
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


def _device_type(tensor: torch.Tensor) -> str:
    return tensor.device.type


def _kernel(key: tuple, device_type: str, build):
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
def _launching(tensor: torch.Tensor):
    """Around a kernel call: the tensor's NPU made current (pypto launches on the current one); on the
    CPU, the interpreter's per-call report kept off stdout."""
    device_type = _device_type(tensor)
    if device_type == "npu":
        with pypto_device.on_device(tensor.device):
            yield
    else:
        with _quiet_stdout(device_type):
            yield


def _row_axis(config: TileConfig, rows: int, name: str = "rows"):
    return rows if config.static else _pypto().frontend.dynamic(name)


def _kernel_key(op: str, config: TileConfig, rows: int, *rest) -> tuple:
    return (op, rows if config.static else "dynamic", config, *rest)


_quiet_stdout = quiet_interpreter  # stdout and pypto's drawing tracebacks (interpreter_output)


# --- RMSNorm -----------------------------------------------------------------------------------------


def _build_rms_norm(
    rows: int, hidden: int, dtype: torch.dtype, eps: float, config: TileConfig, device_type: str
):
    pypto = _pypto()
    dt, fp32 = _dtype(dtype), pypto.DT_FP32
    rows_axis = _row_axis(config, rows)
    tile = config.row_tile

    @_jit(device_type, config)
    def rms_norm_kernel(
        x: pypto.Tensor([rows_axis, hidden], dt),
        weight: pypto.Tensor([1, hidden], dt),
        out: pypto.Tensor([rows_axis, hidden], dt),
    ):
        pypto.set_vec_tile_shapes(tile, hidden)
        n_rows = x.shape[0]
        for step in pypto.loop((n_rows + tile - 1) // tile):
            start = step * tile
            valid = pypto.min(start + tile, n_rows) - start
            xt = pypto.cast(pypto.view(x, [tile, hidden], [start, 0], valid_shape=[valid, hidden]), fp32)
            pypto.assemble(_normed(xt, weight, hidden, eps, dt), [start, 0], out)

    return rms_norm_kernel


def _normed(xt, weight, hidden: int, eps: float, dt):
    """Inside a kernel: RMSNorm of an fp32 row tile [rows, hidden] with the [1, hidden] weight, in dtype dt.

    The weight is cast here, inside the caller's row loop: outside it becomes a task of its own (~1 us
    more at decode). Written out: pypto.rms_norm fails on a partial tail tile."""
    pypto = _pypto()
    fp32 = pypto.DT_FP32
    w = pypto.cast(weight, fp32)
    mean_square = pypto.mul(pypto.sum(pypto.mul(xt, xt), -1, True), 1.0 / hidden)
    normed = pypto.mul(xt, pypto.rsqrt(pypto.add(mean_square, eps)))
    # like transformers: normalise in fp32, round to the input dtype, then scale by the weight
    rounded = pypto.cast(pypto.cast(normed, dt), fp32)
    return pypto.cast(pypto.mul(rounded, w), dt)


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    shape, hidden = hidden_states.shape, hidden_states.shape[-1]
    out_dtype = torch.promote_types(hidden_states.dtype, weight.dtype)
    x = hidden_states.reshape(-1, hidden).contiguous()
    w = weight.to(x.dtype).reshape(1, hidden).contiguous()
    rows, device_type = x.shape[0], _device_type(x)
    _, config = tile_config("rms_norm", rows, hidden)
    key = _kernel_key("rms_norm", config, rows, hidden, x.dtype, float(eps), device_type)
    kernel = _kernel(
        key, device_type, lambda: _build_rms_norm(rows, hidden, x.dtype, float(eps), config, device_type)
    )
    out = _new_output(x)
    with _launching(x):
        kernel(x, w, out)
    return out.reshape(shape).to(out_dtype)


# --- MRoPE -------------------------------------------------------------------------------------------


def _build_mrope(rows, q_heads, k_heads, dim, dtype, table_dtype, config, device_type):
    """Rows are (batch, position) pairs: q [rows, q_heads*dim], k [rows, k_heads*dim] (heads side by side),
    cos/sin [rows, dim], section-mixed.

    Each head reads its cos/sin halves straight from the inputs rather than sharing a computed tile: in
    the cost model a shared intermediate becomes a dependent task, ~3 us at decode."""
    pypto = _pypto()
    dt, tdt, fp32 = _dtype(dtype), _dtype(table_dtype), pypto.DT_FP32
    rows_axis = _row_axis(config, rows)
    tile, half = config.row_tile, dim // 2

    @_jit(device_type, config)
    def mrope_kernel(
        q: pypto.Tensor([rows_axis, q_heads * dim], dt),
        k: pypto.Tensor([rows_axis, k_heads * dim], dt),
        cos: pypto.Tensor([rows_axis, dim], tdt),
        sin: pypto.Tensor([rows_axis, dim], tdt),
        q_out: pypto.Tensor([rows_axis, q_heads * dim], dt),
        k_out: pypto.Tensor([rows_axis, k_heads * dim], dt),
    ):
        pypto.set_vec_tile_shapes(tile, half)
        n_rows = q.shape[0]
        for step in pypto.loop((n_rows + tile - 1) // tile):
            start = step * tile
            valid = pypto.min(start + tile, n_rows) - start
            for head in range(q_heads + k_heads):
                if head < q_heads:
                    src, dst, col = q, q_out, head * dim
                else:
                    src, dst, col = k, k_out, (head - q_heads) * dim
                x1 = pypto.cast(pypto.view(src, [tile, half], [start, col], valid_shape=[valid, half]), fp32)
                x2 = pypto.cast(
                    pypto.view(src, [tile, half], [start, col + half], valid_shape=[valid, half]), fp32
                )
                cos1, cos2, sin1, sin2 = _table_halves(cos, sin, start, tile, valid, half)
                out1, out2 = _rotated(x1, x2, cos1, cos2, sin1, sin2)
                pypto.assemble(pypto.cast(out1, dt), [start, col], dst)
                pypto.assemble(pypto.cast(out2, dt), [start, col + half], dst)

    return mrope_kernel


def _rotated(x1, x2, cos1, cos2, sin1, sin2):
    """Inside a kernel: one head's halves rotated (rotate_half): x1*cos1 - x2*sin1, x2*cos2 + x1*sin2."""
    pypto = _pypto()
    out1 = pypto.sub(pypto.mul(x1, cos1), pypto.mul(x2, sin1))
    out2 = pypto.add(pypto.mul(x2, cos2), pypto.mul(x1, sin2))
    return out1, out2


def _table_halves(cos, sin, start, tile, valid, half):
    """Inside a kernel: (cos1, cos2, sin1, sin2), the halves of a row tile of the mixed tables, in fp32."""
    pypto = _pypto()
    return tuple(
        pypto.cast(pypto.view(table, [tile, half], [start, col], valid_shape=[valid, half]), pypto.DT_FP32)
        for table, col in ((cos, 0), (cos, half), (sin, 0), (sin, half))
    )


def _check_half_blocks(dim: int, dtype: torch.dtype, what: str) -> None:
    """A head's half must fill whole 32-byte blocks: head_dim a multiple of 32 in bf16, 16 in fp32."""
    step = 64 // dtype.itemsize
    if (dim // 2) * dtype.itemsize % 32:
        raise ValueError(
            f"{what} needs half a head in whole 32-byte blocks: head_dim {dim} in {dtype} is "
            f"{dim // 2 * dtype.itemsize} bytes a half; head_dim {step}, {2 * step}, {3 * step} ... fit"
        )


def _rotary(q, k, cos, sin):
    """q/k [b, heads, s, d]; cos/sin section-mixed, [b, s, d] or [b, 1, s, d]."""
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError("pypto MRoPE kernel takes q/k as [b, heads, s, d] with unsqueeze_dim=1")
    batch, q_heads, seq, dim = q.shape
    k_heads = k.shape[1]
    if q.dtype != k.dtype:
        raise TypeError(f"pypto MRoPE kernel needs q and k of one dtype, got {q.dtype} and {k.dtype}")
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, seq, dim):
        raise ValueError(f"pypto MRoPE kernel: k {tuple(k.shape)} does not match q {tuple(q.shape)}")
    if cos.numel() != batch * seq * dim or cos.shape != sin.shape or cos.shape[-1] != dim:
        raise ValueError(f"pypto MRoPE kernel: cos {tuple(cos.shape)} does not fit q {tuple(q.shape)}")
    _check_half_blocks(dim, q.dtype, "pypto MRoPE kernel")
    rows, device_type = batch * seq, _device_type(q)
    _, config = tile_config("mrope", rows, dim)
    key = _kernel_key("mrope", config, rows, q_heads, k_heads, dim, q.dtype, cos.dtype, device_type)
    kernel = _kernel(
        key,
        device_type,
        lambda: _build_mrope(rows, q_heads, k_heads, dim, q.dtype, cos.dtype, config, device_type),
    )
    # [b, h, s, d] -> [b*s, h*d]: no copy when q/k are the transposed [b, s, h, d] projections they are
    q2 = q.transpose(1, 2).contiguous().reshape(rows, q_heads * dim)
    k2 = k.transpose(1, 2).contiguous().reshape(rows, k_heads * dim)
    cos2, sin2 = cos.contiguous().reshape(rows, dim), sin.contiguous().reshape(rows, dim)
    q_out, k_out = _new_output(q2), _new_output(k2)
    with _launching(q2):
        kernel(q2, k2, cos2, sin2, q_out, k_out)
    return (
        q_out.reshape(batch, seq, q_heads, dim).transpose(1, 2),
        k_out.reshape(batch, seq, k_heads, dim).transpose(1, 2),
    )


def mrope(q, k, cos, sin, mrope_section, unsqueeze_dim: int = 1):
    """cos/sin [3, b, s, d]: sections mixed once per forward (shared with the fused backend's cache),
    then every layer runs the mixed kernel; in the cost model mixing in the kernel took 2.3x as long."""
    sections = tuple(int(s) for s in mrope_section)
    expected = (3, q.shape[0], q.shape[2], q.shape[3]) if q.dim() == 4 else None
    if sum(sections) * 2 != q.shape[-1] or tuple(cos.shape) != expected or cos.shape != sin.shape:
        raise ValueError(
            f"mrope_section {list(sections)} / cos {tuple(cos.shape)} do not fit q {tuple(q.shape)}"
        )
    if unsqueeze_dim != 1:
        raise ValueError("pypto MRoPE kernel takes q/k as [b, heads, s, d] with unsqueeze_dim=1")
    mixed_cos, mixed_sin, _ = fused.MIXED_TABLES.get(cos, sin, sections, unsqueeze_dim)
    return _rotary(q, k, mixed_cos, mixed_sin)


def mrope_mixed(q, k, cos, sin, unsqueeze_dim: int = 1):
    if unsqueeze_dim != 1:
        raise ValueError("pypto MRoPE kernel takes q/k as [b, heads, s, d] with unsqueeze_dim=1")
    return _rotary(q, k, cos, sin)


# --- SwiGLU MLP --------------------------------------------------------------------------------------


def _build_swiglu_mlp(tokens, hidden, inter, dtype, config, device_type):
    pypto = _pypto()
    dt = _dtype(dtype)
    rows_axis = _row_axis(config, tokens)
    tile = config.row_tile

    @_jit(device_type, config)
    def swiglu_mlp_kernel(
        x: pypto.Tensor([rows_axis, hidden], dt),
        gate_w: pypto.Tensor([inter, hidden], dt),
        up_w: pypto.Tensor([inter, hidden], dt),
        down_w: pypto.Tensor([hidden, inter], dt),
        out: pypto.Tensor([rows_axis, hidden], dt),
    ):
        n_rows = x.shape[0]
        for step in pypto.loop((n_rows + tile - 1) // tile):
            start = step * tile
            valid = pypto.min(start + tile, n_rows) - start
            xt = pypto.view(x, [tile, hidden], [start, 0], valid_shape=[valid, hidden])
            pypto.assemble(_swiglu(xt, gate_w, up_w, down_w, dt, dt, inter, config), [start, 0], out)

    return swiglu_mlp_kernel


def _swiglu(xt, gate_w, up_w, down_w, dt, out_dt, inter: int, config: TileConfig):
    """Inside a kernel: down(silu(gate(xt)) * up(xt)) of a [rows, hidden] tile in dtype dt, weights in
    nn.Linear layout; the result in out_dt. Sets the cube and vec tile shapes it needs."""
    pypto = _pypto()
    fp32, m = pypto.DT_FP32, [config.cube_m, config.cube_m]
    tile = config.row_tile
    pypto.set_cube_tile_shapes(m, list(config.cube_k), list(config.cube_n))
    gate = pypto.matmul(xt, gate_w, fp32, b_trans=True)
    up = pypto.matmul(xt, up_w, fp32, b_trans=True)
    pypto.set_vec_tile_shapes(min(tile, config.act_rows or tile), min(inter, config.act_cols))
    # silu(g) = g / (1 + exp(-g)), written out: pypto.sigmoid drops a tail tile's valid shape
    silu = pypto.div(gate, pypto.add(pypto.exp(pypto.neg(gate)), 1.0))
    act = pypto.cast(pypto.mul(silu, up), dt)
    down_k = list(config.down_cube_k or config.cube_k)
    down_n = list(config.down_cube_n or config.cube_n)
    pypto.set_cube_tile_shapes(m, down_k, down_n, config.down_split_k)
    return pypto.matmul(act, down_w, out_dt, b_trans=True)


class _WeightLayouts:
    """Kernel-ready (gate, up, down) weights per MLP module, reused until a weight tensor changes."""

    def __init__(self) -> None:
        self._by_module: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.builds = 0

    @staticmethod
    def _signature(weights, dtype) -> tuple:
        return (dtype,) + tuple(
            (w.data_ptr(), w._version, tuple(w.shape), w.dtype, w.device) for w in weights
        )

    def get(self, module: torch.nn.Module, dtype: torch.dtype):
        weights = (module.gate_proj.weight, module.up_proj.weight, module.down_proj.weight)
        signature = self._signature(weights, dtype)
        entry = self._by_module.get(module)
        if entry is not None and entry[0] == signature:
            return entry[1]
        # nn.Linear layout is what matmul(b_trans=True) takes: only a dtype change or a strided weight copies.
        laid_out = tuple(w.detach().to(dtype).contiguous() for w in weights)
        self._by_module[module] = (signature, laid_out)
        self.builds += 1
        return laid_out


WEIGHT_LAYOUTS = _WeightLayouts()


def _run_swiglu_mlp(hidden_states: torch.Tensor, gate_w, up_w, down_w) -> torch.Tensor:
    shape, hidden = hidden_states.shape, hidden_states.shape[-1]
    x = hidden_states.reshape(-1, hidden).contiguous()
    tokens, inter = x.shape[0], gate_w.shape[0]
    device_type = _device_type(x)
    _, config = tile_config("swiglu_mlp", tokens, hidden)
    tile = config.row_tile
    dims = {"gate/up": (tile, hidden, inter), "down": (tile, inter, hidden)}
    tile_budget.check("swiglu_mlp", config, x.dtype.itemsize, dims)
    key = _kernel_key("swiglu_mlp", config, tokens, hidden, inter, x.dtype, device_type)
    kernel = _kernel(
        key, device_type, lambda: _build_swiglu_mlp(tokens, hidden, inter, x.dtype, config, device_type)
    )
    out = _new_output(x)
    with _launching(x):
        kernel(x, gate_w, up_w, down_w, out)
    return out.reshape(shape)


def swiglu_mlp(mlp_module: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    act = mlp_module.act_fn
    if not fused.reference.is_silu(act):
        raise ValueError(f"pypto SwiGLU kernel computes SiLU, the module's act_fn is {type(act).__name__}")
    if any(getattr(mlp_module, p).bias is not None for p in ("gate_proj", "up_proj", "down_proj")):
        raise ValueError("pypto SwiGLU kernel takes bias-free projections")
    return _run_swiglu_mlp(hidden_states, *WEIGHT_LAYOUTS.get(mlp_module, hidden_states.dtype))


def swiglu_mlp_weights(hidden_states, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias):
    """The pto_kernels::swiglu_mlp op's body: the weights arrive as tensors, so there is no module to
    key a layout cache on; in nn.Linear layout and the input's dtype (the usual case) nothing is copied."""
    if any(bias is not None for bias in (gate_bias, up_bias, down_bias)):
        raise ValueError("pypto SwiGLU kernel takes bias-free projections")
    weights = (w.detach().to(hidden_states.dtype).contiguous() for w in (gate_weight, up_weight, down_weight))
    return _run_swiglu_mlp(hidden_states, *weights)


# --- entries for serving engines' own layers (vLLM) ---------------------------------------------------


def add_rms_norm(hidden_states, residual, weight, eps: float = 1e-6):
    """The residual sum in torch (fp32, rounded to the input dtype), then the RMSNorm kernel on it."""
    summed = (hidden_states.to(torch.float32) + residual.to(torch.float32)).to(hidden_states.dtype)
    return rms_norm(summed, weight, eps), summed


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """No PyPTO kernel for the activation alone (the MLP kernel fuses it with its matmuls): the fused
    torch path."""
    return fused.silu_and_mul(gate_up)
