"""The PyPTO attention core (flash-decode) kernel, run on the CPU through PyPTO's verify interpreter,
against the float64 loop in golden_cases (not imported from pto_kernels).

One subprocess (pypto_attention_runner.py) runs every case; pypto exits the process on a g++ failure.
Full width: GutenOCR-3B's 16 q / 2 kv heads of 128 at contexts 1, 17, 1,024 and 2,065 (three chunks of
1,024, the last a 17-position tail; batch 2, the second sequence 1,100 long, so its third chunk is all
masked), batch 2 with lengths that differ and 3 new rows; Qwen2.5-VL-7B's 28 / 4 and Qwen3-VL-2B's 16 / 8;
a small fp32 case.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import golden_cases as gc
import pytest
import torch

pytestmark = [
    pytest.mark.pypto,
    pytest.mark.skipif(importlib.util.find_spec("pypto") is None, reason="pypto not installed (extra `pto`)"),
]

RUNNER = Path(__file__).resolve().parent / "pypto_attention_runner.py"
CASES = gc.load("attention_core", "pypto_cases")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pypto_attention")
    env = dict(os.environ, TILE_FWK_OUTPUT_DIR=str(tmp / "traces"))
    env.pop("ASCEND_HOME_PATH", None)  # CANN absent: pypto must stay in SIM mode
    proc = subprocess.run(
        [sys.executable, str(RUNNER), str(tmp / "out.pt")],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if proc.returncode != 0:
        pytest.fail(f"pypto runner exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out = torch.load(tmp / "out.pt", weights_only=False)
    print("pypto interpreter seconds per case:", {k: round(v, 1) for k, v in out["seconds"].items()})
    return out


def _check(result: dict, what: str):
    inputs = gc.attention_core_inputs(result["case"])
    assert result["output"].dtype == inputs[0].dtype, what
    return gc.check_close(result["output"], gc.attention_core_expected(*inputs), inputs[0].dtype, what)


@pytest.mark.parametrize("case", CASES, ids=gc.ids(CASES))
def test_kernel_matches_float64(case, results):
    _check(results["results"][case["id"]], case["id"])


@pytest.mark.parametrize("sabotage", ["no-mask", "no-merge-weights"])
def test_a_broken_kernel_is_caught(sabotage, results):
    with pytest.raises(AssertionError, match="relative error"):
        _check(results["results"][f"sabotaged/{sabotage}"], sabotage)


def test_the_wrapper_runs_the_kernel(results):
    result = results["results"]["dispatched"]
    assert result["backends"] == {"pypto": 1}, result["backends"]
    _check(result, "dispatched")


def test_one_kernel_per_shape_and_a_repeat_is_a_cache_hit(results):
    stats = results["stats"]["attention_core"]
    assert (stats["built"], stats["cache_hits"]) == (len(CASES), 1), stats
    _check(results["results"]["repeat"], "repeat")
