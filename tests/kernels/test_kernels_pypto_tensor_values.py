"""PyPTO 0.2 takes an offset and a loop bound from a value read from an int32 tensor inside a kernel
(`t[0, 0]`), checked through its CPU interpreter (pypto_tensor_values_runner.py, in a subprocess). These are
what writing the KV cache inside a kernel of ours, and stopping the attention core at a cache's valid chunks,
would rest on; the day a pypto release drops them, this fails."""

import importlib.util
from pathlib import Path

import pytest
import torch
from interpreter_run import run_interpreter

pytestmark = [
    pytest.mark.pypto,
    pytest.mark.skipif(importlib.util.find_spec("pypto") is None, reason="pypto not installed (extra `pto`)"),
]

RUNNER = Path(__file__).resolve().parent / "pypto_tensor_values_runner.py"
VALUES = (5, 11)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_interpreter(RUNNER, tmp_path_factory.mktemp("pypto_tensor_values"))


def _written(rows: torch.Tensor) -> list[int]:
    return (rows.abs().sum(-1) > 0).nonzero().flatten().tolist()


@pytest.mark.parametrize("value", VALUES)
def test_a_cache_row_is_written_at_the_position_the_tensor_holds(value, results):
    result = results[f"offset/{value}"]
    new, cache = result["new"], result["cache"]
    heads, cache_len = new.shape[0], cache.shape[0] // new.shape[0]
    assert _written(cache) == [head * cache_len + value for head in range(heads)]
    for head in range(heads):
        torch.testing.assert_close(cache[head * cache_len + value], new[head], rtol=0, atol=0)


@pytest.mark.parametrize("value", VALUES)
def test_a_loop_runs_as_many_steps_as_the_tensor_holds(value, results):
    result = results[f"bound/{value}"]
    assert _written(result["out"]) == list(range(value))
    torch.testing.assert_close(result["out"][:value], result["x"][:value] * 2, rtol=0, atol=0)
