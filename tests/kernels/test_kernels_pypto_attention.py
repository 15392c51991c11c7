"""The PyPTO attention core (flash-decode) kernel, run on the CPU through PyPTO's verify interpreter,
against the float64 loop in golden_cases (not imported from pto_kernels).

One subprocess (pypto_attention_runner.py) runs every case; pypto exits the process on a g++ failure.
Full width: GutenOCR-3B's 16 q / 2 kv heads of 128 at contexts 1, 17, 1,024 and 2,065 (three chunks of
1,024, the last a 17-position tail; batch 2, the second sequence 1,100 long, so its third chunk is all
masked), batch 2 with lengths that differ and 3 new rows; Qwen2.5-VL-7B's 28 / 4 and Qwen3-VL-2B's 16 / 8;
a small fp32 case; a left-padded batch of four over 2,064 positions (8 kv heads of work: a chunk of 2,048
and a 16-position tail): one sequence whole, one a single position in the tail, one 1,200 long inside the
first chunk, one 30 long across both. There the kernel runs only the chunks each range touches, read from its chunk scratch.
Batches of 8 (left-padded) and 16 over short caches of one chunk: 16 and 32 kv heads of work, where the
schedule gives each kv head one scores task as wide as the chunk and one P @ V task of every output column.
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
        "other-sequence-keys/gutenocr-batch4-left-padded-tail2064-bf16",
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


def _chunks_touched(case: dict, chunk: int) -> list[list[int]]:
    """Per sequence, the chunks its range [start, start + length) overlaps, counted position by position."""
    touched = []
    for start, length in zip(case.get("kv_starts", [0] * case["batch"]), case["kv_lens"], strict=True):
        touched.append(sorted({position // chunk for position in range(start, start + length)}))
    return touched


def _chunks_run(result: dict) -> list[list[int]]:
    """Per sequence, the chunks whose row maxima are not the scratch's neutral -1e30 (a chunk that ran with
    nothing visible has -1e30 x its distance to the range: -1.6e31 and less in this case)."""
    case, tops = result["case"], result["tops"]
    per_sequence = tops.reshape(case["batch"], -1, tops.shape[-1])  # rows: (sequence, kv head, q rows)
    written = per_sequence != torch.tensor(-1e30, dtype=torch.float32)
    ran = written.all(1)  # every row of every kv head wrote the chunk's maximum
    assert torch.equal(ran, written.any(1)), "a chunk ran for some rows only"
    return [row.nonzero().flatten().tolist() for row in ran]


def test_the_kernel_runs_only_the_chunks_each_range_touches(results):
    result = results["results"]["gutenocr-batch4-left-padded-tail2064-bf16"]
    assert (
        _chunks_run(result) == _chunks_touched(result["case"], result["chunk"]) == [[0, 1], [1], [0], [0, 1]]
    )


def test_a_kernel_that_reads_every_chunk_is_caught(results):
    """Reading past the lengths is masked, so its output passes: what it read shows in the scratch."""
    result = results["results"]["sabotaged/every-chunk/gutenocr-batch4-left-padded-tail2064-bf16"]
    _check(result, "every chunk")
    assert _chunks_run(result) == [[0, 1]] * 4
    assert _chunks_run(result) != _chunks_touched(result["case"], result["chunk"])
