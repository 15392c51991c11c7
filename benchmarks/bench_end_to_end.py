"""End to end at GutenOCR's real widths on this machine: baseline vs PTO tokens per second, side by side.

Builds `make-tiny --full-width --layers N` in a temporary folder (random weights, real shapes:
hidden 2048, intermediate 11008, 16 / 2 heads, head_dim 128), applies the patch, and runs
`pto-patch bench` with the chosen kernel backend in one process, so both modes see the same
machine state. Prints the PTO / baseline ratio of tokens per second per batch size; asserts nothing.

    python benchmarks/bench_end_to_end.py --layers 2 --backend fused --batches 1,4,8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
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
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="pto-bench-e2e-"))
    os.environ.setdefault("HF_MODULES_CACHE", str(work / "hf-modules"))  # before transformers is imported
    from pto_patch import engine, tiny_model
    from pto_patch.bench import BenchOptions, run_bench

    try:
        folder = args.model_path
        if folder is None:
            folder = work / "gutenocr-full-width"
            tiny_model.make_tiny(folder, full_width=True, layers=args.layers)
            engine.apply_patch(model_path=folder)
        result = run_bench(
            BenchOptions(
                model_path=folder,
                kernel_backend=args.backend,
                batches=args.batches,
                output_length=args.output_length,
                warmup=args.warmup,
                iters=args.iters,
                dtype=args.dtype,
                output_dir=work / "results",
            )
        )
        doc = result.to_json()
        print(
            f"{'batch':>5} {'baseline tok/s':>15} {'PTO tok/s':>10} {'ratio':>6} {'floor/step base':>16} {'PTO':>6}"
        )
        for run in doc["runs"]:
            base, pto = run["baseline"], run["pto"]
            print(
                f"{run['batch']:>5} {base['tokens_per_s']:>15.2f} {pto['tokens_per_s']:>10.2f} "
                f"{pto['tokens_per_s'] / base['tokens_per_s']:>6.3f} "
                f"{base['bandwidth_fraction'] or 0:>16.3f} {pto['bandwidth_fraction'] or 0:>6.3f}"
            )
        print(json.dumps(doc["bandwidth"]))
        if doc["failures"]:
            print("failures:", *doc["failures"], sep="\n  ")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    main()
