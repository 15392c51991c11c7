"""The real PyPTO kernels, run on the CPU through PyPTO's verify interpreter, against float64 references.

One subprocess runs every pypto case (pypto exits the process on a g++ failure). The interpreter library
is built once (25-37 s) into ~/.cache/pto_kernels (or $PTO_KERNELS_CACHE_DIR) and reused afterwards.
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

RUNNER = Path(__file__).with_name("pypto_runner.py")


@pytest.fixture(scope="module")
def pypto_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pypto")
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
    results = torch.load(tmp / "out.pt")
    print("pypto interpreter seconds per case:", {k: round(v, 1) for k, v in results["seconds"].items()})
    return results


@pytest.mark.parametrize(
    "case", gc.load("rms_norm", "pypto_cases"), ids=gc.ids(gc.load("rms_norm", "pypto_cases"))
)
def test_pypto_rms_norm(case, pypto_results):
    x, w, eps = gc.rms_norm_inputs(case)
    gc.check_close(
        pypto_results["outputs"]["rms_norm/" + case["id"]], gc.rms_norm_expected(x, w, eps), x.dtype
    )


@pytest.mark.parametrize("entry", ["mrope", "mrope_mixed"])
@pytest.mark.parametrize("case", gc.load("mrope", "pypto_cases"), ids=gc.ids(gc.load("mrope", "pypto_cases")))
def test_pypto_mrope(case, entry, pypto_results):
    q, k, cos, sin, section = gc.mrope_inputs(case)
    cos_m, sin_m = gc.mix_tables(cos, section), gc.mix_tables(sin, section)
    q_embed, k_embed = pypto_results["outputs"][f"{entry}/" + case["id"]]
    gc.check_close(q_embed, gc.rotary_expected(q, cos_m, sin_m), q.dtype, "q")
    gc.check_close(k_embed, gc.rotary_expected(k, cos_m, sin_m), k.dtype, "k")


@pytest.mark.parametrize(
    "case", gc.load("swiglu_mlp", "pypto_cases"), ids=gc.ids(gc.load("swiglu_mlp", "pypto_cases"))
)
def test_pypto_swiglu_mlp(case, pypto_results):
    mlp, x = gc.mlp_inputs(case)
    gc.check_close(pypto_results["outputs"]["swiglu_mlp/" + case["id"]], gc.mlp_expected(mlp, x), x.dtype)


def test_pypto_kernels_ran_without_fallback(pypto_results):
    for op, st in pypto_results["stats"].items():
        assert st["backends"] == {"pypto": st["calls"]} and st["fallbacks"] == 0, (op, st)


def test_pypto_repeat_call_reuses_kernel_and_weights(pypto_results):
    assert pypto_results["repeat"] == {"kernel_builds_added": 0, "layouts_added": 0, "same_result": True}
