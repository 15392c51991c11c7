"""vLLM with and without the pto_kernels plugin's ops: tokens per second per batch size, side by side.

Builds `make-tiny --full-width --layers N` in a temporary folder (random weights, GutenOCR's real text
widths: hidden 2048, intermediate 11008, 16 / 2 heads, head_dim 128), then runs it through vLLM
(`pto_patch.serving.vllm_engine`, one process per run) without the plugin's ops and with them
($PTO_KERNELS_VLLM_OPS), alternating the modes for --rounds rounds so both see the same machine state.
Each run times every batch size --iters times after --warmup; a mode's figure is the median over all its
runs' timings. Prints tokens/s per mode and the ratio pto / baseline per batch size; asserts nothing.
Run it with an interpreter that has vLLM (the vLLM lane's environment, .ci/vllm_lane):

    .venv-vllm/bin/python benchmarks/bench_vllm.py --layers 2 --batches 1,8 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def _run(mode: str, request: dict, ops: str, backend: str, work: Path, compiled: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PTO_KERNELS_VLLM_OPS"}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_ALLOW_INSECURE_SERIALIZATION="1", HF_HUB_OFFLINE="1")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    if mode == "pto":
        env.update(PTO_KERNELS_VLLM_OPS=ops, PTO_KERNELS_BACKEND=backend)
    request_file, out_file = work / f"{mode}.request.json", work / f"{mode}.json"
    request_file.write_text(json.dumps({**request, "compiled": compiled}))
    command = [sys.executable, "-m", "pto_patch.serving.vllm_engine", str(request_file), str(out_file)]
    log = work / f"{mode}.log"
    with open(log, "w") as handle:
        done = subprocess.run(command, env=env, stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.exit(f"{mode} run failed (exit {done.returncode}); see {log}")
    return json.loads(out_file.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--ops", default="all", help="PTO_KERNELS_VLLM_OPS for the PTO mode")
    parser.add_argument("--backend", default="fused", help="PTO_KERNELS_BACKEND for the PTO mode")
    parser.add_argument("--output-length", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2, help="baseline, pto, baseline, pto, ...")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--compiled", action="store_true", help="vLLM's torch.compile instead of eager")
    parser.add_argument("--model-path", type=Path, help="an existing unpatched folder instead of a new one")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    args = parser.parse_args()
    batches = tuple(int(b) for b in args.batches.split(","))

    work = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    try:
        folder = args.model_path
        if folder is None:
            from pto_patch.tiny.model import make_tiny

            folder = work / "full-width"
            make_tiny(folder, full_width=True, layers=args.layers)
        request = {
            "model_path": str(folder),
            "prompt": "Read all text in the image and return a single TEXT string.",
            "dtype": args.dtype,
            "batch": 1,
            "output_length": args.output_length,
            "warmup": args.warmup,
            "iters": args.iters,
            "timed_batches": list(batches),
        }
        tokens_per_s: dict[str, dict[int, list[float]]] = {"baseline": {}, "pto": {}}
        calls: dict = {}
        for round_index in range(args.rounds):
            for mode in ("baseline", "pto"):
                result = _run(mode, request, args.ops, args.backend, work, args.compiled)
                for batch in batches:
                    tokens_per_s[mode].setdefault(batch, []).extend(
                        result["by_batch"][str(batch)]["tokens_per_s"]
                    )
                if mode == "pto":
                    calls = {op: entry["calls"] for op, entry in result["workers"][0]["stats"].items()}
                print(f"round {round_index + 1} {mode}: load {result['load_s']:.1f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows = []
    print(
        f"\nvLLM, {args.layers} full-width layers, {args.dtype}, {'compiled' if args.compiled else 'eager'}, "
        f"{args.output_length} new tokens, ops {args.ops} on {args.backend}; pto calls in the last run: {calls}"
    )
    print(
        f"{'batch':>5} {'baseline tok/s':>15} {'pto tok/s':>10} {'ratio':>6}  (medians of {args.rounds} x {args.iters})"
    )
    for batch in batches:
        base = statistics.median(tokens_per_s["baseline"][batch])
        pto = statistics.median(tokens_per_s["pto"][batch])
        rows.append(
            {
                "batch": batch,
                "baseline_tokens_per_s": base,
                "pto_tokens_per_s": pto,
                "ratio": pto / base,
                "baseline_runs": tokens_per_s["baseline"][batch],
                "pto_runs": tokens_per_s["pto"][batch],
            }
        )
        print(f"{batch:>5} {base:>15.2f} {pto:>10.2f} {pto / base:>6.3f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"rows": rows, "options": vars(args) | {"json": str(args.json)}}, indent=2, default=str
            )
        )


if __name__ == "__main__":
    main()
