"""End to end at GutenOCR's real widths on this machine: baseline vs PTO tokens per second, side by side.

Builds `make-tiny --full-width --layers N` in a temporary folder (random weights, real shapes:
hidden 2048, intermediate 11008, 16 / 2 heads, head_dim 128), applies the patch, and runs
`pto-patch bench` with the chosen kernel backend in one process, so both modes see the same
machine state. Prints the PTO / baseline ratio of tokens per second per batch size; asserts nothing.

    python benchmarks/bench_end_to_end.py --layers 2 --backend fused --batches 1,4,8
    python benchmarks/bench_end_to_end.py --layers 4 --compile inductor   # both modes compiled
    python benchmarks/bench_end_to_end.py --layers 4 --compile inductor --cache static   # decode as one graph
    python benchmarks/bench_end_to_end.py --layers 4 --ops rms_norm,attention_prologue,mlp_block

With --compile BACKEND, the model is compiled once (torch.compile, dynamic shapes) and both modes run
compiled; the compiler's graphs, breaks and recompiles per mode are printed beside the ratios. With
--cache static as well, it is a graph run (docs/graph-decode.md): prefill eager, the decode step compiled
alone with fixed shapes over a static KV cache, one graph per mode and batch size.

With --tune, `pto-patch tune` runs first (within --tune-budget seconds) and every bench run uses its
choice (`--use_dynamic_config`); --repeats runs bench that many times and prints each run's ratio,
their median and their minimum per batch size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--backend", default="fused", help="pto_kernels backend for the PTO mode")
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--output-length", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--model-path", type=Path, help="an existing patched folder instead of a new one")
    parser.add_argument("--keep", action="store_true", help="keep the built folder")
    parser.add_argument("--tune", action="store_true", help="run tune first; bench with its choice")
    parser.add_argument("--tune-budget", type=float, default=600.0, help="tune's --budget-s")
    parser.add_argument("--tune-batches", help="tune's --batches (default: --batches)")
    parser.add_argument("--tune-output-length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1, help="bench runs, each alternating both modes")
    parser.add_argument("--json", type=Path, help="write every run's numbers here")
    parser.add_argument("--compile", metavar="BACKEND", help="torch.compile both modes with this backend")
    parser.add_argument("--cache", default="auto", help="bench's --cache: auto, static or dynamic")
    parser.add_argument("--ops", help="the ops bench switches on (and tune chooses among), e.g. all")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="pto-bench-e2e-"))
    os.environ.setdefault("HF_MODULES_CACHE", str(work / "hf-modules"))  # before transformers is imported
    from pto_patch.patching import engine
    from pto_patch.run.bench import BenchOptions, run_bench
    from pto_patch.tiny import model as tiny_model
    from pto_patch.tune.tuning import TuneOptions, run_tune

    try:
        folder = args.model_path
        if folder is None:
            folder = work / "gutenocr-full-width"
            tiny_model.make_tiny(folder, full_width=True, layers=args.layers)
            engine.apply_patch(model_path=folder)
        record: dict = {"tune": None, "bench": []}
        if args.tune:
            started = time.perf_counter()
            tuned = run_tune(
                TuneOptions(
                    model_path=folder,
                    batches=args.tune_batches or args.batches,
                    output_length=args.tune_output_length,
                    budget_s=args.tune_budget,
                    dtype=args.dtype,
                    kernel_backend=None if args.backend == "auto" else args.backend,
                    use_compile=args.compile is not None,
                    compile_backend=args.compile or "inductor",
                    cache=args.cache,
                    ops=args.ops,
                )
            ).to_json()
            record["tune"] = tuned
            print(f"tune: {time.perf_counter() - started:.0f} s (budget {args.tune_budget:.0f} s)")
            for entry in tuned["batches"]:
                band = entry["ratio_to_baseline"]
                gain = f"{band['median']:.3f} [{band['low']:.3f}, {band['high']:.3f}]" if band else "-"
                print(
                    f"  batch {entry['batch']}: {entry['chosen'] or 'nothing on'} ({entry['decided']}) {gain}"
                )
        ratios: dict[int, list[float]] = {}
        for repeat in range(args.repeats):
            result = run_bench(
                BenchOptions(
                    model_path=folder,
                    kernel_backend=None if args.tune else args.backend,
                    batches=args.batches,
                    output_length=args.output_length,
                    warmup=args.warmup,
                    iters=args.iters,
                    dtype=args.dtype,
                    use_dynamic_config=args.tune,
                    output_dir=work / "results",
                    use_compile=args.compile is not None,
                    compile_backend=args.compile or "inductor",
                    cache=args.cache,
                    ops=args.ops,
                )
            )
            doc = result.to_json()
            record["bench"].append(doc)
            print(f"bench run {repeat + 1} of {args.repeats}")
            print(
                f"{'batch':>5} {'switched on':<28} {'baseline tok/s':>15} {'PTO tok/s':>10} {'ratio':>6}"
                f" {'median-run ratio':>17}"
            )
            for run in doc["runs"]:
                base, pto = run["baseline"], run["pto"]
                ratio = pto["tokens_per_s_median"] / base["tokens_per_s_median"]
                ratios.setdefault(run["batch"], []).append(ratio)
                print(
                    f"{run['batch']:>5} {','.join(run['switched_on']) or 'none':<28} {base['tokens_per_s']:>15.2f}"
                    f" {pto['tokens_per_s']:>10.2f} {pto['tokens_per_s'] / base['tokens_per_s']:>6.3f}"
                    f" {ratio:>17.3f}"
                )
            print(json.dumps(doc["bandwidth"]))
            if doc["compilation"]:
                print(f"compiled: {doc['compile']}")
                for name, mode in doc["compilation"]["modes"].items():
                    print(
                        f"  {name}: {mode['compiles']} compiles, {mode['graph_breaks']} graph breaks, "
                        f"{mode['recompiles']} recompiles"
                        + (f", decode graphs {mode['decode_graphs']}" if "decode_graphs" in mode else "")
                    )
            if doc["failures"]:
                print("failures:", *doc["failures"], sep="\n  ")
        if args.repeats > 1:
            print("PTO / baseline tokens/s (median runs) over the bench runs")
            for batch, values in ratios.items():
                shown = " ".join(f"{v:.3f}" for v in values)
                print(
                    f"  batch {batch}: {shown}  median {statistics.median(values):.3f}  min {min(values):.3f}"
                )
        if args.json:
            args.json.write_text(json.dumps(record, indent=2, default=str))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    main()
