"""What verify's per-dtype tolerance has to admit: the kernels' per-step logit differences from the eager
unpatched model, teacher-forced, at every generated step, in fp32, bf16 and fp16.

    python benchmarks/bench_tolerances.py [--json out.json] [--steps N] [--backends fused,torch|pypto|none]
                                          [--no-full-width] [--rounding]

Two models, both random weights from the spec (`make-tiny`): the default tiny model, and a full-width one
with a single decoder layer (GutenOCR-3B's widths: hidden 2048, intermediate 11008, 16 / 2 heads,
head_dim 128). Each is patched and run through verify's own judgement (`run.verify.verify_model`:
the unpatched model eager as the reference, the patched one with its kernels off, then on, each fed the
reference's tokens); per run it prints the distribution over the judged steps of the step's difference
(largest |score difference| over the reference's top 20, `run.judging`), its median and maximum, the
tolerance at the worst step (atol + rtol x max|logit|, `run.generation.DEFAULT_TOLERANCES`) and the worst
step's difference over its tolerance (the headroom: < 1 passes). `--rounding` adds, per model, the
unpatched eager run in bf16 and fp16 judged against the same model in fp32: the dtype's own rounding,
which a kernel rounding elsewhere than eager does may show. docs/proving-it.md quotes the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DTYPES = ("fp32", "bf16", "fp16")


def _model(root: Path, name: str, full_width: bool) -> Path:
    from pto_patch.patching import engine
    from pto_patch.tiny.model import make_tiny

    folder = root / name
    make_tiny(folder, full_width=full_width, layers=1 if full_width else None)
    engine.apply_patch(model_path=folder)
    return folder


def _row(model: str, dtype: str, backend: str, run: str, judgement) -> dict:
    diffs = [diff for _, diff, _ in judgement.step_diffs]
    return {
        "model": model,
        "dtype": dtype,
        "backend": backend,
        "run": run,
        "steps": len(diffs),
        "median_diff": statistics.median(diffs) if diffs else None,
        "max_diff": max(diffs) if diffs else None,
        "worst_step": judgement.worst_step,
        "tolerance_at_worst": judgement.worst_tolerance,
        "max_abs_logit_at_worst": judgement.worst_scale,
        "headroom": judgement.worst_relative,
        "choice_match_rate": judgement.choice_match_rate,
        "passed": judgement.passed,
    }


def measure(
    folder: Path, model: str, dtype: str, backend: str, steps: int, compiled: bool = False
) -> list[dict]:
    from pto_patch.run.verify import VerifyOptions, verify_model

    options = VerifyOptions(
        model_path=folder,
        dtype=dtype,
        kernel_backend=backend,
        output_length=steps,
        warmup=0,
        iters=1,
        use_compile=compiled,
    )
    report = verify_model(options)
    mode = "inductor " if compiled else ""
    rows = [_row(model, dtype, backend, mode + run, judgement) for run, judgement in report.judged.items()]
    for row in rows:
        row["failures"] = [failure for failure in report.failures if failure.startswith(row["run"])]
    return rows


def rounding(folder: Path, model: str, dtype: str, steps: int) -> dict:
    """The unpatched model eager in `dtype` judged against itself in fp32, teacher-forced: how far the
    dtype's own rounding moves the logits. A kernel that rounds at other places than eager (PyPTO keeps
    fp32 inside its tiles and rounds once per output) may differ from the eager run by about this much,
    so the dtype's tolerance must admit it."""
    from pto_patch.model.spec import load_spec
    from pto_patch.patching.originals import original_files
    from pto_patch.patching.patch_state import patch_state
    from pto_patch.run.device import resolve_device
    from pto_patch.run.generation import tolerances
    from pto_patch.run.inputs import encode_prompt
    from pto_patch.run.modes import JudgedCase, judged_generation
    from pto_patch.run.reference import Reference, unpatched_view

    spec, device = load_spec("gutenocr_3b"), resolve_device("cpu")
    with unpatched_view(folder, original_files(folder, patch_state(folder))) as view:
        exact = Reference(spec, device, "fp32", view)
        inputs, _ = encode_prompt(exact, None, None, False)
        truth = exact.generate(inputs, steps)
        exact.close()
        low = Reference(spec, device, dtype, view).loaded  # the same model, loaded in the dtype judged
        atol, rtol = tolerances(dtype, None, None)
        judgement = judged_generation(low, JudgedCase(inputs, truth), atol, rtol, "eager")
    return _row(model, dtype, "-", f"eager {dtype} vs fp32", judgement)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=24, help="new tokens per run (each step judged)")
    parser.add_argument("--backends", default="fused,torch", help="kernel backends (pypto: the interpreter)")
    parser.add_argument("--no-full-width", action="store_true", help="the tiny model only")
    parser.add_argument(
        "--rounding", action="store_true", help="also each dtype's eager run against the fp32 one"
    )
    parser.add_argument(
        "--compile", action="store_true", help="also verify --use_compile (inductor) in each dtype"
    )
    args = parser.parse_args()
    backends = [name.strip() for name in args.backends.split(",") if name.strip() and name.strip() != "none"]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-tolerances-") as holder:
        root = Path(holder)
        models = [("tiny", _model(root, "GutenOCR-tiny", False))]
        if not args.no_full_width:
            models.append(("full-width, 1 layer", _model(root, "GutenOCR-full-1", True)))
        for model, folder in models:
            if args.rounding:
                for dtype in DTYPES[1:]:
                    row = rounding(folder, model, dtype, args.steps)
                    rows.append(row)
                    _print(row)
            for dtype in DTYPES if backends else ():
                for backend in backends:
                    for compiled in (False, True) if args.compile else (False,):
                        for row in measure(folder, model, dtype, backend, args.steps, compiled):
                            rows.append(row)
                            _print(row)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


HEADER = False


def _print(row: dict) -> None:
    global HEADER
    if not HEADER:
        print(
            f"{'model':<20} {'dtype':<5} {'backend':<7} {'run':<20} {'steps':>5} {'median':>10} {'max':>10} "
            f"{'tolerance':>10} {'max/tol':>8} {'choices':>8}"
        )
        HEADER = True
    print(
        f"{row['model']:<20} {row['dtype']:<5} {row['backend']:<7} {row['run']:<20} {row['steps']:>5} "
        f"{row['median_diff']:>10.3g} {row['max_diff']:>10.3g} {row['tolerance_at_worst']:>10.3g} "
        f"{row['headroom']:>8.3g} {row['choice_match_rate']:>8.0%}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
