"""PyPTO 0.2 kernels (`@pypto.frontend.jit`) of the reference system's three ops: RMSNorm, MRoPE with in-kernel
section mixing, SwiGLU MLP; and the serving engines' forms of them. pypto.py hands them to the dispatcher;
the runtime they launch through is pypto_runtime.py, the in-kernel pieces they share with the decoder-layer
blocks pypto_pieces.py.

Each kernel loops over its row axis (tokens, or batch x positions for MRoPE) in tiles and that axis is
dynamic, so one compiled kernel serves every prompt length and batch size of a given width and dtype.
Tilings come from tile_table.TILE_TABLE, one per shape class (decode, prefill). MLP weights are used in
nn.Linear layout (matmul with b_trans=True) and prepared once per module; they are prepared again only when
a weight tensor changes (data pointer, version counter, shape or dtype).
"""

# No `from __future__ import annotations`: pypto reads the kernels' annotations as objects.
import torch

from ..tiling import tile_budget
from ..tiling.tile_table import TileConfig, tile_config
from . import fused
from . import pypto_runtime as runtime
from .pypto_pieces import WeightLayouts, check_half_blocks, normed_tile, rotated_halves, swiglu_tile

# --- RMSNorm -----------------------------------------------------------------------------------------


def _build_rms_norm(
    rows: int, hidden: int, dtype: torch.dtype, eps: float, config: TileConfig, device_type: str
):
    pypto = runtime.pypto_module()
    dt, fp32 = runtime.pypto_dtype(dtype), pypto.DT_FP32
    rows_axis = runtime.row_axis(config, rows)
    tile = config.row_tile

    @runtime.jit(device_type, config)
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
            pypto.assemble(normed_tile(xt, weight, hidden, eps, dt), [start, 0], out)

    return rms_norm_kernel


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    shape, hidden = hidden_states.shape, hidden_states.shape[-1]
    out_dtype = torch.promote_types(hidden_states.dtype, weight.dtype)
    x = hidden_states.reshape(-1, hidden).contiguous()
    w = weight.to(x.dtype).reshape(1, hidden).contiguous()
    rows, device_type = x.shape[0], runtime.device_type_of(x)
    _, config = tile_config("rms_norm", rows, hidden)
    key = runtime.kernel_key("rms_norm", config, rows, hidden, x.dtype, float(eps), device_type)
    kernel = runtime.cached_kernel(
        key, device_type, lambda: _build_rms_norm(rows, hidden, x.dtype, float(eps), config, device_type)
    )
    out = runtime.new_output(x)
    with runtime.launching(x):
        kernel(x, w, out)
    return out.reshape(shape).to(out_dtype)


# --- MRoPE -------------------------------------------------------------------------------------------


def _build_mrope(rows, q_heads, k_heads, dim, dtype, table_dtype, config, device_type):
    """Rows are (batch, position) pairs: q [rows, q_heads*dim], k [rows, k_heads*dim] (heads side by side),
    cos/sin [rows, dim], section-mixed.

    Each head reads its cos/sin halves straight from the inputs rather than sharing a computed tile: in
    the cost model a shared intermediate becomes a dependent task, ~3 us at decode."""
    pypto = runtime.pypto_module()
    dt, tdt, fp32 = runtime.pypto_dtype(dtype), runtime.pypto_dtype(table_dtype), pypto.DT_FP32
    rows_axis = runtime.row_axis(config, rows)
    tile, half = config.row_tile, dim // 2

    @runtime.jit(device_type, config)
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
                out1, out2 = rotated_halves(x1, x2, cos1, cos2, sin1, sin2)
                pypto.assemble(pypto.cast(out1, dt), [start, col], dst)
                pypto.assemble(pypto.cast(out2, dt), [start, col + half], dst)

    return mrope_kernel


def _table_halves(cos, sin, start, tile, valid, half):
    """Inside a kernel: (cos1, cos2, sin1, sin2), the halves of a row tile of the mixed tables, in fp32."""
    pypto = runtime.pypto_module()
    return tuple(
        pypto.cast(pypto.view(table, [tile, half], [start, col], valid_shape=[valid, half]), pypto.DT_FP32)
        for table, col in ((cos, 0), (cos, half), (sin, 0), (sin, half))
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
    check_half_blocks(dim, q.dtype, "pypto MRoPE kernel")
    rows, device_type = batch * seq, runtime.device_type_of(q)
    _, config = tile_config("mrope", rows, dim)
    key = runtime.kernel_key("mrope", config, rows, q_heads, k_heads, dim, q.dtype, cos.dtype, device_type)
    kernel = runtime.cached_kernel(
        key,
        device_type,
        lambda: _build_mrope(rows, q_heads, k_heads, dim, q.dtype, cos.dtype, config, device_type),
    )
    # [b, h, s, d] -> [b*s, h*d]: no copy when q/k are the transposed [b, s, h, d] projections they are
    q2 = q.transpose(1, 2).contiguous().reshape(rows, q_heads * dim)
    k2 = k.transpose(1, 2).contiguous().reshape(rows, k_heads * dim)
    cos2, sin2 = cos.contiguous().reshape(rows, dim), sin.contiguous().reshape(rows, dim)
    q_out, k_out = runtime.new_output(q2), runtime.new_output(k2)
    with runtime.launching(q2):
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
    pypto = runtime.pypto_module()
    dt = runtime.pypto_dtype(dtype)
    rows_axis = runtime.row_axis(config, tokens)
    tile = config.row_tile

    @runtime.jit(device_type, config)
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
            pypto.assemble(swiglu_tile(xt, gate_w, up_w, down_w, dt, dt, inter, config), [start, 0], out)

    return swiglu_mlp_kernel


WEIGHT_LAYOUTS = WeightLayouts()


def _run_swiglu_mlp(hidden_states: torch.Tensor, gate_w, up_w, down_w) -> torch.Tensor:
    shape, hidden = hidden_states.shape, hidden_states.shape[-1]
    x = hidden_states.reshape(-1, hidden).contiguous()
    tokens, inter = x.shape[0], gate_w.shape[0]
    device_type = runtime.device_type_of(x)
    _, config = tile_config("swiglu_mlp", tokens, hidden)
    tile = config.row_tile
    dims = {"gate/up": (tile, hidden, inter), "down": (tile, inter, hidden)}
    tile_budget.check("swiglu_mlp", config, x.dtype.itemsize, dims)
    key = runtime.kernel_key("swiglu_mlp", config, tokens, hidden, inter, x.dtype, device_type)
    kernel = runtime.cached_kernel(
        key, device_type, lambda: _build_swiglu_mlp(tokens, hidden, inter, x.dtype, config, device_type)
    )
    out = runtime.new_output(x)
    with runtime.launching(x):
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
