"""What a switched-on op costs on top of its kernel: the guard, the wrapper, routing and counting.

    python benchmarks/bench_dispatch.py [--json out.json] [--number N] [--repeat R]

Every backend's kernel is replaced by a no-op that returns its input, so what is timed is the path the
patched modeling code takes from its guard to the kernel and back. "direct" calls the no-op itself; the
difference is the dispatch overhead per call. A real RMSNorm at decode (1 x 2048, bf16) is timed the same
way for scale. Minimum over repeats (the least disturbed run), since the quantity is a fixed cost.
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
import pto_kernels  # noqa: E402
from pto_kernels import _dispatch  # noqa: E402
from pto_kernels.backends import fused  # noqa: E402

# The injected RMSNorm guard, as the patched modeling code runs it (templates/injections/rms_norm.py).
GUARD = """
pto_kernels = sys.modules.get("pto_kernels")
if pto_kernels is not None and getattr(pto_kernels, "USE_PTO_RMS_NORM", False):
    pto_kernels.rms_norm_wrapper(x, w, 1e-6)
"""


def _noop_backend() -> types.ModuleType:
    module = types.ModuleType("noop_backend")
    module.rms_norm = lambda hidden_states, weight, eps=1e-6: hidden_states
    return module


def _time(stmt: str, namespace: dict, number: int, repeat: int) -> float:
    return min(timeit.repeat(stmt, globals=namespace, number=number, repeat=repeat)) / number


def measure(number: int, repeat: int) -> dict[str, float]:
    x = torch.randn(1, 1, 2048, dtype=torch.bfloat16)
    w = torch.ones(2048, dtype=torch.bfloat16)
    noop = _noop_backend()
    namespace = {"sys": sys, "x": x, "w": w, "noop": noop, "fused": fused}
    results: dict[str, float] = {}
    saved = dict(_dispatch._modules)
    try:
        _dispatch._modules["fused"] = noop  # "auto" on a CPU tensor routes to fused
        if hasattr(_dispatch, "_routes"):
            _dispatch._routes.clear()
        pto_kernels.enable("rms_norm", backend="auto")
        results["noop_direct_ns"] = _time("noop.rms_norm(x, w, 1e-6)", namespace, number, repeat) * 1e9
        results["noop_wrapper_ns"] = (
            _time("sys.modules['pto_kernels'].rms_norm_wrapper(x, w, 1e-6)", namespace, number, repeat) * 1e9
        )
        results["noop_guard_ns"] = _time(GUARD, namespace, number, repeat) * 1e9
    finally:
        _dispatch._modules.clear()
        _dispatch._modules.update(saved)
        if hasattr(_dispatch, "_routes"):
            _dispatch._routes.clear()
    pto_kernels.enable("rms_norm", backend="auto")
    small = max(number // 20, 100)
    results["fused_direct_ns"] = _time("fused.rms_norm(x, w, 1e-6)", namespace, small, repeat) * 1e9
    results["fused_guard_ns"] = _time(GUARD, namespace, small, repeat) * 1e9
    pto_kernels.disable()
    results["dispatch_overhead_ns"] = results["noop_guard_ns"] - results["noop_direct_ns"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument("--number", type=int, default=200_000, help="calls per repeat")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    results = measure(args.number, args.repeat)
    for key, value in results.items():
        print(f"{key:<22} {value:>10.0f}")
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "per_call_ns": results}, indent=2))


if __name__ == "__main__":
    main()
