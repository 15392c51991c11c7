"""Per-op kernel benchmark: median time of each backend that runs here, side by side, ratio to eager.

    python benchmarks/bench_kernels.py [--json out.json] [--repeats N] [--quick]

Backends are timed round-robin within one run (same load on the machine). "ratio" is eager time divided by
the backend's time (> 1 is faster). MRoPE is timed as one 36-layer forward: fresh cos/sin tables, then 36
calls with them, as the decoder does. Also reports what a switched-off guard in the modeling code costs,
and PyPTO's SIM-mode cost-model estimate per kernel (cycles of a simulated Ascend core; no NPU needed),
each kernel compiled and simulated in its own subprocess with a time limit.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
import pto_kernels  # noqa: E402
from pto_kernels import fused, reference  # noqa: E402

LAYERS = 36


def _median_side_by_side(fns: dict, repeats: int, warmup: int = 3) -> dict[str, float]:
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _auto(op_call):
    def run():
        with pto_kernels.enabled(backend="auto"):
            return op_call()

    return run


def bench_rms_norm(repeats, quick):
    rows = []
    shapes = [(1, 1, 2048), (1, 8, 2048), (1, 32, 2048), (1, 128, 2048), (1, 1024, 2048), (1024, 1280)]
    if quick:
        shapes = shapes[:2]
    for shape in shapes:
        x = torch.randn(*shape, dtype=torch.bfloat16)
        w = (1 + 0.1 * torch.randn(shape[-1])).bfloat16()
        pto_kernels.enable(backend="auto")
        medians = _median_side_by_side(
            {
                "torch": lambda x=x, w=w: reference.rms_norm(x, w, 1e-6),
                "fused": lambda x=x, w=w: fused.rms_norm(x, w, 1e-6),
                "auto": lambda x=x, w=w: pto_kernels.rms_norm_wrapper(x, w, 1e-6),
            },
            repeats,
        )
        rows.append(("rms_norm", list(shape), medians))
    return rows


def bench_mrope(repeats, quick):
    rows = []
    for seq in [1, 128] if quick else [1, 16, 128, 512]:
        q = torch.randn(1, seq, 16, 128, dtype=torch.bfloat16).transpose(1, 2)
        k = torch.randn(1, seq, 2, 128, dtype=torch.bfloat16).transpose(1, 2)
        base_cos = torch.randn(3, 1, seq, 128, dtype=torch.bfloat16)
        base_sin = torch.randn(3, 1, seq, 128, dtype=torch.bfloat16)
        section = [16, 24, 24]

        def forward(fn, q=q, k=k, tables=(base_cos, base_sin)):
            def run():
                cos, sin = tables[0].clone(), tables[1].clone()  # each forward makes new tables
                for _ in range(LAYERS):
                    fn(q, k, cos, sin, [16, 24, 24])

            return run

        pto_kernels.enable(backend="auto")
        medians = _median_side_by_side(
            {
                "torch": forward(reference.mrope),
                "fused": forward(fused.mrope),
                "auto": forward(pto_kernels.mrope_pto_correct),
            },
            max(5, repeats // 4),
        )
        rows.append(("mrope x36 layers", [1, 16, seq, 128], medians))
        mixed_cos, mixed_sin = reference.mix_sections(base_cos, base_sin, section, 1)
        mixed_cos, mixed_sin = mixed_cos[:, 0], mixed_sin[:, 0]

        def forward_mixed(fn, q=q, k=k, tables=(mixed_cos, mixed_sin)):
            def run():
                cos, sin = tables[0].clone(), tables[1].clone()
                for _ in range(LAYERS):
                    fn(q, k, cos, sin)

            return run

        medians = _median_side_by_side(
            {
                "torch": forward_mixed(reference.mrope_mixed),
                "fused": forward_mixed(fused.mrope_mixed),
                "auto": forward_mixed(pto_kernels.mrope_mixed_wrapper),
            },
            max(5, repeats // 4),
        )
        rows.append(("mrope_mixed x36 layers", [1, 16, seq, 128], medians))
    return rows


def bench_mlp(repeats, quick):
    rows = []
    mlp = torch.nn.Module()
    mlp.gate_proj = torch.nn.Linear(2048, 11008, bias=False, dtype=torch.bfloat16)
    mlp.up_proj = torch.nn.Linear(2048, 11008, bias=False, dtype=torch.bfloat16)
    mlp.down_proj = torch.nn.Linear(11008, 2048, bias=False, dtype=torch.bfloat16)
    mlp.act_fn = torch.nn.SiLU()
    pto_kernels.enable(backend="auto")
    with torch.no_grad():
        for tokens in [1, 16] if quick else [1, 4, 8, 16, 128]:
            x = torch.randn(1, tokens, 2048, dtype=torch.bfloat16)
            medians = _median_side_by_side(
                {
                    "torch": lambda x=x: reference.swiglu_mlp(mlp, x),
                    "fused": lambda x=x: fused.swiglu_mlp(mlp, x),
                    "auto": lambda x=x: pto_kernels.swiglu_mlp_wrapper(mlp, x),
                },
                max(5, repeats // 4),
            )
            rows.append(("swiglu_mlp 2048->11008", [1, tokens, 2048], medians))
    return rows


def bench_guard() -> dict:
    """The injected guard with its switch off, as the patched modeling code runs it, per call."""
    pto_kernels.disable()
    setup = "import sys, pto_kernels"
    guard = (
        "k = sys.modules.get('pto_kernels')\nif k is not None and getattr(k, 'USE_PTO_RMS_NORM', False): pass"
    )
    number = 200_000
    with_guard = min(timeit.repeat(guard, setup, number=number, repeat=5)) / number
    empty = min(timeit.repeat("pass", setup, number=number, repeat=5)) / number
    return {"guard_ns": with_guard * 1e9, "loop_overhead_ns": empty * 1e9}


# --- PyPTO SIM cost model -----------------------------------------------------------------------------

SIM_TIMEOUT_S = 60
# GutenOCR widths: text hidden 2048, MLP 11008, 16 q / 2 kv heads of 128, mrope_section [16, 24, 24]
SIM_KERNELS = [
    ("rms_norm", {"rows": 1, "hidden": 2048}),
    ("rms_norm", {"rows": 128, "hidden": 2048}),
    ("mrope", {"seq": 1, "mixed": False}),
    ("mrope", {"seq": 1, "mixed": True}),
    ("mrope", {"seq": 128, "mixed": False}),
    ("swiglu_mlp", {"tokens": 1}),
    ("swiglu_mlp", {"tokens": 16}),
]


def _sim_child(request: str) -> None:
    """In the subprocess: build one kernel in SIM mode and call it once (pypto writes the report)."""
    from pto_kernels import pypto_kernels

    op, params = json.loads(request)
    bf16 = torch.bfloat16
    if op == "rms_norm":
        rows, hidden = params["rows"], params["hidden"]
        kernel = pypto_kernels._build_rms_norm(rows, hidden, bf16, 1e-6, "sim")
        x = torch.randn(rows, hidden, dtype=bf16)
        kernel(x, torch.ones(1, hidden, dtype=bf16), torch.empty_like(x))
    elif op == "mrope":
        seq, mixed = params["seq"], params["mixed"]
        kernel = pypto_kernels._build_mrope(1, 16, 2, seq, 128, bf16, bf16, (16, 24, 24), mixed, "sim")
        q, k = torch.randn(16 * seq, 128, dtype=bf16), torch.randn(2 * seq, 128, dtype=bf16)
        cos = torch.randn(seq if mixed else 3 * seq, 128, dtype=bf16)
        kernel(q, k, cos, cos.clone(), torch.empty_like(q), torch.empty_like(k))
    elif op == "swiglu_mlp":
        tokens = params["tokens"]
        kernel = pypto_kernels._build_swiglu_mlp(tokens, 2048, 11008, bf16, "sim")
        x = torch.randn(tokens, 2048, dtype=bf16)
        gate, up = torch.randn(11008, 2048, dtype=bf16), torch.randn(11008, 2048, dtype=bf16)
        kernel(x, gate, up, torch.randn(2048, 11008, dtype=bf16), torch.empty_like(x))
    else:
        raise ValueError(op)


def _report_number(text: str, label: str) -> float | None:
    match = re.search(rf"^\s*(?:\|--)?{re.escape(label)}[.\s]*:\s*([0-9.]+)", text, re.MULTILINE)
    return float(match.group(1)) if match else None


def _last_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.search(r"error|Error|ERROR|not found|Errcode", ln)]
    return (errors or lines or ["(no output)"])[-1][:300]


def _run_sim(op: str, params: dict, timeout_s: int) -> dict:
    entry = {"op": op, "params": params, "dtype": "bfloat16"}
    with tempfile.TemporaryDirectory(prefix="pto_sim_") as tmp:
        env = dict(os.environ, TILE_FWK_OUTPUT_DIR=tmp)
        env.pop("ASCEND_HOME_PATH", None)  # without CANN pypto must stay in SIM mode
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, __file__, "--sim-child", json.dumps([op, params])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,  # its own process group: a timeout also ends pypto's g++ children
        )
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return entry | {"status": "not available", "reason": f"SIM did not finish in {timeout_s} s"}
        entry["wall_s"] = round(time.perf_counter() - start, 1)
        reports = sorted(Path(tmp).glob("*/CostModelSimulationOutput/_simulate.stat.report.txt"))
        if proc.returncode != 0:
            return entry | {
                "status": "not available",
                "reason": f"exit {proc.returncode}: {_last_error_line(output)}",
            }
        if not reports:
            return entry | {
                "status": "not available",
                "reason": "no cost-model report: " + _last_error_line(output),
            }
        report = reports[-1].read_text()
        entry |= {
            "status": "ok",
            "total_cycles": _report_number(report, "Total Cycles"),
            "max_task_cycles": _report_number(report, "Max Task Cycles"),
            "tasks": _report_number(report, "Total Submit Tasks"),
            "aicore_end_to_end_us": _report_number(output, "AICore End-to-End Time"),
        }
    return entry


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_sim(sim: list[dict], timeout_s: int) -> None:
    if not sim:
        return
    print(f"\nPyPTO SIM cost model: bf16, one call, cycles of a simulated Ascend core ({timeout_s} s limit)")
    print(
        f"{'kernel':<12} {'params':<32} {'total cycles':>13} {'max task':>9} {'aicore us':>10} {'wall s':>7}"
    )
    for e in sim:
        params = json.dumps(e["params"])
        if e["status"] != "ok":
            print(f"{e['op']:<12} {params:<32} not available: {e['reason']}")
            continue
        print(
            f"{e['op']:<12} {params:<32} {_cell(e['total_cycles'], '.0f'):>13}"
            f" {_cell(e['max_task_cycles'], '.0f'):>9} {_cell(e['aicore_end_to_end_us'], '.2f'):>10}"
            f" {e['wall_s']:>7.1f}"
        )


def sim_cycles(quick: bool, timeout_s: int) -> list[dict]:
    import importlib.util

    kernels = [SIM_KERNELS[i] for i in (0, 2, 5)] if quick else SIM_KERNELS
    if importlib.util.find_spec("pypto") is None:
        return [
            {"op": op, "params": p, "status": "not available", "reason": "pypto not installed (extra `pto`)"}
            for op, p in kernels
        ]
    return [_run_sim(op, params, timeout_s) for op, params in kernels]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--quick", action="store_true", help="fewer shapes (a smoke run)")
    parser.add_argument("--no-sim", action="store_true", help="skip the PyPTO SIM cycle estimates")
    parser.add_argument("--sim-timeout", type=int, default=SIM_TIMEOUT_S, help="seconds per SIM kernel")
    parser.add_argument("--sim-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sim_child:
        _sim_child(args.sim_child)
        return
    torch.manual_seed(0)
    rows = bench_rms_norm(args.repeats, args.quick)
    rows += bench_mrope(args.repeats, args.quick)
    rows += bench_mlp(args.repeats, args.quick)
    guard = bench_guard()
    results = []
    print(
        f"{'op':<24} {'shape':<20} {'torch us':>10} {'fused us':>10} {'fused x':>8} {'auto us':>10} {'auto x':>7}"
    )
    for op, shape, med in rows:
        eager = med["torch"]
        entry = {
            "op": op,
            "shape": shape,
            "dtype": "bfloat16",
            "median_s": med,
            "ratio_to_eager": {name: eager / t for name, t in med.items()},
        }
        results.append(entry)
        r = entry["ratio_to_eager"]
        print(
            f"{op:<24} {str(shape):<20} {eager * 1e6:>10.1f} {med['fused'] * 1e6:>10.1f} {r['fused']:>8.2f}"
            f" {med['auto'] * 1e6:>10.1f} {r['auto']:>7.2f}"
        )
    print(
        f"switched-off guard: {guard['guard_ns']:.0f} ns per call (empty loop {guard['loop_overhead_ns']:.0f} ns)"
    )
    sim = [] if args.no_sim else sim_cycles(args.quick, args.sim_timeout)
    print_sim(sim, args.sim_timeout)
    doc = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "results": results,
        "guard": guard,
        "pypto_sim_cycles": sim,
    }
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
