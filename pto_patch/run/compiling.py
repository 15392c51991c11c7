"""Compiling a run's model, and what the compiler did in each mode: compiles, graph breaks, recompiles.

`apply_compile` wraps `model.forward` once (torch.compile with dynamic shapes, or torchair's ACL
graph where asked and usable); both modes then run the same compiled forward. PTO mode's switches are
Python globals the modeling code reads, so the compiler guards on them: switching a mode on compiles
it once (a recompile by torch's count), and switching back reuses what was compiled.

`CompileWatch` attributes what torch's compiler counted to the mode that was switched on while it
happened: the graphs compiled, the graph breaks with their reasons, and the recompiles with theirs.
A graph break PTO mode adds to what the baseline has is a failure that names the break; breaks the
baseline has too (transformers' own vision code has some) are the model's, not PTO mode's.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Each mode compiles prefill and decode, for batch 1 and for larger batches (torch specialises size 1),
# and tune compiles one set per candidate: room for all of them before torch falls back to eager.
RECOMPILE_LIMIT = 64
TORCHAIR = "torchair"


@dataclass(frozen=True)
class CompileSetup:
    """How a run's model was compiled."""

    backend: str
    mode: str | None
    dynamic: bool | None

    @property
    def description(self) -> str:
        if self.backend == TORCHAIR:
            return "torchair npu backend, reduce-overhead (ACL graph)"
        return f"torch.compile(backend={self.backend!r}, mode={self.mode!r}, dynamic={self.dynamic})"

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "mode": self.mode, "dynamic": self.dynamic}


@dataclass
class CompiledMode:
    """What the compiler did while one mode was switched on."""

    compiles: int = 0
    graphs: int = 0
    breaks: Counter = field(default_factory=Counter)  # short reason -> count
    recompiles: list[str] = field(default_factory=list)  # one short reason each

    def to_json(self) -> dict[str, Any]:
        return {
            "compiles": self.compiles,
            "graphs": self.graphs,
            "graph_breaks": sum(self.breaks.values()),
            "break_reasons": dict(self.breaks),
            "recompiles": len(self.recompiles),
            "recompile_reasons": list(self.recompiles),
        }


@dataclass
class Compilation:
    """A compiled run: the set-up and each mode's compiler work."""

    setup: CompileSetup
    modes: dict[str, CompiledMode]

    def added_breaks(self, mode: str = "pto", against: str = "baseline") -> list[str]:
        """Break reasons `mode` has that `against` has not."""
        mine = self.modes.get(mode)
        theirs = self.modes.get(against)
        if mine is None:
            return []
        known = set(theirs.breaks) if theirs is not None else set()
        return sorted(reason for reason in mine.breaks if reason not in known)

    def failures_and_warnings(self) -> tuple[list[str], list[str]]:
        failures = [f"PTO mode breaks the compiled graph: {reason}" for reason in self.added_breaks()]
        warnings = []
        base = self.modes.get("baseline")
        if base is not None and base.breaks:
            count = sum(base.breaks.values())
            first = next(iter(base.breaks))
            warnings.append(
                f"the baseline itself breaks the compiled graph {count} time(s) (e.g. {first}); "
                "those are the model's, not PTO mode's"
            )
        return failures, warnings

    def to_json(self) -> dict[str, Any]:
        return {**self.setup.to_json(), "modes": {name: mode.to_json() for name, mode in self.modes.items()}}


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def short_reason(text: str) -> str:
    """One line for a torch compiler message: its first line, and the developer context where it has one."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return "unknown"
    short = lines[0]
    for line in lines[1:]:
        if line.startswith("Developer debug context:"):
            detail = line.removeprefix("Developer debug context:").strip()
            if detail:
                short = f"{short} ({detail})"
            break
    return _ADDRESS.sub("0x…", " ".join(short.split()))


class CompileWatch:
    """Attributes torch's compiler counters to the mode switched on when they moved.

    `wrap(switches)` returns switches that tell the watch which mode is on; `finish()` closes the last
    mode and returns what each mode compiled. Counters are read as differences, so work compiled before
    the watch began (another run in the same process) is not counted.
    """

    def __init__(self, setup: CompileSetup):
        self.setup = setup
        self.modes: dict[str, CompiledMode] = {}
        self._current: str | None = None
        self._breaks, self._graphs, self._compiles = self._read_counters()
        self._seen = {self._metric_key(metric) for metric in self._metrics()}

    @staticmethod
    def _read_counters() -> tuple[Counter, int, int]:
        from torch._dynamo.utils import counters

        return (
            Counter(dict(counters["graph_break"])),
            counters["stats"]["unique_graphs"],
            counters["frames"]["ok"],
        )

    @staticmethod
    def _metrics() -> list:
        from torch._dynamo.utils import get_compilation_metrics

        return list(get_compilation_metrics())

    @staticmethod
    def _metric_key(metric) -> tuple:
        return (str(metric.compile_id), metric.co_name, metric.co_filename, metric.start_time_us)

    def _close(self) -> None:
        breaks, graphs, compiles = self._read_counters()
        new = [metric for metric in self._metrics() if self._metric_key(metric) not in self._seen]
        if self._current is not None:
            mode = self.modes.setdefault(self._current, CompiledMode())
            mode.graphs += graphs - self._graphs
            mode.compiles += compiles - self._compiles
            for reason, count in (breaks - self._breaks).items():
                mode.breaks[short_reason(reason)] += count
            mode.recompiles += [short_reason(m.recompile_reason) for m in new if m.recompile_reason]
        self._breaks, self._graphs, self._compiles = breaks, graphs, compiles
        self._seen.update(self._metric_key(metric) for metric in new)

    def switch(self, mode: str) -> None:
        self._close()
        self._current = mode

    def wrap(self, switches: dict[str, Callable[[], None]]) -> dict[str, Callable[[], None]]:
        def switching(name: str, select: Callable[[], None]) -> Callable[[], None]:
            def switch() -> None:
                self.switch(name)
                select()

            return switch

        return {name: switching(name, select) for name, select in switches.items()}

    def finish(self) -> Compilation:
        self._close()
        self._current = None
        return Compilation(self.setup, dict(self.modes))


def finish_watch(watch: CompileWatch | None, failures: list[str], warnings: list[str]) -> Compilation | None:
    """Close a run's watch and add its verdict (a break PTO mode added fails) to the run's messages."""
    if watch is None:
        return None
    compilation = watch.finish()
    more_failures, more_warnings = compilation.failures_and_warnings()
    failures += more_failures
    warnings += more_warnings
    return compilation


def apply_compile(model, options, warnings: list[str]) -> CompileSetup | None:
    """Wrap model.forward: torchair's ACL graph where asked and usable, else torch.compile with dynamic
    shapes (one compile serves every prompt length). torchair's GE mode is refused per op by `enable()`
    (pto_kernels.ops.refuse_graph_mode) once torchair is imported, as it is here."""
    if not (options.use_compile or options.use_acl_graph):
        return None
    import torch

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    if options.warmup == 0:
        warnings.append("--warmup 0 with a compiled model: each mode's first timed run includes compiling it")
    if options.use_acl_graph:
        try:
            import torchair

            config = torchair.CompilerConfig()
            config.mode = "reduce-overhead"
            backend = torchair.get_npu_backend(compiler_config=config)
        except Exception as exc:  # torchair missing, or present without torch_npu / CANN
            warnings.append(
                f"--use_acl_graph: torchair is not usable here ({type(exc).__name__}); "
                f"using torch.compile(backend={options.compile_backend!r}) instead"
            )
        else:
            # ACL graph replays fixed shapes: dynamic shapes are not supported in reduce-overhead mode.
            model.forward = torch.compile(model.forward, backend=backend, dynamic=False)
            return CompileSetup(TORCHAIR, "reduce-overhead", False)
    model.forward = torch.compile(
        model.forward, backend=options.compile_backend, mode=options.compile_mode, dynamic=True
    )
    return CompileSetup(options.compile_backend, options.compile_mode, True)
