"""Run the PyPTO attention core kernel on the CPU verify interpreter; save its inputs and outputs.

Invoked by test_kernels_pypto_attention.py in a subprocess (a g++ failure inside pypto exits the process).
Usage: python pypto_attention_runner.py OUT.pt

Every golden `pypto_cases` case calls the kernel's entry directly (no dispatch: no torch fallback can stand
in for it) on NaN-poisoned outputs; one more goes through the wrapper with backend "pypto", strict. Two
sabotaged builds break the kernel itself, and the test expects them to fail its check: the mask switched
off (MASKED = 0: every position of the static cache seen), and the merge's per-chunk weights set to 1
(every chunk's partial sums taken as if its row maximum were the global one).
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import golden_cases as gc  # noqa: E402
import torch  # noqa: E402
from pto_kernels.backends import pypto_attention, pypto_kernels  # noqa: E402

SABOTAGED = (
    "gutenocr-tail2065-batch2-bf16"  # 3 chunks (the last a 17-position tail); one sequence ends in the 2nd
)


def _no_mask():
    pypto_attention.MASKED = 0.0
    return lambda: setattr(pypto_attention, "MASKED", 1e30)


def _no_merge_weights():
    right = pypto_attention._chunk_weights

    def ones(tops):
        pypto = pypto_kernels._pypto()
        return pypto.add(pypto.mul(tops, 0.0), 1.0)

    pypto_attention._chunk_weights = ones
    return lambda: setattr(pypto_attention, "_chunk_weights", right)


SABOTAGE = {"no-mask": _no_mask, "no-merge-weights": _no_merge_weights}


def main(out_path: str) -> None:
    pypto_kernels.POISON_OUTPUTS = True
    results, seconds = {}, {}
    cases = {case["id"]: case for case in gc.load("attention_core", "pypto_cases")}
    with torch.no_grad():
        for case_id, case in cases.items():
            inputs = gc.attention_core_inputs(case)
            start = time.perf_counter()
            results[case_id] = {"case": case, "output": pypto_attention.attention_core(*inputs)}
            seconds[case_id] = time.perf_counter() - start
        first = next(iter(cases.values()))
        results["repeat"] = {
            "case": first,
            "output": pypto_attention.attention_core(*gc.attention_core_inputs(first)),
        }
        kernel_stats = pypto_kernels.kernel_stats()  # every case its own shape, then one repeated
        for name, sabotage in SABOTAGE.items():
            restore = sabotage()
            pypto_kernels.KERNELS.clear()  # the kernel is built again, sabotaged
            inputs = gc.attention_core_inputs(cases[SABOTAGED])
            results[f"sabotaged/{name}"] = {
                "case": cases[SABOTAGED],
                "output": pypto_attention.attention_core(*inputs),
            }
            restore()
            pypto_kernels.KERNELS.clear()
        results |= dispatched(cases["gutenocr-3rows-lengths-bf16"])
    torch.save({"results": results, "seconds": seconds, "stats": kernel_stats}, out_path)


def dispatched(case: dict) -> dict:
    """Through the package's wrapper with backend "pypto", strict: what a patched attention calls."""
    import pto_kernels

    os.environ["PTO_KERNELS_STRICT"] = "1"
    inputs = gc.attention_core_inputs(case)
    with pto_kernels.enabled(["attention_core"], backend="pypto"):
        output = pto_kernels.attention_core_wrapper(*inputs)
        backends = pto_kernels.stats()["attention_core"]["backends"]
    return {"dispatched": {"case": case, "output": output, "backends": backends}}


if __name__ == "__main__":
    main(sys.argv[1])
