"""Run two small PyPTO kernels that take a value from an int32 tensor inside the kernel (`t[0, 0]`), on the
CPU verify interpreter; save their outputs.

Invoked by test_kernels_pypto_tensor_values.py in a subprocess (a g++ failure inside pypto exits the process).
Usage: python pypto_tensor_values_runner.py OUT.pt

- `offset`: a KV-cache write of a decode step: each kv head's new row written at the position the tensor
  holds, into a [heads * cache_len, dim] cache (what the attention core would need to write the cache itself);
- `bound`: a loop whose trip count the tensor holds (what stopping at a cache's valid chunks would need).
Each runs at two values of the tensor, to show the kernel follows the value, not a constant from its build.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))

import torch  # noqa: E402
from pto_kernels.backends import pypto_runtime  # noqa: E402
from pto_kernels.tiling.tile_table import TileConfig  # noqa: E402

HEADS, CACHE, DIM, ROWS = 2, 16, 8, 16


def build():
    pypto = pypto_runtime.pypto_module()
    fp32, int32 = pypto.DT_FP32, pypto.DT_INT32

    @pypto_runtime.jit("cpu", TileConfig(row_tile=1))
    def offset_kernel(
        new: pypto.Tensor([HEADS, DIM], fp32),
        position: pypto.Tensor([1, 1], int32),
        cache: pypto.Tensor([HEADS * CACHE, DIM], fp32),
    ):
        pypto.set_vec_tile_shapes(1, DIM)
        for _ in pypto.loop(1):
            at = position[0, 0]
            for head in range(HEADS):
                row = pypto.add(pypto.view(new, [1, DIM], [head, 0]), 0.0)
                pypto.assemble(row, [head * CACHE + at, 0], cache)

    @pypto_runtime.jit("cpu", TileConfig(row_tile=1))
    def bound_kernel(
        x: pypto.Tensor([ROWS, DIM], fp32),
        count: pypto.Tensor([1, 1], int32),
        out: pypto.Tensor([ROWS, DIM], fp32),
    ):
        pypto.set_vec_tile_shapes(1, DIM)
        for i in pypto.loop(count[0, 0]):
            pypto.assemble(pypto.mul(pypto.view(x, [1, DIM], [i, 0]), 2.0), [i, 0], out)

    return offset_kernel, bound_kernel


def main(out_path: str) -> None:
    offset_kernel, bound_kernel = build()
    results = {}
    for value in (5, 11):
        new = torch.randn(HEADS, DIM) + 10.0  # never zero: a written row is told from the zeros around it
        cache = torch.zeros(HEADS * CACHE, DIM)
        with pypto_runtime.launching(new):
            offset_kernel(new, torch.tensor([[value]], dtype=torch.int32), cache)
        results[f"offset/{value}"] = {"new": new, "cache": cache}
        x = torch.randn(ROWS, DIM) + 10.0
        out = torch.zeros(ROWS, DIM)
        with pypto_runtime.launching(x):
            bound_kernel(x, torch.tensor([[value]], dtype=torch.int32), out)
        results[f"bound/{value}"] = {"x": x, "out": out}
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1])
