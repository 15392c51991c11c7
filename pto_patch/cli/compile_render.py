"""The text of a compiled run: how the model was compiled, and per mode what the compiler and the captures did."""

from __future__ import annotations

from pto_patch.cli.console import out


def compilation_text(description: str | None, compilation) -> None:
    """How the model was compiled, and per mode what the compiler did (breaks named in the messages)."""
    if not description:
        return
    out.print(f"  compiled: {description}", markup=False)
    for name, mode in compilation.modes.items() if compilation is not None else ():
        out.print(
            f"    {name}: {mode.compiles} compile(s), {mode.graphs} graph(s), "
            f"{sum(mode.breaks.values())} graph break(s), {len(mode.recompiles)} recompile(s)"
        )
        if mode.decode_steps:  # a graph run: decode compiled alone over its cache
            graphs = ", ".join(f"{key}: {count}" for key, count in mode.decode_graphs.items())
            captures = "not counted" if mode.captures is None else mode.captures
            out.print(
                f"      decode: {mode.decode_steps} step(s); graphs per batch and cache: {graphs}; "
                f"captures: {captures}; compiled while timed: {mode.timed_graphs}",
                markup=False,
            )
            _captures(mode.capture_summary())


def _captures(summary: dict) -> None:
    """Per mode: kernels built before and during the captures, fallbacks during them, each graph's ops."""
    fallbacks = ", ".join(f"{op} {n}" for op, n in summary["fallbacks_during"].items()) or "0"
    out.print(
        f"      before capture: {summary['kernels_built_before']} PyPTO kernel(s) built; during capture: "
        f"{summary['kernels_built_during']} built, fallbacks {fallbacks}",
        markup=False,
    )
    for graph in summary["graphs"]:
        if graph["graph_ops"] is None or not (graph["graph_ops"] or graph["eager_calls"]):
            continue
        held = ", ".join(f"{op} {n}" for op, n in sorted(graph["graph_ops"].items())) or "none"
        eager = ", ".join(f"{op} {n}" for op, n in sorted(graph["eager_calls"].items())) or "none"
        out.print(
            f"      graph for {graph['key']}: pto_kernels ops {held} (an eager step calls {eager})",
            markup=False,
        )
