"""Run the PyPTO attention core kernel on the CPU verify interpreter; save its inputs and outputs.

Invoked by test_kernels_pypto_attention.py in a subprocess (a g++ failure inside pypto exits the process).
Usage: python pypto_attention_runner.py OUT.pt

Every golden `pypto_cases` case calls the kernel's entry directly (no dispatch: no torch fallback can stand
in for it) on NaN-poisoned outputs; one more goes through the wrapper with backend "pypto", strict. Two
sabotaged builds break the kernel itself, and the test expects them to fail its check: the mask switched
off (MASKED = 0: every position of the static cache seen; on a cache of several chunks and on one of a
single chunk, which has no merge), and the merge's per-chunk weights set to 1 (every chunk's partial sums
taken as if its row maximum were the global one). Over the left-padded batch of four (every sequence's
own range, one of them a single position in the 16-position tail chunk), the kernel runs only the chunks
each range touches (loop bounds read from an int32 tensor inside it): the chunk scratch's row maxima are
saved, so the test sees which chunks ran; two more sabotaged builds read another sequence's keys, and run
every chunk of the cache whatever the lengths.
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import golden_cases as gc  # noqa: E402
import torch  # noqa: E402
from pto_kernels.backends import pypto_attention, pypto_runtime  # noqa: E402
from pto_kernels.tiling.tile_table import attention_core_config  # noqa: E402

MERGED = "gutenocr-tail2065-batch2-bf16"  # 3 chunks, the last a 17-position tail; a sequence ends in the 2nd
ONE_CHUNK = "gutenocr-3rows-lengths-bf16"  # a 256-position cache, a sequence 5 long: no merge stage
LEFT_PADDED = "gutenocr-batch4-left-padded-tail2064-bf16"  # 4 ranges: whole, 1 in the tail, 1,200, 30


def _no_mask():
    pypto_attention.MASKED = 0.0
    return lambda: setattr(pypto_attention, "MASKED", 1e30)


def _no_merge_weights():
    right = pypto_attention._chunk_weights

    def ones(tops):
        pypto = pypto_runtime.pypto_module()
        return [pypto.add(pypto.mul(top, 0.0), 1.0) for top in tops]

    pypto_attention._chunk_weights = ones
    return lambda: setattr(pypto_attention, "_chunk_weights", right)


def _other_sequence_keys():
    right = pypto_attention.key_row

    def next_sequence(head, kv_heads, heads, cache_len):
        return (head + kv_heads) % heads * cache_len

    pypto_attention.key_row = next_sequence
    return lambda: setattr(pypto_attention, "key_row", right)


def _every_chunk():
    right = pypto_attention.chunk_spans

    def whole_cache(kv_starts, kv_lens, chunk, cache_len):
        return right(torch.zeros_like(kv_starts), torch.full_like(kv_lens, cache_len), chunk, cache_len)

    pypto_attention.chunk_spans = whole_cache
    return lambda: setattr(pypto_attention, "chunk_spans", right)


# sabotage -> (how, the cases it breaks)
SABOTAGE = {
    "no-mask": (_no_mask, (MERGED, ONE_CHUNK)),
    "no-merge-weights": (_no_merge_weights, (MERGED,)),
    "other-sequence-keys": (_other_sequence_keys, (LEFT_PADDED,)),
    "every-chunk": (_every_chunk, (LEFT_PADDED,)),
}


def _run(case: dict) -> dict:
    """The kernel's output, and for a cache of several chunks the row maxima its chunk scratch holds after
    the call (a chunk the kernel skipped keeps the neutral -MASKED)."""
    inputs = gc.attention_core_inputs(case)
    result = {"case": case, "output": pypto_attention.attention_core(*inputs)}
    query, keys = inputs[0], inputs[1]
    config = attention_core_config(case["seq"], case["head_dim"], case["cache_len"])[1]
    chunk = pypto_attention.chunk_width(config, case["cache_len"], case["batch"] * case["kv_heads"])
    chunks = -(-case["cache_len"] // chunk)
    if chunks > 1:
        rows = query.shape[0] * query.shape[1] * query.shape[2]
        kv_starts = inputs[5] if len(inputs) > 5 else None
        ml, _ = pypto_attention.CONSTANTS.scratch(inputs[3], kv_starts, rows, chunks, keys.shape[-1], "cpu")
        result |= {"tops": pypto_attention.chunk_tops(ml, chunks).clone(), "chunk": chunk}
    return result


def main(out_path: str) -> None:
    pypto_runtime.POISON_OUTPUTS = True
    results, seconds = {}, {}
    cases = {case["id"]: case for case in gc.load("attention_core", "pypto_cases")}
    with torch.no_grad():
        for case_id, case in cases.items():
            start = time.perf_counter()
            results[case_id] = _run(case)
            seconds[case_id] = time.perf_counter() - start
        first = next(iter(cases.values()))
        results["repeat"] = {
            "case": first,
            "output": pypto_attention.attention_core(*gc.attention_core_inputs(first)),
        }
        kernel_stats = pypto_runtime.kernel_stats()  # every case its own shape, then one repeated
        for name, (sabotage, broken) in SABOTAGE.items():
            restore = sabotage()
            pypto_runtime.KERNELS.clear()  # the kernel is built again, sabotaged
            for case_id in broken:
                results[f"sabotaged/{name}/{case_id}"] = _run(cases[case_id])
            restore()
            pypto_runtime.KERNELS.clear()
        results |= dispatched(cases[ONE_CHUNK])
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
