"""The real PyPTO kernels, run on the CPU through PyPTO's verify interpreter, against float64 references.

One subprocess runs every golden case and one case per tile-table entry; another runs the prompt-length x
batch sweep (pypto exits the process on a g++ failure). The interpreter library is built once (25-37 s)
into ~/.cache/pto_kernels (or $PTO_KERNELS_CACHE_DIR) and reused afterwards.
"""

import importlib.util
from pathlib import Path

import golden_cases as gc
import pytest
import torch
from interpreter_run import run_interpreter

pytestmark = [
    pytest.mark.pypto,
    pytest.mark.skipif(importlib.util.find_spec("pypto") is None, reason="pypto not installed (extra `pto`)"),
]

RUNNER = Path(__file__).with_name("pypto_runner.py")


def _run(mode: str, tmp: Path) -> dict:
    return run_interpreter(RUNNER, tmp, mode)


@pytest.fixture(scope="module")
def pypto_results(tmp_path_factory):
    results = _run("golden", tmp_path_factory.mktemp("pypto"))
    print("pypto interpreter seconds per case:", {k: round(v, 1) for k, v in results["seconds"].items()})
    return results


@pytest.fixture(scope="module")
def sweep_results(tmp_path_factory):
    return _run("sweep", tmp_path_factory.mktemp("pypto_sweep"))


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
    for op in (
        "rms_norm",
        "mrope",
        "swiglu_mlp",
    ):  # what this runner calls (the blocks: test_kernels_pypto_blocks)
        st = pypto_results["stats"][op]
        assert st["calls"] and st["backends"] == {"pypto": st["calls"]} and st["fallbacks"] == 0, (op, st)


def test_pypto_interpreter_prints_no_drawing_tracebacks(pypto_results):
    """pypto's swim-lane drawing script fails on every call without matplotlib; none of it reaches stderr
    (backends/interpreter_output.py), while anything else pypto prints there would."""
    assert "pypto/lib/scripts/" not in pypto_results["stderr"], pypto_results["stderr"][-2000:]


def test_pypto_repeat_call_reuses_kernel_and_weights(pypto_results):
    assert pypto_results["repeat"] == {"kernel_builds_added": 0, "layouts_added": 0, "same_result": True}


@pytest.mark.parametrize("case", gc.table_cases(), ids=gc.ids(gc.table_cases()))
def test_pypto_tile_table_entry(case, pypto_results):
    """Every tiling the table ships, run under that tiling, against float64 on NaN-poisoned outputs."""
    assert repr(case["config"]) in pypto_results["used_configs"][case["id"]], (
        "the call ran under another tiling"
    )
    actual = pypto_results["outputs"]["table/" + case["id"]]
    dtype = getattr(torch, case["dtype"])
    if case["op"] == "rms_norm":
        x, w, eps = gc.rms_norm_inputs(case)
        gc.check_close(actual, gc.rms_norm_expected(x, w, eps), dtype, case["id"])
    elif case["op"] == "mrope":
        q, k, cos, sin, section = gc.mrope_inputs(case)
        cos_m, sin_m = gc.mix_tables(cos, section), gc.mix_tables(sin, section)
        gc.check_close(actual[0], gc.rotary_expected(q, cos_m, sin_m), dtype, case["id"] + " q")
        gc.check_close(actual[1], gc.rotary_expected(k, cos_m, sin_m), dtype, case["id"] + " k")
    else:
        mlp, x = gc.mlp_inputs(case)
        gc.check_close(actual, gc.mlp_expected(mlp, x), dtype, case["id"])


@pytest.mark.slow
def test_pypto_prompt_lengths_and_batches_build_at_most_two_kernels_per_op(sweep_results):
    """5 prompt lengths x 3 batch sizes of prefill, then decode: the row axis is dynamic, so each op builds
    one kernel per shape class (decode, prefill) and every other call is a cache hit."""
    assert set(sweep_results["calls"]) == {"rms_norm", "mrope", "swiglu_mlp"}
    for op, calls in sweep_results["calls"].items():
        st = sweep_results["stats"][op]
        kernels = st["pypto_kernels"]
        assert calls == 18 and st["backends"] == {"pypto": calls}, (op, st)
        assert kernels["built"] <= 2, (op, kernels, sorted(set(sweep_results["rows"][op])))
        assert kernels["built"] + kernels["cache_hits"] == calls, (op, kernels)
