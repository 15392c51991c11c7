"""Per-op kernel benchmark: median time of each backend that runs here, side by side, ratio to eager.

    python benchmarks/bench_kernels.py [--json out.json] [--repeats N] [--quick]

Backends are timed round-robin within one run (same load on the machine). "ratio" is eager time divided by
the backend's time (> 1 is faster). MRoPE is timed as one 36-layer forward: fresh cos/sin tables, then 36
calls with them, as the decoder does. Also reports what a switched-off guard in the modeling code costs,
and, for one decode shape per kernel, PyPTO's SIM cost-model estimate (a whole simulated 910B chip, not
hardware; no NPU needed). benchmarks/bench_sim.py covers every shape with roofline ratios.
"""

import argparse
import importlib.util
import json
import statistics
import sys
import time
import timeit
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
import pto_kernels  # noqa: E402
from pto_kernels.backends import fused, reference  # noqa: E402

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


def _linear(out_features, in_features, bias):
    return torch.nn.Linear(in_features, out_features, bias=bias, dtype=torch.bfloat16)


def bench_blocks(repeats, quick):
    """The decoder-layer blocks at GutenOCR-3B's widths: the eager sequence of ops they replace ("torch",
    reference.py's composition) against the fused entry and the wrapper with the blocks switched on."""
    rows = []
    heads, kv_heads, head_dim, hidden = 16, 2, 128, 2048
    attention = torch.nn.Module()
    attention.q_proj, attention.k_proj = (
        _linear(heads * head_dim, hidden, True),
        _linear(kv_heads * head_dim, hidden, True),
    )
    attention.v_proj, attention.head_dim = _linear(kv_heads * head_dim, hidden, True), head_dim
    o_proj = _linear(hidden, heads * head_dim, False)
    norm = torch.nn.Module()
    norm.weight, norm.variance_epsilon = torch.nn.Parameter((1 + 0.1 * torch.randn(hidden)).bfloat16()), 1e-6
    mlp = torch.nn.Module()
    mlp.gate_proj, mlp.up_proj = _linear(11008, hidden, False), _linear(11008, hidden, False)
    mlp.down_proj, mlp.act_fn = _linear(hidden, 11008, False), torch.nn.SiLU()
    pto_kernels.enable(("residual_rms_norm", "mlp_block", "attention_prologue"), backend="auto")
    with torch.no_grad():
        for tokens in [1, 16] if quick else [1, 4, 16, 128]:
            for op, (eager, fast, wrapped) in _block_cases(tokens, attention, o_proj, norm, mlp).items():
                repeat = max(5, repeats // (4 if op == "mlp_block" else 1))
                medians = _median_side_by_side({"torch": eager, "fused": fast, "auto": wrapped}, repeat)
                rows.append((op, [1, tokens, hidden], medians))
    return rows


def _block_cases(tokens, attention, o_proj, norm, mlp):
    """op -> (eager, fused, wrapper) calls on random inputs of `tokens` rows."""
    hidden, head_dim = norm.weight.shape[0], attention.head_dim
    x, residual = (torch.randn(1, tokens, hidden, dtype=torch.bfloat16) for _ in range(2))
    attn = torch.randn(1, tokens, o_proj.weight.shape[1], dtype=torch.bfloat16)
    cos, sin = (torch.randn(1, tokens, head_dim, dtype=torch.bfloat16) for _ in range(2))
    q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
    prologue = (
        x,
        norm.weight,
        1e-6,
        q.weight,
        q.bias,
        k.weight,
        k.bias,
        v.weight,
        v.bias,
        cos,
        sin,
        head_dim,
    )
    block = (residual, attn, o_proj.weight, None, norm.weight, 1e-6)
    block += (mlp.gate_proj.weight, None, mlp.up_proj.weight, None, mlp.down_proj.weight, None)
    return {
        "residual_rms_norm": (
            lambda: reference.residual_rms_norm(x, residual, norm.weight, 1e-6),
            lambda: fused.residual_rms_norm(x, residual, norm.weight, 1e-6),
            lambda: pto_kernels.residual_rms_norm_wrapper(x, residual, norm),
        ),
        "mlp_block": (
            lambda: reference.mlp_block(*block),
            lambda: fused.mlp_block(*block),
            lambda: pto_kernels.mlp_block_wrapper(residual, attn, o_proj, norm, mlp),
        ),
        "attention_prologue": (
            lambda: reference.attention_prologue_mixed(*prologue),
            lambda: fused.attention_prologue_mixed(*prologue),
            lambda: pto_kernels.attention_prologue_mixed_wrapper(attention, norm, x, cos, sin),
        ),
    }


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


# --- PyPTO SIM cost model (benchmarks/bench_sim.py) --------------------------------------------------

SIM_TIMEOUT_S = 600


def sim_estimates(timeout_s: int) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_sim

    entries = bench_sim.sim_entries(bench_sim.QUICK, timeout_s)
    if importlib.util.find_spec("pypto") is None:
        print("PyPTO SIM cost model: not available: pypto not installed (extra `pto`)")
    else:
        bench_sim.print_table(entries, bench_sim.soc_config())
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--quick", action="store_true", help="fewer shapes (a smoke run)")
    parser.add_argument("--no-sim", action="store_true", help="skip the PyPTO SIM cost-model estimates")
    parser.add_argument("--sim-timeout", type=int, default=SIM_TIMEOUT_S, help="seconds per SIM kernel")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = bench_rms_norm(args.repeats, args.quick)
    rows += bench_mrope(args.repeats, args.quick)
    rows += bench_mlp(args.repeats, args.quick)
    rows += bench_blocks(args.repeats, args.quick)
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
    print()
    sim = [] if args.no_sim else sim_estimates(args.sim_timeout)
    doc = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "results": results,
        "guard": guard,
        "pypto_sim": sim,
    }
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
