"""How close attention_prologue can come to its floor in PyPTO's cost model: its q/k/v matmuls alone, and
with the least work an epilogue could do, beside the shipped kernel.

    python benchmarks/prologue_bound.py [--json out.json] [--timeout S]

The shipped prologue (1 row: batch-1 decode; GutenOCR-3B's widths; the `one_row` tiling) is the q/k/v
matmuls reading x straight from global memory, then a vector epilogue: the RMSNorm scale, the bias, the
rounding and the rotation, one task per q/k head and one for v. Its target (issue 40) is 1.5x the floor,
the bytes it must move at the chip's bandwidth. The probes keep the shipped matmuls and tiling and change
only what follows them:
- `matmuls`: the projections written straight out in bf16, no vector stage;
- `one copy per head`: the shipped layout of epilogue tasks, each doing the least any epilogue must (one
  copy of its fp32 columns in, a rounding to bf16, one copy out) and nothing of the norm, bias or rotation;
- `one copy`: a single epilogue task for every head's columns (one copy in, one out).
A probe kernel computes x @ W^T for real (tests/kernels/test_kernels_pypto_blocks.py runs each through the
interpreter against torch), so its span is a kernel's, not an arithmetic. Prints cycles and the ratio to
the prologue's floor; asserts nothing. Figures are the cost model's, not a device's.
"""

# No `from __future__ import annotations`: pypto reads the kernels' annotations as objects.
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))

EPILOGUES = {
    "none": "matmuls",
    "per_head": "one copy per head",
    "one_task": "one copy",
}


def build_probe(rows, hidden, q_heads, k_heads, dim, epilogue, config, device_type):
    """The shipped prologue's q/k/v matmuls (its tiling) and a probe epilogue: kernel(x, q_w, k_w, v_w,
    q_out, k_out, v_out), weights in nn.Linear layout, outputs x @ W^T in bf16."""
    from pto_kernels.backends import pypto_blocks
    from pto_kernels.backends.pypto_runtime import jit, pypto_dtype, pypto_module, row_axis

    if epilogue not in EPILOGUES:
        raise ValueError(f"epilogue {epilogue!r}: one of {', '.join(EPILOGUES)}")
    pypto = pypto_module()
    dt, fp32 = pypto_dtype(torch.bfloat16), pypto.DT_FP32
    rows_axis, tile = row_axis(config, rows), config.row_tile
    q_width, kv_width = q_heads * dim, k_heads * dim
    m, proj_k, proj_n, _ = pypto_blocks._block_tiles(config)

    @jit(device_type, config)
    def prologue_probe_kernel(
        x: pypto.Tensor([rows_axis, hidden], dt),
        q_w: pypto.Tensor([q_width, hidden], dt),
        k_w: pypto.Tensor([kv_width, hidden], dt),
        v_w: pypto.Tensor([kv_width, hidden], dt),
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
            pypto.set_vec_tile_shapes(tile, dim)
            _probe_body(
                xt, (q_w, k_w, v_w), (q_out, k_out, v_out), epilogue, start, tile, valid, dim, dt, fp32
            )
        pypto.set_pass_options(sg_set_scope=-1)  # a global option: leave it as found for the next kernel

    return prologue_probe_kernel


def _probe_body(xt, weights, outs, epilogue, start, tile, valid, dim, dt, fp32):
    """Inside the kernel: the three matmuls and the probe's epilogue (see the module's docstring)."""
    from pto_kernels.backends.pypto_runtime import pypto_module

    pypto = pypto_module()
    if epilogue == "none":
        for w, out in zip(weights, outs, strict=True):
            pypto.assemble(pypto.matmul(xt, w, dt, b_trans=True), [start, 0], out)
        return
    projected = [pypto.matmul(xt, w, fp32, b_trans=True) for w in weights]
    if epilogue == "one_task":
        pypto.set_pass_options(sg_set_scope=1)
        for y, out in zip(projected, outs, strict=True):
            width = out.shape[1]
            pypto.set_vec_tile_shapes(tile, width)
            head = pypto.view(y, [tile, width], [0, 0], valid_shape=[valid, width])
            pypto.assemble(pypto.cast(head, dt), [start, 0], out)
        return
    # per_head: as the shipped kernel, v in one task, each q and k head in one of its own
    (q, k, v), (q_out, k_out, v_out) = projected, outs
    pypto.set_pass_options(sg_set_scope=1)
    width = v_out.shape[1]
    pypto.set_vec_tile_shapes(tile, width)
    pypto.assemble(
        pypto.cast(pypto.view(v, [tile, width], [0, 0], valid_shape=[valid, width]), dt), [start, 0], v_out
    )
    pypto.set_vec_tile_shapes(tile, dim)
    heads = [(q, q_out, col) for col in range(0, q_out.shape[1], dim)]
    heads += [(k, k_out, col) for col in range(0, k_out.shape[1], dim)]
    for scope, (src, dst, col) in enumerate(heads, start=2):
        pypto.set_pass_options(sg_set_scope=scope)
        head = pypto.view(src, [tile, dim], [0, col], valid_shape=[valid, dim])
        pypto.assemble(pypto.cast(head, dt), [start, col], dst)


def sim_probe(params: dict, config) -> None:
    """In bench_sim's subprocess: build the probe at GutenOCR-3B's widths in SIM mode and call it once."""
    import bench_sim

    rows, bf16 = params["rows"], torch.bfloat16
    q_width, kv_width = bench_sim.Q_HEADS * bench_sim.HEAD_DIM, bench_sim.KV_WIDTH
    kernel = build_probe(
        rows,
        bench_sim.TEXT,
        bench_sim.Q_HEADS,
        bench_sim.K_HEADS,
        bench_sim.HEAD_DIM,
        params["epilogue"],
        config,
        "sim",
    )
    weights = [torch.randn(n, bench_sim.TEXT, dtype=bf16) for n in (q_width, kv_width, kv_width)]
    outs = [torch.empty(rows, n, dtype=bf16) for n in (q_width, kv_width, kv_width)]
    kernel(torch.randn(rows, bench_sim.TEXT, dtype=bf16), *weights, *outs)


def main() -> None:
    import bench_sim

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument("--timeout", type=int, default=bench_sim.SIM_TIMEOUT_S, help="seconds per kernel")
    args = parser.parse_args()
    soc = bench_sim.soc_config()
    entries = [
        bench_sim.with_roofline(bench_sim.run_sim("attention_prologue", {"rows": 1}, args.timeout), soc)
    ]
    for epilogue in EPILOGUES:
        params = {"rows": 1, "epilogue": epilogue, "probe": "prologue_bound"}  # bench_sim runs our sim_probe
        entries.append(
            bench_sim.with_roofline(bench_sim.run_sim("prologue_bound", params, args.timeout), soc)
        )
    print("attention_prologue at 1 row against its floor, and the probes (PyPTO cost model, not a device)")
    print(f"{'kernel':<44} {'cycles':>8} {'ratio':>6} {'tasks':>6} {'longest':>8} {'spread':>7}")
    for e in entries:
        name = "shipped" if e["op"] == "attention_prologue" else EPILOGUES[e["params"]["epilogue"]]
        if e["status"] != "ok":
            print(f"{name:<44} not available: {e['reason']}")
            continue
        print(
            f"{name:<44} {e['cycles']:>8} {e['ratio']:>6.2f} {e['tasks']:>6}"
            f" {e.get('longest_task', ''):>8} {e.get('dispatch_spread', ''):>7}"
        )
    if args.json:
        args.json.write_text(json.dumps({"soc": soc, "kernels": entries}, indent=2) + "\n")


if __name__ == "__main__":
    main()
