"""PyPTO 0.2 kernels (`@pypto.frontend.jit`): RMSNorm, MRoPE with in-kernel section mixing, SwiGLU MLP.

On an Ascend NPU the kernels run in PyPTO's NPU mode. On the CPU, PyPTO's SIM mode only estimates cycles,
so CPU tensors go through PyPTO's verify interpreter instead (slow: for correctness checks, never for
generation); see `use_cpu_interpreter`.

Compiled kernels are cached by (shape, dtype, parameters, device type) and never rebuilt per call. MLP
weights are used in nn.Linear layout (matmul with b_trans=True) and prepared once per module; they are
prepared again only when a weight tensor changes (data pointer, version counter, shape or dtype).
"""

# No `from __future__ import annotations`: pypto reads the kernels' annotations as objects.
import contextlib
import ctypes
import importlib
import importlib.metadata
import os
import tempfile
import weakref
from pathlib import Path

import torch

CACHE_ENV = "PTO_KERNELS_CACHE_DIR"
_TORCH_TO_PYPTO = {torch.float32: "DT_FP32", torch.float16: "DT_FP16", torch.bfloat16: "DT_BF16"}

_kernels: dict[tuple, object] = {}
kernel_builds = 0  # kernels compiled in this process (a test checks that repeat calls add none)
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


def _jit(device_type: str):
    pypto = _pypto()
    if device_type == "npu":
        return pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.NPU})
    if device_type == "sim":  # cost model only: a cycle report under TILE_FWK_OUTPUT_DIR, outputs unwritten
        return pypto.frontend.jit(runtime_options={"run_mode": pypto.RunMode.SIM})
    if device_type != "cpu":
        raise RuntimeError(f"pypto kernels run on npu (or cpu through the interpreter), not {device_type}")
    use_cpu_interpreter()
    return pypto.frontend.jit(
        runtime_options={"run_mode": pypto.RunMode.SIM}, verify_options={"enable_pass_verify": True}
    )


def _cached(key: tuple, build):
    kernel = _kernels.get(key)
    if kernel is None:
        global kernel_builds
        kernel = build()
        _kernels[key] = kernel
        kernel_builds += 1
    return kernel


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


def _build_rms_norm(rows: int, hidden: int, dtype: torch.dtype, eps: float, device_type: str):
    pypto = _pypto()
    dt = _dtype(dtype)
    fp32 = pypto.DT_FP32
    row_tile = min(rows, 8)

    @_jit(device_type)
    def rms_norm_kernel(
        x: pypto.Tensor((rows, hidden), dt),
        weight: pypto.Tensor((1, hidden), dt),
        out: pypto.Tensor((rows, hidden), dt),
    ):
        pypto.set_vec_tile_shapes(row_tile, hidden)
        normed = pypto.rms_norm(pypto.cast(x, fp32), None, eps)
        # like transformers: normalise in fp32, round to the input dtype, then scale by the weight
        rounded = pypto.cast(pypto.cast(normed, dt), fp32)
        out[:] = pypto.cast(pypto.mul(rounded, pypto.cast(weight, fp32)), dt)

    return rms_norm_kernel


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    shape, hidden = hidden_states.shape, hidden_states.shape[-1]
    out_dtype = torch.promote_types(hidden_states.dtype, weight.dtype)
    x = hidden_states.reshape(-1, hidden).contiguous()
    w = weight.to(x.dtype).reshape(1, hidden).contiguous()
    device_type = x.device.type
    key = ("rms_norm", x.shape[0], hidden, x.dtype, float(eps), device_type)
    kernel = _cached(key, lambda: _build_rms_norm(x.shape[0], hidden, x.dtype, float(eps), device_type))
    out = _new_output(x)
    with _quiet_stdout(device_type):
        kernel(x, w, out)
    return out.reshape(shape).to(out_dtype)


# --- MRoPE -------------------------------------------------------------------------------------------


def _build_mrope(batch, q_heads, k_heads, seq, dim, dtype, table_dtype, sections, mixed, device_type):
    """q/k flattened to [b*h*s, d]; cos/sin [3*b*s, d] (unmixed, mixed in-kernel) or [b*s, d] (mixed)."""
    pypto = _pypto()
    dt, tdt, fp32 = _dtype(dtype), _dtype(table_dtype), pypto.DT_FP32
    half = dim // 2
    table_rows = batch * seq if mixed else 3 * batch * seq
    # (table, column offset, width) of each chunk of the doubled section list: chunk i comes from table i % 3
    chunk_rows, chunk_cols, chunk_widths, offset = [], [], [], 0
    for i, width in enumerate(list(sections) * 2):
        chunk_rows.append((i % 3) * batch * seq)
        chunk_cols.append(offset)
        chunk_widths.append(width)
        offset += width
    n_chunks = len(chunk_widths)

    @_jit(device_type)
    def mrope_kernel(
        q: pypto.Tensor((batch * q_heads * seq, dim), dt),
        k: pypto.Tensor((batch * k_heads * seq, dim), dt),
        cos: pypto.Tensor((table_rows, dim), tdt),
        sin: pypto.Tensor((table_rows, dim), tdt),
        q_out: pypto.Tensor((batch * q_heads * seq, dim), dt),
        k_out: pypto.Tensor((batch * k_heads * seq, dim), dt),
    ):
        pypto.set_vec_tile_shapes(min(seq, 16), dim)
        for b in range(batch):
            if mixed:
                cos_b = pypto.cast(pypto.view(cos, [seq, dim], [b * seq, 0]), fp32)
                sin_b = pypto.cast(pypto.view(sin, [seq, dim], [b * seq, 0]), fp32)
            else:
                # section mixing in-kernel (no comprehensions: the pypto parser does not scope them)
                cos_parts = []
                sin_parts = []
                for c in range(n_chunks):
                    start, width = [chunk_rows[c] + b * seq, chunk_cols[c]], chunk_widths[c]
                    cos_parts.append(pypto.view(cos, [seq, width], start))
                    sin_parts.append(pypto.view(sin, [seq, width], start))
                cos_b = pypto.cast(pypto.concat(cos_parts, 1), fp32)
                sin_b = pypto.cast(pypto.concat(sin_parts, 1), fp32)
            # rotate_half(x) * sin == concat(x2, x1) * concat(-sin1, sin2)
            signed_sin = pypto.concat(
                [
                    pypto.neg(pypto.view(sin_b, [seq, half], [0, 0])),
                    pypto.view(sin_b, [seq, half], [0, half]),
                ],
                1,
            )
            for h in range(q_heads):
                row = (b * q_heads + h) * seq
                x = pypto.cast(pypto.view(q, [seq, dim], [row, 0]), fp32)
                swapped = pypto.concat(
                    [pypto.view(x, [seq, half], [0, half]), pypto.view(x, [seq, half], [0, 0])], 1
                )
                q_out[row : row + seq, :] = pypto.cast(
                    pypto.add(pypto.mul(x, cos_b), pypto.mul(swapped, signed_sin)), dt
                )
            for h in range(k_heads):
                row = (b * k_heads + h) * seq
                x = pypto.cast(pypto.view(k, [seq, dim], [row, 0]), fp32)
                swapped = pypto.concat(
                    [pypto.view(x, [seq, half], [0, half]), pypto.view(x, [seq, half], [0, 0])], 1
                )
                k_out[row : row + seq, :] = pypto.cast(
                    pypto.add(pypto.mul(x, cos_b), pypto.mul(swapped, signed_sin)), dt
                )

    return mrope_kernel


def _rotary(q, k, cos, sin, sections, unsqueeze_dim, mixed):
    if unsqueeze_dim != 1 or q.dim() != 4:
        raise ValueError("pypto MRoPE kernel takes q/k as [b, heads, s, d] with unsqueeze_dim=1")
    batch, q_heads, seq, dim = q.shape
    k_heads = k.shape[1]
    if q.dtype != k.dtype:
        raise TypeError(f"pypto MRoPE kernel needs q and k of one dtype, got {q.dtype} and {k.dtype}")
    device_type = q.device.type
    key = ("mrope", batch, q_heads, k_heads, seq, dim, q.dtype, cos.dtype, sections, mixed, device_type)
    kernel = _cached(
        key,
        lambda: _build_mrope(
            batch, q_heads, k_heads, seq, dim, q.dtype, cos.dtype, sections, mixed, device_type
        ),
    )
    q2, k2 = q.contiguous().reshape(-1, dim), k.contiguous().reshape(-1, dim)
    cos2, sin2 = cos.contiguous().reshape(-1, dim), sin.contiguous().reshape(-1, dim)
    q_out, k_out = _new_output(q2), _new_output(k2)
    with _quiet_stdout(device_type):
        kernel(q2, k2, cos2, sin2, q_out, k_out)
    return q_out.reshape(q.shape), k_out.reshape(k.shape)


def mrope(q, k, cos, sin, mrope_section, unsqueeze_dim: int = 1):
    sections = tuple(int(s) for s in mrope_section)
    if sum(sections) * 2 != q.shape[-1] or cos.shape[0] != 3:
        raise ValueError(
            f"mrope_section {list(sections)} does not fit head_dim {q.shape[-1]} / cos {tuple(cos.shape)}"
        )
    return _rotary(q, k, cos, sin, sections, unsqueeze_dim, mixed=False)


def mrope_mixed(q, k, cos, sin, unsqueeze_dim: int = 1):
    return _rotary(q, k, cos, sin, (), unsqueeze_dim, mixed=True)


# --- SwiGLU MLP --------------------------------------------------------------------------------------


def _build_swiglu_mlp(tokens, hidden, inter, dtype, device_type):
    pypto = _pypto()
    dt, fp32 = _dtype(dtype), pypto.DT_FP32
    m_tile = 16 if tokens <= 16 else 32
    col_tile = min(inter, 512)

    @_jit(device_type)
    def swiglu_mlp_kernel(
        x: pypto.Tensor((tokens, hidden), dt),
        gate_w: pypto.Tensor((inter, hidden), dt),
        up_w: pypto.Tensor((inter, hidden), dt),
        down_w: pypto.Tensor((hidden, inter), dt),
        out: pypto.Tensor((tokens, hidden), dt),
    ):
        pypto.set_cube_tile_shapes([m_tile, m_tile], [64, 256], [64, 256])
        gate = pypto.matmul(x, gate_w, fp32, b_trans=True)
        up = pypto.matmul(x, up_w, fp32, b_trans=True)
        pypto.set_vec_tile_shapes(min(tokens, 16), col_tile)
        act = pypto.cast(pypto.mul(pypto.mul(gate, pypto.sigmoid(gate)), up), dt)
        pypto.set_cube_tile_shapes([m_tile, m_tile], [64, 256], [64, 256])
        out[:] = pypto.matmul(act, down_w, dt, b_trans=True)

    return swiglu_mlp_kernel


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


def swiglu_mlp(mlp_module: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    act = mlp_module.act_fn
    if not (isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"):
        raise ValueError(f"pypto SwiGLU kernel computes SiLU, the module's act_fn is {type(act).__name__}")
    if any(getattr(mlp_module, p).bias is not None for p in ("gate_proj", "up_proj", "down_proj")):
        raise ValueError("pypto SwiGLU kernel takes bias-free projections")
    shape, hidden = hidden_states.shape, hidden_states.shape[-1]
    x = hidden_states.reshape(-1, hidden).contiguous()
    gate_w, up_w, down_w = WEIGHT_LAYOUTS.get(mlp_module, x.dtype)
    tokens, inter = x.shape[0], gate_w.shape[0]
    device_type = x.device.type
    key = ("swiglu_mlp", tokens, hidden, inter, x.dtype, device_type)
    kernel = _cached(key, lambda: _build_swiglu_mlp(tokens, hidden, inter, x.dtype, device_type))
    out = _new_output(x)
    with _quiet_stdout(device_type):
        kernel(x, gate_w, up_w, down_w, out)
    return out.reshape(shape)
