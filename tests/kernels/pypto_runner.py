"""Run the golden `pypto_cases` through the real PyPTO kernels on the CPU verify interpreter.

Invoked by test_kernels_pypto.py in a subprocess (a g++ failure inside pypto exits the process).
Usage: python pypto_runner.py OUT.pt   -> saves {"outputs": {...}, "kernel_builds": ..., ...}
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
from pto_kernels import pypto_kernels  # noqa: E402


def main(out_path: str) -> None:
    os.environ["PTO_KERNELS_STRICT"] = "1"  # a kernel failure must not hide behind the torch path
    pypto_kernels.POISON_OUTPUTS = True
    pto_kernels.enable(backend="pypto")
    outputs, seconds, repeat = {}, {}, None
    with torch.no_grad():
        for case in gc.load("rms_norm", "pypto_cases"):
            start = time.perf_counter()
            x, w, eps = gc.rms_norm_inputs(case)
            outputs["rms_norm/" + case["id"]] = pto_kernels.rms_norm_wrapper(x, w, eps)
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
                builds = pypto_kernels.kernel_builds, pypto_kernels.WEIGHT_LAYOUTS.builds
                again = pto_kernels.swiglu_mlp_wrapper(mlp, x)  # same shape and module: nothing rebuilt
                repeat = {
                    "kernel_builds_added": pypto_kernels.kernel_builds - builds[0],
                    "layouts_added": pypto_kernels.WEIGHT_LAYOUTS.builds - builds[1],
                    "same_result": bool(torch.equal(again, outputs["swiglu_mlp/" + case["id"]])),
                }
    torch.save(
        {"outputs": outputs, "seconds": seconds, "repeat": repeat, "stats": pto_kernels.stats()}, out_path
    )


if __name__ == "__main__":
    main(sys.argv[1])
