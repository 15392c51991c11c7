"""The in-kernel pieces more than one PyPTO kernel is built from: RMSNorm of a row tile, the rotation of a
head's halves, the SwiGLU MLP of a row tile, the check that half a head fills whole blocks, and the
kernel-ready MLP weights kept per module. pypto_ops.py's kernels and the decoder-layer blocks
(pypto_blocks.py, pypto_prologue.py) call them inside their own kernels.
"""

# No `from __future__ import annotations`: pypto reads the kernels' annotations as objects.
import weakref

import torch

from ..tiling.tile_table import TileConfig
from . import pypto_runtime as runtime


def normed_tile(xt, weight, hidden: int, eps: float, dt):
    """Inside a kernel: RMSNorm of an fp32 row tile [rows, hidden] with the [1, hidden] weight, in dtype dt.

    The weight is cast here, inside the caller's row loop: outside it becomes a task of its own (~1 us
    more at decode). Written out: pypto.rms_norm fails on a partial tail tile."""
    pypto = runtime.pypto_module()
    fp32 = pypto.DT_FP32
    w = pypto.cast(weight, fp32)
    mean_square = pypto.mul(pypto.sum(pypto.mul(xt, xt), -1, True), 1.0 / hidden)
    normed = pypto.mul(xt, pypto.rsqrt(pypto.add(mean_square, eps)))
    # like transformers: normalise in fp32, round to the input dtype, then scale by the weight
    rounded = pypto.cast(pypto.cast(normed, dt), fp32)
    return pypto.cast(pypto.mul(rounded, w), dt)


def rotated_halves(x1, x2, cos1, cos2, sin1, sin2):
    """Inside a kernel: one head's halves rotated (rotate_half): x1*cos1 - x2*sin1, x2*cos2 + x1*sin2."""
    pypto = runtime.pypto_module()
    out1 = pypto.sub(pypto.mul(x1, cos1), pypto.mul(x2, sin1))
    out2 = pypto.add(pypto.mul(x2, cos2), pypto.mul(x1, sin2))
    return out1, out2


def check_half_blocks(dim: int, dtype: torch.dtype, what: str) -> None:
    """A head's half must fill whole 32-byte blocks: head_dim a multiple of 32 in bf16, 16 in fp32."""
    step = 64 // dtype.itemsize
    if (dim // 2) * dtype.itemsize % 32:
        raise ValueError(
            f"{what} needs half a head in whole 32-byte blocks: head_dim {dim} in {dtype} is "
            f"{dim // 2 * dtype.itemsize} bytes a half; head_dim {step}, {2 * step}, {3 * step} ... fit"
        )


def swiglu_tile(xt, gate_w, up_w, down_w, dt, out_dt, inter: int, config: TileConfig):
    """Inside a kernel: down(silu(gate(xt)) * up(xt)) of a [rows, hidden] tile in dtype dt, weights in
    nn.Linear layout; the result in out_dt. Sets the cube and vec tile shapes it needs."""
    pypto = runtime.pypto_module()
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


class WeightLayouts:
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
