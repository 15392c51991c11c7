"""PyPTO 0.2 kernels of the decoder-layer blocks, one kernel each: residual add + RMSNorm; o_proj + residual
+ RMSNorm + SiLU MLP + residual (the attention prologue, RMSNorm + q/k/v + MRoPE, is pypto_prologue.py's).

They launch through pypto_runtime.py (the jit, the kernel cache and its stats, the interpreter hand-over) and
are built from pypto_pieces.py's in-kernel RMSNorm and SwiGLU; pypto.py hands their entries to the dispatcher.
"""

# No `from __future__ import annotations`: pypto reads the kernels' annotations as objects.

import torch

from ..tiling import tile_budget
from ..tiling.tile_table import TileConfig, tile_config
from . import pypto_runtime as runtime
from .pypto_pieces import normed_tile, swiglu_tile

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
    pypto = runtime.pypto_module()
    dt, fp32 = runtime.pypto_dtype(dtype), pypto.DT_FP32
    rows_axis = runtime.row_axis(config, rows)
    tile = config.row_tile

    norm_scope = 1 if config.norm_one_task else -1  # -1: pypto partitions as it likes

    @runtime.jit(device_type, config)
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
            pypto.assemble(
                normed_tile(pypto.cast(summed, fp32), weight, hidden, eps, dt), [start, 0], normed_out
            )
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
    rows, device_type = x.shape[0], runtime.device_type_of(x)
    _, config = tile_config("residual_rms_norm", rows, hidden)
    key = runtime.kernel_key("residual_rms_norm", config, rows, hidden, dtype, float(eps), device_type)
    kernel = runtime.cached_kernel(
        key,
        device_type,
        lambda: _build_residual_rms_norm(rows, hidden, dtype, float(eps), config, device_type),
    )
    normed, summed = runtime.new_output(x), runtime.new_output(x)
    with runtime.launching(x):
        kernel(x, r, w, normed, summed)
    return normed.reshape(shape).to(torch.promote_types(dtype, weight.dtype)), summed.reshape(shape)


def _build_mlp_block(rows, hidden, attn_width, inter, dtype, eps, config, device_type):
    pypto = runtime.pypto_module()
    dt, fp32 = runtime.pypto_dtype(dtype), pypto.DT_FP32
    rows_axis = runtime.row_axis(config, rows)
    tile = config.row_tile
    m, proj_k, proj_n, norm_rows = _block_tiles(config)
    if config.static:  # at least two o_proj output tiles: see _split_output_tiles
        proj_n = _split_output_tiles(proj_n, hidden)

    norm_scope = 1 if config.norm_one_task else -1  # -1: pypto partitions as it likes

    @runtime.jit(device_type, config)
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
            normed = normed_tile(pypto.cast(summed, fp32), norm_w, hidden, eps, dt)
            pypto.assemble(normed, [start, 0], normed_buf)
            pypto.set_pass_options(sg_set_scope=-1)
            # the MLP reads the normed rows back from global memory, as the SwiGLU kernel reads its input:
            # cube_l1_reuse then merges the gate/up tiles that share them (198 tiles -> 22 tasks at decode)
            nt = pypto.view(normed_buf, [tile, hidden], [start, 0], valid_shape=[valid, hidden])
            down = swiglu_tile(nt, gate_w, up_w, down_w, dt, dt, inter, config)
            pypto.set_vec_tile_shapes(norm_rows, hidden)
            result = pypto.add(pypto.cast(summed, fp32), pypto.cast(down, fp32))
            pypto.assemble(pypto.cast(result, dt), [start, 0], out)

    return mlp_block_kernel


def _split_output_tiles(n_tiles: list[int], width: int) -> list[int]:
    """n tiles of at most half the output width. pypto 0.2 refuses a static kernel whose matmul writes its
    whole output as one tile that is then assembled into global memory (its PreGraphProcess pass: "A_MUL_B
    output is NOT L0C"); mlp_block's 1-row kernel hit it at hidden 64 and 128, not at 256 and up."""
    half = max(16, width // 2)
    return [min(n, half) for n in n_tiles]


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
    rows, inter, device_type = res.shape[0], gate_w.shape[0], runtime.device_type_of(res)
    _, config = tile_config("mlp_block", rows, hidden)
    tile, attn_width = config.row_tile, attn.shape[1]
    dims = {
        "o_proj": (tile, attn_width, hidden),
        "gate/up": (tile, hidden, inter),
        "down": (tile, inter, hidden),
    }
    tile_budget.check("mlp_block", config, dtype.itemsize, dims)
    key = runtime.kernel_key(
        "mlp_block", config, rows, hidden, attn.shape[1], inter, dtype, float(eps), device_type
    )
    kernel = runtime.cached_kernel(
        key,
        device_type,
        lambda: _build_mlp_block(rows, hidden, attn.shape[1], inter, dtype, float(eps), config, device_type),
    )
    out, normed_buf, projected_buf = runtime.new_output(res), runtime.new_output(res), runtime.new_output(res)
    with runtime.launching(res):
        kernel(res, attn, o_w, norm_w, gate_w, up_w, down_w, out, normed_buf, projected_buf)
    return out.reshape(shape)


# --- a plain projection: the per-op baseline of the cost model's decoder-layer row --------------------


def _build_linear(rows, in_features, out_features, dtype, config, device_type):
    """x [rows, in] @ weight [out, in]^T (nn.Linear layout, no bias) -> [rows, out]. No entry calls it: it
    stands in for a layer's q/k/v and o projections in benchmarks/bench_sim.py's per-op decoder layer."""
    pypto = runtime.pypto_module()
    dt = runtime.pypto_dtype(dtype)
    rows_axis = runtime.row_axis(config, rows)
    tile = config.row_tile
    m, proj_k, proj_n, _ = _block_tiles(config)

    @runtime.jit(device_type, config)
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
