"""The PyPTO attention core (flash-decode) kernel, run on the CPU through PyPTO's verify interpreter,
against the float64 loop in golden_cases (not imported from pto_kernels).

One subprocess (pypto_attention_runner.py) runs every case; pypto exits the process on a g++ failure.
Full width: GutenOCR-3B's 16 q / 2 kv heads of 128 at contexts 1, 17, 1,024 and 2,065 (three chunks of
1,024, the last a 17-position tail; batch 2, the second sequence 1,100 long, so its third chunk is all
masked), batch 2 with lengths that differ and 3 new rows; Qwen2.5-VL-7B's 28 / 4 and Qwen3-VL-2B's 16 / 8;
a small fp32 case.
"""

import importlib.util
from pathlib import Path

import golden_cases as gc
import pytest
from interpreter_run import run_interpreter

pytestmark = [
    pytest.mark.pypto,
    pytest.mark.skipif(importlib.util.find_spec("pypto") is None, reason="pypto not installed (extra `pto`)"),
]

RUNNER = Path(__file__).resolve().parent / "pypto_attention_runner.py"
CASES = gc.load("attention_core", "pypto_cases")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = run_interpreter(RUNNER, tmp_path_factory.mktemp("pypto_attention"))
    print("pypto interpreter seconds per case:", {k: round(v, 1) for k, v in out["seconds"].items()})
    return out


def _check(result: dict, what: str):
    inputs = gc.attention_core_inputs(result["case"])
    assert result["output"].dtype == inputs[0].dtype, what
    return gc.check_close(result["output"], gc.attention_core_expected(*inputs), inputs[0].dtype, what)


@pytest.mark.parametrize("case", CASES, ids=gc.ids(CASES))
def test_kernel_matches_float64(case, results):
    _check(results["results"][case["id"]], case["id"])


@pytest.mark.parametrize(
    "sabotaged",
    [
        "no-mask/gutenocr-tail2065-batch2-bf16",
        "no-mask/gutenocr-3rows-lengths-bf16",
        "no-merge-weights/gutenocr-tail2065-batch2-bf16",
    ],
)
def test_a_broken_kernel_is_caught(sabotaged, results):
    with pytest.raises(AssertionError, match="relative error"):
        _check(results["results"][f"sabotaged/{sabotaged}"], sabotaged)


def test_the_wrapper_runs_the_kernel(results):
    result = results["results"]["dispatched"]
    assert result["backends"] == {"pypto": 1}, result["backends"]
    _check(result, "dispatched")


def test_one_kernel_per_shape_and_a_repeat_is_a_cache_hit(results):
    stats = results["stats"]["attention_core"]
    assert (stats["built"], stats["cache_hits"]) == (len(CASES), 1), stats
    _check(results["results"]["repeat"], "repeat")
