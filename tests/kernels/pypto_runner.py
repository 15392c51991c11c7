"""Run the real PyPTO kernels on the CPU verify interpreter and save what they return.

Invoked by test_kernels_pypto.py in a subprocess (a g++ failure inside pypto exits the process).
Usage: python pypto_runner.py golden OUT.pt   the golden `pypto_cases` and one case per tile-table entry
       python pypto_runner.py sweep OUT.pt    5 prompt lengths x 3 batch sizes, then a decode step each
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import golden_cases as gc  # noqa: E402
import pto_kernels  # noqa: E402
import torch  # noqa: E402
from pto_kernels.backends import pypto_ops, pypto_runtime  # noqa: E402

# the sweep: prompt lengths and batch sizes of prefill (short: the interpreter is slow), then one decode
# token per sequence
SWEEP_PROMPT_LENGTHS = (17, 19, 23, 29, 37)
SWEEP_BATCHES = (1, 2, 4)
# reduced widths (the interpreter is slow); the row axis is what the sweep is about
SWEEP_RMS_NORM = {"seed": 91, "eps": 1e-6, "dtype": "float32"}
SWEEP_MROPE = {
    "seed": 92,
    "q_heads": 2,
    "k_heads": 1,
    "head_dim": 16,
    "section": [2, 3, 3],
    "dtype": "float32",
}
SWEEP_MLP = {"seed": 93, "hidden": 64, "intermediate": 96, "dtype": "float32"}


def _call(op: str, case: dict):
    if op == "rms_norm":
        x, w, eps = gc.rms_norm_inputs(case)
        return pto_kernels.rms_norm_wrapper(x, w, eps)
    if op == "mrope":
        q, k, cos, sin, section = gc.mrope_inputs(case)
        return pto_kernels.mrope_pto_correct(q, k, cos, sin, section)
    mlp, x = gc.mlp_inputs(case)
    return pto_kernels.swiglu_mlp_wrapper(mlp, x)


def run_golden() -> dict:
    outputs, seconds, repeat = {}, {}, None
    for case in gc.load("rms_norm", "pypto_cases"):
        start = time.perf_counter()
        outputs["rms_norm/" + case["id"]] = _call("rms_norm", case)
        seconds["rms_norm/" + case["id"]] = time.perf_counter() - start
    for case in gc.load("mrope", "pypto_cases"):
        start = time.perf_counter()
        q, k, cos, sin, section = gc.mrope_inputs(case)
        outputs["mrope/" + case["id"]] = pto_kernels.mrope_pto_correct(q, k, cos, sin, section)
        cos_m, sin_m = gc.mix_tables(cos, section), gc.mix_tables(sin, section)
        outputs["mrope_mixed/" + case["id"]] = pto_kernels.mrope_mixed_wrapper(q, k, cos_m, sin_m)
        seconds["mrope/" + case["id"]] = time.perf_counter() - start
    for index, case in enumerate(gc.load("swiglu_mlp", "pypto_cases")):
        start = time.perf_counter()
        mlp, x = gc.mlp_inputs(case)
        outputs["swiglu_mlp/" + case["id"]] = pto_kernels.swiglu_mlp_wrapper(mlp, x)
        seconds["swiglu_mlp/" + case["id"]] = time.perf_counter() - start
        if index == 0:
            built = pypto_runtime.kernel_stats()["swiglu_mlp"]["built"]
            layouts = pypto_ops.WEIGHT_LAYOUTS.builds
            again = pto_kernels.swiglu_mlp_wrapper(mlp, x)  # same shape and module: nothing rebuilt
            repeat = {
                "kernel_builds_added": pypto_runtime.kernel_stats()["swiglu_mlp"]["built"] - built,
                "layouts_added": pypto_ops.WEIGHT_LAYOUTS.builds - layouts,
                "same_result": bool(torch.equal(again, outputs["swiglu_mlp/" + case["id"]])),
            }
    # each tile-table entry, with a check that the call really ran under that entry's tiling
    used_configs = {}
    for case in gc.table_cases():
        start = time.perf_counter()
        outputs["table/" + case["id"]] = _call(case["op"], case)
        seconds["table/" + case["id"]] = time.perf_counter() - start
        used_configs[case["id"]] = [
            repr(key[2]) for key in pypto_runtime.KERNELS._kernels if key[0] == case["op"]
        ]
    return {"outputs": outputs, "seconds": seconds, "repeat": repeat, "used_configs": used_configs}


def run_sweep() -> dict:
    """Prefill at every (prompt length, batch), then a decode step per batch; record max relative error."""
    calls: dict[str, int] = {}
    worst: dict[str, float] = {}
    rows_seen: dict[str, list[int]] = {}
    steps = [(batch, length) for length in SWEEP_PROMPT_LENGTHS for batch in SWEEP_BATCHES]
    steps += [(batch, 1) for batch in SWEEP_BATCHES]
    for seed, (batch, length) in enumerate(steps):
        cases = {
            "rms_norm": SWEEP_RMS_NORM | {"shape": [batch, length, 64]},
            "mrope": SWEEP_MROPE | {"batch": batch, "seq": length},
            "swiglu_mlp": SWEEP_MLP | {"tokens": [batch, length]},
        }
        for op, case in cases.items():
            case = case | {"seed": case["seed"] * 100 + seed}
            result = _call(op, case)
            if op == "rms_norm":
                expected = [gc.rms_norm_expected(*gc.rms_norm_inputs(case)[:2], case["eps"])]
                actual = [result]
            elif op == "mrope":
                q, k, cos, sin, section = gc.mrope_inputs(case)
                cos_m, sin_m = gc.mix_tables(cos, section), gc.mix_tables(sin, section)
                expected = [gc.rotary_expected(q, cos_m, sin_m), gc.rotary_expected(k, cos_m, sin_m)]
                actual = list(result)
            else:
                expected, actual = [gc.mlp_expected(*gc.mlp_inputs(case))], [result]
            for got, want in zip(actual, expected, strict=True):
                gc.check_close(got, want, torch.float32, f"{op} batch {batch} length {length}")
                worst[op] = max(worst.get(op, 0.0), gc.relative_error(got, want))
            calls[op] = calls.get(op, 0) + 1
            rows_seen.setdefault(op, []).append(batch * length)
    return {"calls": calls, "worst_rel_err": worst, "rows": rows_seen}


def main(mode: str, out_path: str) -> None:
    os.environ["PTO_KERNELS_STRICT"] = "1"  # a kernel failure must not hide behind the torch path
    pypto_runtime.POISON_OUTPUTS = True
    pto_kernels.enable(backend="pypto")
    with torch.no_grad():
        result = run_golden() if mode == "golden" else run_sweep()
    torch.save(result | {"stats": pto_kernels.stats()}, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
