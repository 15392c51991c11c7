"""PyPTO 0.2 kernels (`@pypto.frontend.jit`): RMSNorm, MRoPE with in-kernel section mixing, SwiGLU MLP, and
decoder-layer blocks (residual add + RMSNorm; o_proj + residual + RMSNorm + MLP + residual; RMSNorm + q/k/v
+ MRoPE), one kernel each.

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
import tempfile
import weakref
from collections import OrderedDict
from pathlib import Path

import torch

from . import fused
from .tile_table import TileConfig, tile_config

CACHE_ENV = "PTO_KERNELS_CACHE_DIR"
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
    base = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "pto_kernels")
    version = f"pypto{importlib.metadata.version('pypto')}-torch{torch.__version__}"
    return Path(base, f"calculator-{version}")


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
                ctx = cmake_ctx.CompileContext(src_dir=Path(manager.pkg_lib_dir, "calculator"), tmp_dir=root)
                ctx.cfg_cmd_ext = (
                    f"-DPY3_MOD_TORCH_VERSION={torch_ctx.torch_version}"
                    f" -DPY3_MOD_TORCH_ROOT_PATH={torch_ctx.torch_root_dir}"
                    f" -DPY3_MOD_TORCH_C_GLIBCXX_USE_CXX11_ABI={torch_ctx.torch_c_use_cxx11_abi}"
                )
                ctx.build_job_num = max(1, min(4, os.cpu_count() or 1))
                cmake_ctx.compile(ctx)
    ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    manager.calculator_loaded = True


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


def _jit(device_type: str, config: TileConfig):
    pypto = _pypto()
    options = {"pass_options": config.pass_options()}
    if device_type == "npu":
        return pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.NPU}, **options)
    if device_type == "sim":  # cost model only: a cycle report under TILE_FWK_OUTPUT_DIR, outputs unwritten
        return pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM}, **options)
    if device_type != "cpu":
        raise RuntimeError(f"pypto kernels run on npu (or cpu through the interpreter), not {device_type}")
    use_cpu_interpreter()
    return pypto.frontend.jit(
        runtime_options={"run_mode": pypto.RunMode.SIM},
        verify_options={"enable_pass_verify": True},
        **options,
    )


class KernelCache:
    """Compiled kernels by key (the op first), least recently used dropped past `capacity`.

    Counts per op: `built` (kernels made), `compiles` (times pypto compiled one: pypto 0.2 compiles on
    every SIM/interpreter call), `cache_hits`, `evicted`; `cached` is how many are held now.
    """

    def __init__(self, capacity: int = KERNEL_CACHE_SIZE) -> None:
        self.capacity = capacity
        self._kernels: OrderedDict[tuple, object] = OrderedDict()
        self._counts: dict[str, dict[str, int]] = {}

    def _count(self, op: str) -> dict[str, int]:
        return self._counts.setdefault(op, {"built": 0, "compiles": 0, "cache_hits": 0, "evicted": 0})

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
            self._count(op)["compiles"] += 1
            return compile_once(*args, **kwargs)

        kernel.compile = compile_counted  # the jit wrapper calls self.compile before each run

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


def _row_axis(config: TileConfig, rows: int, name: str = "rows"):
    return rows if config.static else _pypto().frontend.dynamic(name)


def _kernel_key(op: str, config: TileConfig, rows: int, *rest) -> tuple:
    return (op, rows if config.static else "dynamic", config, *rest)


@contextlib.contextmanager
def _quiet_stdout(device_type: str):
    # The SIM/interpreter path prints a cost-model report per call on stdout.
    if device_type != "cpu" or os.environ.get("PTO_KERNELS_VERBOSE"):
        yield
        return
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 1)
        try:
            yield
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


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
    rows, device_type = x.shape[0], x.device.type
    _, config = tile_config("rms_norm", rows, hidden)
    key = _kernel_key("rms_norm", config, rows, hidden, x.dtype, float(eps), device_type)
    kernel = KERNELS.get(key, lambda: _build_rms_norm(rows, hidden, x.dtype, float(eps), config, device_type))
    out = _new_output(x)
    with _quiet_stdout(device_type):
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
    if (dim // 2) * dtype.itemsize % 32:
        raise ValueError(f"{what} needs head_dim/2 rows of whole 32-byte blocks, not {dim} x {dtype}")


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
    rows, device_type = batch * seq, q.device.type
    _, config = tile_config("mrope", rows, dim)
    key = _kernel_key("mrope", config, rows, q_heads, k_heads, dim, q.dtype, cos.dtype, device_type)
    kernel = KERNELS.get(
        key, lambda: _build_mrope(rows, q_heads, k_heads, dim, q.dtype, cos.dtype, config, device_type)
    )
    # [b, h, s, d] -> [b*s, h*d]: no copy when q/k are the transposed [b, s, h, d] projections they are
    q2 = q.transpose(1, 2).contiguous().reshape(rows, q_heads * dim)
    k2 = k.transpose(1, 2).contiguous().reshape(rows, k_heads * dim)
    cos2, sin2 = cos.contiguous().reshape(rows, dim), sin.contiguous().reshape(rows, dim)
    q_out, k_out = _new_output(q2), _new_output(k2)
    with _quiet_stdout(device_type):
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
    device_type = x.device.type
    _, config = tile_config("swiglu_mlp", tokens, hidden)
    key = _kernel_key("swiglu_mlp", config, tokens, hidden, inter, x.dtype, device_type)
    kernel = KERNELS.get(key, lambda: _build_swiglu_mlp(tokens, hidden, inter, x.dtype, config, device_type))
    out = _new_output(x)
    with _quiet_stdout(device_type):
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


# --- decoder-layer blocks ----------------------------------------------------------------------------
# Several of a layer's ops as one kernel each: residual add + RMSNorm; o_proj + residual + RMSNorm + SiLU
# MLP + residual; RMSNorm + q/k/v projections (with their biases) + MRoPE. Tilings: tile_table's
# BLOCK_TILE_TABLE. Rounding follows transformers: each projection's output, the residual sums and the
# normed activations are rounded to the activations' dtype where the model's eager code rounds them, except
# in attention_prologue, whose norm is folded into the q/k/v weights (its normed activations are never
# formed: the scale is applied to the fp32 matmul output, and W * norm_weight is rounded once).
#
# What the cost model taught (pypto 0.2 SIM): every copy from global memory waits ~1,450 cycles however
# small, serially within a task; a task that waits on another starts ~5,000-7,500 cycles after it ends; so
# a block wants few stages and few copies a task. `sg_set_scope` forces a run of vector ops into one task
# (pypto otherwise splits input casts into tasks of their own); a vector intermediate read by several
# tasks merges them into one, so each RoPE head works out what it needs itself; and cube_l1_reuse only
# merges matmul tiles whose left operand is read from global memory, so mlp_block hands its normed rows to
# the MLP through a scratch tensor.


def _block_tiles(config: TileConfig) -> tuple[list[int], list[int], list[int], int]:
    """(cube m, projection cube k, projection cube n, RMSNorm rows per vec tile) of a block's config."""
    m = [config.cube_m, config.cube_m]
    norm_rows = min(config.row_tile, config.norm_rows or config.row_tile)
    return m, list(config.proj_cube_k or config.cube_k), list(config.proj_cube_n or config.cube_n), norm_rows


def _build_residual_rms_norm(rows, hidden, dtype, eps, config, device_type):
    pypto = _pypto()
    dt, fp32 = _dtype(dtype), pypto.DT_FP32
    rows_axis = _row_axis(config, rows)
    tile = config.row_tile

    norm_scope = 1 if config.norm_one_task else -1  # -1: pypto partitions as it likes

    @_jit(device_type, config)
    def residual_rms_norm_kernel(
        x: pypto.Tensor([rows_axis, hidden], dt),
        residual: pypto.Tensor([rows_axis, hidden], dt),
        weight: pypto.Tensor([1, hidden], dt),
        normed_out: pypto.Tensor([rows_axis, hidden], dt),
        summed_out: pypto.Tensor([rows_axis, hidden], dt),
    ):
        pypto.set_vec_tile_shapes(tile, hidden)
        n_rows = x.shape[0]
        for step in pypto.loop((n_rows + tile - 1) // tile):
            start = step * tile
            valid = pypto.min(start + tile, n_rows) - start
            pypto.set_pass_options(sg_set_scope=norm_scope)
            xt = pypto.view(x, [tile, hidden], [start, 0], valid_shape=[valid, hidden])
            rt = pypto.view(residual, [tile, hidden], [start, 0], valid_shape=[valid, hidden])
            summed = pypto.add(rt, xt)  # in dt: rounded, as transformers' `residual + hidden_states`
            pypto.assemble(summed, [start, 0], summed_out)
            pypto.assemble(_normed(pypto.cast(summed, fp32), weight, hidden, eps, dt), [start, 0], normed_out)
        pypto.set_pass_options(sg_set_scope=-1)  # a global option: leave it as found for the next kernel

    return residual_rms_norm_kernel


def _flat_rows(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(dtype).reshape(-1, tensor.shape[-1]).contiguous()


def _linear_weight(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """nn.Linear layout is what matmul(b_trans=True) takes: copied only for a dtype change or strides."""
    return weight.detach().to(dtype).contiguous()


def residual_rms_norm(hidden_states, residual, weight, eps: float = 1e-6):
    """One kernel: the residual sum (rounded to the activations' dtype) and its RMSNorm. (normed, sum)."""
    if hidden_states.shape != residual.shape:
        raise ValueError(
            f"pypto residual_rms_norm: hidden_states {tuple(hidden_states.shape)} and residual"
            f" {tuple(residual.shape)} differ"
        )
    dtype = torch.promote_types(hidden_states.dtype, residual.dtype)
    shape, hidden = hidden_states.shape, hidden_states.shape[-1]
    x, r = _flat_rows(hidden_states, dtype), _flat_rows(residual, dtype)
    w = weight.to(dtype).reshape(1, hidden).contiguous()
    rows, device_type = x.shape[0], x.device.type
    _, config = tile_config("residual_rms_norm", rows, hidden)
    key = _kernel_key("residual_rms_norm", config, rows, hidden, dtype, float(eps), device_type)
    kernel = KERNELS.get(
        key, lambda: _build_residual_rms_norm(rows, hidden, dtype, float(eps), config, device_type)
    )
    normed, summed = _new_output(x), _new_output(x)
    with _quiet_stdout(device_type):
        kernel(x, r, w, normed, summed)
    return normed.reshape(shape).to(torch.promote_types(dtype, weight.dtype)), summed.reshape(shape)


def _build_mlp_block(rows, hidden, attn_width, inter, dtype, eps, config, device_type):
    pypto = _pypto()
    dt, fp32 = _dtype(dtype), pypto.DT_FP32
    rows_axis = _row_axis(config, rows)
    tile = config.row_tile
    m, proj_k, proj_n, norm_rows = _block_tiles(config)

    norm_scope = 1 if config.norm_one_task else -1  # -1: pypto partitions as it likes

    @_jit(device_type, config)
    def mlp_block_kernel(
        residual: pypto.Tensor([rows_axis, hidden], dt),
        attn: pypto.Tensor([rows_axis, attn_width], dt),
        o_w: pypto.Tensor([hidden, attn_width], dt),
        norm_w: pypto.Tensor([1, hidden], dt),
        gate_w: pypto.Tensor([inter, hidden], dt),
        up_w: pypto.Tensor([inter, hidden], dt),
        down_w: pypto.Tensor([hidden, inter], dt),
        out: pypto.Tensor([rows_axis, hidden], dt),
        normed_buf: pypto.Tensor([rows_axis, hidden], dt),
        projected_buf: pypto.Tensor([rows_axis, hidden], dt),
    ):
        n_rows = residual.shape[0]
        for step in pypto.loop((n_rows + tile - 1) // tile):
            start = step * tile
            valid = pypto.min(start + tile, n_rows) - start
            at = pypto.view(attn, [tile, attn_width], [start, 0], valid_shape=[valid, attn_width])
            pypto.set_cube_tile_shapes(m, proj_k, proj_n)
            projected = pypto.matmul(at, o_w, dt, b_trans=True)  # o_proj, rounded like F.linear's output
            pypto.set_vec_tile_shapes(norm_rows, hidden)
            pypto.assemble(projected, [start, 0], projected_buf)
            pypto.set_pass_options(sg_set_scope=norm_scope)
            rt = pypto.view(residual, [tile, hidden], [start, 0], valid_shape=[valid, hidden])
            ot = pypto.view(projected_buf, [tile, hidden], [start, 0], valid_shape=[valid, hidden])
            summed = pypto.cast(pypto.add(pypto.cast(rt, fp32), pypto.cast(ot, fp32)), dt)
            normed = _normed(pypto.cast(summed, fp32), norm_w, hidden, eps, dt)
            pypto.assemble(normed, [start, 0], normed_buf)
            pypto.set_pass_options(sg_set_scope=-1)
            # the MLP reads the normed rows back from global memory, as the SwiGLU kernel reads its input:
            # cube_l1_reuse then merges the gate/up tiles that share them (172 tasks -> about 22)
            nt = pypto.view(normed_buf, [tile, hidden], [start, 0], valid_shape=[valid, hidden])
            down = _swiglu(nt, gate_w, up_w, down_w, dt, dt, inter, config)
            pypto.set_vec_tile_shapes(norm_rows, hidden)
            result = pypto.add(pypto.cast(summed, fp32), pypto.cast(down, fp32))
            pypto.assemble(pypto.cast(result, dt), [start, 0], out)

    return mlp_block_kernel


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
    """One kernel: o_proj, the residual add, the post-attention RMSNorm, the SiLU MLP and its residual add.
    Bias-free projections only (Qwen2.5-VL's o_proj and MLP have none): a bias raises ValueError."""
    if any(b is not None for b in (o_bias, gate_bias, up_bias, down_bias)):
        raise ValueError("pypto mlp_block kernel takes bias-free o_proj and MLP projections")
    dtype = residual.dtype
    shape, hidden = residual.shape, residual.shape[-1]
    attn = _flat_rows(attn_output, dtype)
    res = _flat_rows(residual, dtype)
    if attn.shape[0] != res.shape[0] or tuple(o_weight.shape) != (hidden, attn.shape[1]):
        raise ValueError(
            f"pypto mlp_block: attn_output {tuple(attn_output.shape)}, o_weight {tuple(o_weight.shape)}"
            f" do not fit residual {tuple(residual.shape)}"
        )
    gate_w, up_w, down_w, o_w = (
        _linear_weight(w, dtype) for w in (gate_weight, up_weight, down_weight, o_weight)
    )
    norm_w = norm_weight.to(dtype).reshape(1, hidden).contiguous()
    rows, inter, device_type = res.shape[0], gate_w.shape[0], res.device.type
    _, config = tile_config("mlp_block", rows, hidden)
    key = _kernel_key("mlp_block", config, rows, hidden, attn.shape[1], inter, dtype, float(eps), device_type)
    kernel = KERNELS.get(
        key,
        lambda: _build_mlp_block(rows, hidden, attn.shape[1], inter, dtype, float(eps), config, device_type),
    )
    out, normed_buf, projected_buf = _new_output(res), _new_output(res), _new_output(res)
    with _quiet_stdout(device_type):
        kernel(res, attn, o_w, norm_w, gate_w, up_w, down_w, out, normed_buf, projected_buf)
    return out.reshape(shape)


def _build_attention_prologue(
    rows, hidden, q_heads, k_heads, dim, dtype, table_dtype, eps, config, device_type
):
    """Rows are tokens (batch x positions): x [rows, hidden]; weights in nn.Linear layout with the input
    RMSNorm's weight folded in (W * norm_weight, column by column: `_norm_folded`), biases [1, n]; cos/sin
    [rows, dim] section-mixed; q/k/v out [rows, heads*dim] (heads side by side).

    The norm rides in the projections: RMSNorm(x) @ W^T = rsqrt(mean(x^2) + eps) * (x @ (W * g)^T), so the
    matmuls read x straight from global memory (no vector stage before them) while one vector task
    computes each row's scale beside them; the epilogue applies the scale and the bias, rounds as
    F.linear's output, and rotates q and k (RoPE), one task per head. As the MRoPE kernel, each head reads
    its cos/sin rows straight from the inputs."""
    pypto = _pypto()
    dt, tdt, fp32 = _dtype(dtype), _dtype(table_dtype), pypto.DT_FP32
    rows_axis = _row_axis(config, rows)
    tile, half = config.row_tile, dim // 2
    q_width, kv_width = q_heads * dim, k_heads * dim
    m, proj_k, proj_n, norm_rows = _block_tiles(config)

    norm_scope = 1 if config.norm_one_task else -1  # -1: pypto partitions as it likes

    @_jit(device_type, config)
    def attention_prologue_kernel(
        x: pypto.Tensor([rows_axis, hidden], dt),
        q_w: pypto.Tensor([q_width, hidden], dt),
        q_b: pypto.Tensor([1, q_width], dt),
        k_w: pypto.Tensor([kv_width, hidden], dt),
        k_b: pypto.Tensor([1, kv_width], dt),
        v_w: pypto.Tensor([kv_width, hidden], dt),
        v_b: pypto.Tensor([1, kv_width], dt),
        cos: pypto.Tensor([rows_axis, dim], tdt),
        sin: pypto.Tensor([rows_axis, dim], tdt),
        q_out: pypto.Tensor([rows_axis, q_width], dt),
        k_out: pypto.Tensor([rows_axis, kv_width], dt),
        v_out: pypto.Tensor([rows_axis, kv_width], dt),
    ):
        n_rows = x.shape[0]
        for step in pypto.loop((n_rows + tile - 1) // tile):
            start = step * tile
            valid = pypto.min(start + tile, n_rows) - start
            xt = pypto.view(x, [tile, hidden], [start, 0], valid_shape=[valid, hidden])
            pypto.set_cube_tile_shapes(m, proj_k, proj_n)
            q = pypto.matmul(xt, q_w, fp32, b_trans=True)
            k = pypto.matmul(xt, k_w, fp32, b_trans=True)
            v = pypto.matmul(xt, v_w, fp32, b_trans=True)
            # each epilogue task works out its rows' RMSNorm scale from x itself: a scale shared between
            # tasks would make them one task (pypto merges the consumers of a vector intermediate)
            pypto.set_vec_tile_shapes(norm_rows, hidden)
            pypto.set_pass_options(sg_set_scope=norm_scope)
            scale = _rms_scale(xt, hidden, eps)
            pypto.set_vec_tile_shapes(tile, dim)
            pypto.assemble(_biased(pypto.mul(v, scale), v_b, dt), [start, 0], v_out)
            for head in range(q_heads + k_heads):
                if head < q_heads:
                    src, bias, dst, col = q, q_b, q_out, head * dim
                else:
                    src, bias, dst, col = k, k_b, k_out, (head - q_heads) * dim
                pypto.set_pass_options(sg_set_scope=head + 2)
                pypto.set_vec_tile_shapes(norm_rows, hidden)
                scale = _rms_scale(xt, hidden, eps)
                pypto.set_vec_tile_shapes(tile, dim)
                out1, out2 = _rope_epilogue(src, scale, bias, col, cos, sin, start, tile, valid, dim, dt)
                pypto.assemble(out1, [start, col], dst)
                pypto.assemble(out2, [start, col + half], dst)
        pypto.set_pass_options(sg_set_scope=-1)  # a global option: leave it as found for the next kernel

    return attention_prologue_kernel


def _rms_scale(xt, hidden: int, eps: float):
    """Inside a kernel: rsqrt(mean(x^2) + eps) of a [rows, hidden] tile, [rows, 1] in fp32."""
    pypto = _pypto()
    x32 = pypto.cast(xt, pypto.DT_FP32)
    return pypto.rsqrt(pypto.add(pypto.mul(pypto.sum(pypto.mul(x32, x32), -1, True), 1.0 / hidden), eps))


def _biased(projected, bias, dt):
    """Inside a kernel: an fp32 matmul output plus its [1, n] bias, rounded to dt (F.linear's output)."""
    pypto = _pypto()
    return pypto.cast(pypto.add(projected, pypto.cast(bias, pypto.DT_FP32)), dt)


def _rope_epilogue(projected, scale, bias, col, cos, sin, start, tile, valid, dim, dt):
    """Inside a kernel: one head of an fp32 q or k projection tile (its columns col .. col + dim), times the
    rows' RMSNorm scale, biased and rounded as F.linear's output, then rotated with the mixed tables' rows;
    the two output halves in dt.

    One copy each of the head, its bias, cos and sin (whole head_dim rows): the halves are views of those.
    """
    pypto = _pypto()
    fp32, half = pypto.DT_FP32, dim // 2
    head = pypto.view(projected, [tile, dim], [0, col], valid_shape=[valid, dim])
    x = pypto.cast(_biased(pypto.mul(head, scale), pypto.view(bias, [1, dim], [0, col]), dt), fp32)
    cos_t = pypto.cast(pypto.view(cos, [tile, dim], [start, 0], valid_shape=[valid, dim]), fp32)
    sin_t = pypto.cast(pypto.view(sin, [tile, dim], [start, 0], valid_shape=[valid, dim]), fp32)
    halves = [
        pypto.view(t, [tile, half], [0, c], valid_shape=[valid, half])
        for t in (x, cos_t, sin_t)
        for c in (0, half)
    ]
    x1, x2, cos1, cos2, sin1, sin2 = halves
    out1, out2 = _rotated(x1, x2, cos1, cos2, sin1, sin2)
    return pypto.cast(out1, dt), pypto.cast(out2, dt)


class _NormFolded:
    """Projection weights with an RMSNorm weight folded in, W * norm_weight column by column (in the
    activations' dtype), per weight tensor; made again only when the weight or the norm weight changes
    (data pointer, version counter, shape, dtype). Holds one such copy per projection while the weight
    lives: for q/k/v at GutenOCR-3B width 2048 x 2560 bf16 (10 MB) a layer.

    Keyed by the weight's id, checked against a weak reference to it (a weak-key dictionary would compare
    tensors with ==)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple] = {}
        self.builds = 0

    def get(self, weight: torch.Tensor, norm_weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        signature = _WeightLayouts._signature((weight, norm_weight), dtype)
        entry = self._by_id.get(id(weight))
        if entry is not None and entry[0]() is weight and entry[1] == signature:
            return entry[2]
        folded = (
            (weight.detach().float() * norm_weight.detach().float().reshape(1, -1)).to(dtype).contiguous()
        )
        key = id(weight)

        def forget(ref, key=key):
            if self._by_id.get(key, (None,))[0] is ref:
                del self._by_id[key]

        self._by_id[key] = (weakref.ref(weight, forget), signature, folded)
        self.builds += 1
        return folded


NORM_FOLDED = _NormFolded()


def _prologue(hidden_states, norm_weight, eps, projections, cos, sin, head_dim):
    """attention_prologue(_mixed)'s body with cos/sin section-mixed ([b, s, d] or [b, 1, s, d])."""
    if hidden_states.dim() != 3:
        raise ValueError(
            f"pypto attention_prologue takes hidden_states [b, s, hidden], not {tuple(hidden_states.shape)}"
        )
    batch, seq, hidden = hidden_states.shape
    dtype, rows = hidden_states.dtype, batch * seq
    (q_w, q_b), (k_w, k_b), (v_w, v_b) = projections
    q_width, kv_width = q_w.shape[0], k_w.shape[0]
    if q_width % head_dim or kv_width % head_dim or v_w.shape[0] != kv_width:
        raise ValueError(
            f"pypto attention_prologue: q/k/v weights {tuple(q_w.shape)} {tuple(k_w.shape)} {tuple(v_w.shape)}"
            f" are not whole heads of {head_dim}"
        )
    if cos.numel() != rows * head_dim or cos.shape != sin.shape or cos.shape[-1] != head_dim:
        raise ValueError(
            f"pypto attention_prologue: cos {tuple(cos.shape)} does not fit {rows} rows of {head_dim}"
        )
    _check_half_blocks(head_dim, dtype, "pypto attention_prologue kernel")
    weights, biases = [], []
    for w, b in projections:
        weights.append(NORM_FOLDED.get(w, norm_weight, dtype))
        # a bias-free projection adds zeros (Qwen2.5-VL's q/k/v have biases)
        biases.append(
            hidden_states.new_zeros(1, w.shape[0]) if b is None else b.to(dtype).reshape(1, -1).contiguous()
        )
    x = hidden_states.reshape(rows, hidden).contiguous()
    cos2, sin2 = cos.contiguous().reshape(rows, head_dim), sin.contiguous().reshape(rows, head_dim)
    q_heads, k_heads, device_type = q_width // head_dim, kv_width // head_dim, x.device.type
    _, config = tile_config("attention_prologue", rows, hidden)
    key = _kernel_key(
        "attention_prologue",
        config,
        rows,
        hidden,
        q_heads,
        k_heads,
        head_dim,
        dtype,
        cos.dtype,
        float(eps),
        device_type,
    )
    kernel = KERNELS.get(
        key,
        lambda: _build_attention_prologue(
            rows, hidden, q_heads, k_heads, head_dim, dtype, cos.dtype, float(eps), config, device_type
        ),
    )
    q_out = _new_output(x.new_empty(rows, q_width))
    k_out, v_out = (_new_output(x.new_empty(rows, kv_width)) for _ in range(2))
    with _quiet_stdout(device_type):
        kernel(
            x,
            weights[0],
            biases[0],
            weights[1],
            biases[1],
            weights[2],
            biases[2],
            cos2,
            sin2,
            q_out,
            k_out,
            v_out,
        )
    return tuple(t.reshape(batch, seq, -1, head_dim).transpose(1, 2) for t in (q_out, k_out, v_out))


def attention_prologue(
    hidden_states,
    norm_weight,
    eps,
    q_weight,
    q_bias,
    k_weight,
    k_bias,
    v_weight,
    v_bias,
    cos,
    sin,
    mrope_section,
    head_dim,
):
    """One kernel: the input RMSNorm, the q/k/v projections with their biases and MRoPE on q and k.

    cos/sin [3, b, s, head_dim] are section-mixed outside the kernel, in torch, once per forward (the
    fused backend's table cache, shared by every layer), as the MRoPE entry does."""
    sections = tuple(int(s) for s in mrope_section)
    expected = (3, hidden_states.shape[0], hidden_states.shape[1], head_dim)
    if sum(sections) * 2 != head_dim or tuple(cos.shape) != expected or cos.shape != sin.shape:
        raise ValueError(
            f"mrope_section {list(sections)} / cos {tuple(cos.shape)} do not fit head_dim {head_dim}"
            f" and hidden_states {tuple(hidden_states.shape)}"
        )
    mixed_cos, mixed_sin, _ = fused.MIXED_TABLES.get(cos, sin, sections, 1)
    projections = ((q_weight, q_bias), (k_weight, k_bias), (v_weight, v_bias))
    return _prologue(hidden_states, norm_weight, eps, projections, mixed_cos, mixed_sin, head_dim)


def attention_prologue_mixed(
    hidden_states, norm_weight, eps, q_weight, q_bias, k_weight, k_bias, v_weight, v_bias, cos, sin, head_dim
):
    """attention_prologue with cos/sin already section-mixed, [b, s, head_dim]: one kernel."""
    projections = ((q_weight, q_bias), (k_weight, k_bias), (v_weight, v_bias))
    return _prologue(hidden_states, norm_weight, eps, projections, cos, sin, head_dim)


# --- a plain projection: the per-op baseline of the cost model's decoder-layer row --------------------


def _build_linear(rows, in_features, out_features, dtype, config, device_type):
    """x [rows, in] @ weight [out, in]^T (nn.Linear layout, no bias) -> [rows, out]. No entry calls it: it
    stands in for a layer's q/k/v and o projections in benchmarks/bench_sim.py's per-op decoder layer."""
    pypto = _pypto()
    dt = _dtype(dtype)
    rows_axis = _row_axis(config, rows)
    tile = config.row_tile
    m, proj_k, proj_n, _ = _block_tiles(config)

    @_jit(device_type, config)
    def linear_kernel(
        x: pypto.Tensor([rows_axis, in_features], dt),
        weight: pypto.Tensor([out_features, in_features], dt),
        out: pypto.Tensor([rows_axis, out_features], dt),
    ):
        n_rows = x.shape[0]
        for step in pypto.loop((n_rows + tile - 1) // tile):
            start = step * tile
            valid = pypto.min(start + tile, n_rows) - start
            xt = pypto.view(x, [tile, in_features], [start, 0], valid_shape=[valid, in_features])
            pypto.set_cube_tile_shapes(m, proj_k, proj_n)
            pypto.assemble(pypto.matmul(xt, weight, dt, b_trans=True), [start, 0], out)

    return linear_kernel
