"""Compiling a run's model, and what the compiler did in each mode: compiles, graph breaks, recompiles.

`apply_compile` wraps `model.forward` once; both modes then run the same compiled forward. A graph run
(`--use_acl_graph`, a capturing `--mode`, or `--cache static`) compiles the decode step alone with fixed
shapes over a static KV cache (`run.graph.graph_decode`: prefill eager, decode one graph per batch size);
otherwise torch.compile with dynamic shapes over the whole forward and transformers' growing cache. PTO mode's switches are
Python globals the modeling code reads, so the compiler guards on them: switching a mode on compiles
it once (a recompile by torch's count), and switching back reuses what was compiled.

`CompileWatch` attributes what torch's compiler counted to the mode that was switched on while it
happened: the graphs compiled, the graph breaks with their reasons, and the recompiles with theirs.
A graph break PTO mode adds to what the baseline has is a failure that names the break; breaks the
baseline has too (transformers' own vision code has some) are the model's, not PTO mode's. In a graph
run it also counts, per mode, the decode steps, the graphs compiled per batch size and cache, the ACL
graph captures torchair recorded, and graphs compiled during timed runs: a decode that compiles more
than one graph for one batch size and cache recompiles per step, a failure naming the guard.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pto_patch.errors import PtoPatchError
from pto_patch.run.graph import acl_graph, graph_decode
from pto_patch.run.graph.acl_graph import AclGraphBackend
from pto_patch.run.graph.graph_decode import GraphDecode

# Each mode compiles prefill and decode, for batch 1 and for larger batches (torch specialises size 1),
# and tune compiles one set per candidate: room for all of them before torch falls back to eager.
RECOMPILE_LIMIT = 64
TORCHAIR = "torchair"
# torch.compile modes that capture CUDA graphs (inductor's cudagraph trees): they need fixed shapes.
CAPTURING_MODES = ("reduce-overhead", "max-autotune")


@dataclass(frozen=True)
class CompileSetup:
    """How a run's model was compiled."""

    backend: str
    mode: str | None
    dynamic: bool | None
    cache: str = graph_decode.DYNAMIC  # the KV cache generation runs with
    captured: tuple[str, ...] = ()  # phases captured as device graphs ("decode")
    fullgraph: bool = False
    acl_graph: AclGraphBackend | None = None
    decode: GraphDecode | None = field(default=None, compare=False, repr=False)  # a graph run's forward

    @property
    def graph_run(self) -> bool:
        """Decode compiled alone with fixed shapes: one graph per batch size and cache, replayed per step."""
        return self.decode is not None

    @property
    def description(self) -> str:
        if self.backend == TORCHAIR:
            kind = self.acl_graph.kind if self.acl_graph is not None else acl_graph.REDUCE_OVERHEAD
            text = f"torchair {kind} (ACL graph), fullgraph, dynamic=False"
        else:
            text = f"torch.compile(backend={self.backend!r}, mode={self.mode!r}, dynamic={self.dynamic})"
        if not self.graph_run:
            return text
        captured = f"{', '.join(self.captured)} captured" if self.captured else "nothing captured"
        return f"{text}; decode compiled alone over a {self.cache} cache, prefill eager; {captured}"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"backend": self.backend, "mode": self.mode, "dynamic": self.dynamic}
        if self.graph_run:  # eager-prefill graph runs only: a dynamic-shape run's record is as it was
            data |= {
                "cache": self.cache,
                "cache_bucket": graph_decode.CACHE_BUCKET if self.cache == graph_decode.STATIC else None,
                "prefill": "eager",
                "captured_phases": list(self.captured),
                "fullgraph": self.fullgraph,
                "acl_graph": None if self.acl_graph is None else self.acl_graph.to_json(),
            }
        return data


@dataclass
class CompiledMode:
    """What the compiler did while one mode was switched on."""

    compiles: int = 0
    graphs: int = 0
    breaks: Counter = field(default_factory=Counter)  # short reason -> count
    recompiles: list[str] = field(default_factory=list)  # one short reason each
    decode_steps: int = 0  # a graph run's decode calls through the compiled forward
    decode_graphs: Counter = field(default_factory=Counter)  # "batch B, static cache N" -> graphs compiled
    timed_graphs: int = 0  # graphs compiled during timed runs
    captures: int | None = None  # ACL graph captures torchair recorded (None: not counted)
    capture_records: list = field(default_factory=list)  # graph_decode.CaptureRecord, one per capture key

    def capture_summary(self) -> dict[str, Any]:
        """Kernels built before and during the captures, fallbacks during them, and each graph's ops."""
        built_during: Counter = Counter()
        fallbacks: Counter = Counter()
        for record in self.capture_records:
            built_during.update(record.built_during)
            fallbacks.update(record.fallbacks_during)
        return {
            "kernels_built_before": sum(record.built_before for record in self.capture_records),
            "kernels_built_during": sum(built_during.values()),
            "built_during": dict(built_during),
            "fallbacks_during": dict(fallbacks),
            "graphs": [record.to_json() for record in self.capture_records],
        }

    def to_json(self) -> dict[str, Any]:
        data = {
            "compiles": self.compiles,
            "graphs": self.graphs,
            "graph_breaks": sum(self.breaks.values()),
            "break_reasons": dict(self.breaks),
            "recompiles": len(self.recompiles),
            "recompile_reasons": list(self.recompiles),
        }
        if self.decode_steps:
            data |= {
                "decode_steps": self.decode_steps,
                "decode_graphs": dict(self.decode_graphs),
                "timed_graphs": self.timed_graphs,
                "captures": self.captures,
                "capture": self.capture_summary(),
            }
        return data

    def recompiled_per_step(self) -> dict[str, int]:
        """Batch-and-cache keys whose decode compiled more than one graph: a recompile per step."""
        return {key: count for key, count in self.decode_graphs.items() if count > 1}


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
        failures += self.graph_failures()
        warnings = self.graph_warnings()
        base = self.modes.get("baseline")
        if base is not None and base.breaks:
            count = sum(base.breaks.values())
            first = next(iter(base.breaks))
            warnings.append(
                f"the baseline itself breaks the compiled graph {count} time(s) (e.g. {first}); "
                "those are the model's, not PTO mode's"
            )
        return failures, warnings

    def graph_failures(self) -> list[str]:
        """A graph run whose decode recompiles per step, or whose timed runs compiled, fails."""
        if not self.setup.graph_run:
            return []
        failures = []
        for name, mode in self.modes.items():
            for key, count in mode.recompiled_per_step().items():
                guard = per_step_guard(mode.recompiles)
                failures.append(
                    f"{name}: decode recompiles per step under a graph run ({count} graphs for {key}); guard: {guard}"
                )
            if mode.timed_graphs:
                failures.append(
                    f"{name}: timed runs compiled {mode.timed_graphs} graph(s): the timings hold compiles"
                )
            if self.setup.captured:
                failures += capture_failures(name, mode.capture_records)
        return failures

    def graph_warnings(self) -> list[str]:
        """A captured graph that holds another number of pto_kernels ops than one eager step calls."""
        warnings = []
        for name, mode in self.modes.items():
            for record in mode.capture_records:
                if (
                    record.graph_ops is not None
                    and record.eager_calls
                    and record.graph_ops != record.eager_calls
                ):
                    warnings.append(
                        f"{name}: the graph for {record.key} holds pto_kernels ops {record.graph_ops}, "
                        f"one eager decode step calls {record.eager_calls}"
                    )
        return warnings

    def to_json(self) -> dict[str, Any]:
        return {**self.setup.to_json(), "modes": {name: mode.to_json() for name, mode in self.modes.items()}}


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_NUMBER = re.compile(r"\d+")


def capture_failures(mode: str, records) -> list[str]:
    """A capture that built a kernel or fell back: on a device the graph would replay the torch fallback."""
    failures = []
    for record in records:
        for op, count in sorted(record.built_during.items()):
            failures.append(
                f"{mode}: {op} built {count} PyPTO kernel(s) inside the capture of {record.key}: "
                "on a device that compile fails and the graph replays the torch fallback"
            )
        for op, count in sorted(record.fallbacks_during.items()):
            if op not in record.built_during:
                failures.append(
                    f"{mode}: {op} fell back {count} time(s) inside the capture of {record.key}: "
                    "the graph replays the torch fallback, not the kernel"
                )
    return failures


def per_step_guard(reasons: list[str]) -> str:
    """The guard a per-step recompile fails: the most frequent reason, numbers aside (each step's
    differs only in them: a cache length, a counter), given as its latest instance."""
    if not reasons:
        return "no recompile reason recorded"
    shapes = Counter(_NUMBER.sub("N", reason) for reason in reasons)
    commonest = shapes.most_common(1)[0][0]
    return next(reason for reason in reversed(reasons) if _NUMBER.sub("N", reason) == commonest)


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
        self._decode_seen = len(setup.decode.calls) if setup.decode is not None else 0
        self._captures_seen = len(setup.decode.captures) if setup.decode is not None else 0
        self._captures = acl_graph.captures()

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
            self._close_decode(mode)
        self._breaks, self._graphs, self._compiles = breaks, graphs, compiles
        self._seen.update(self._metric_key(metric) for metric in new)
        if self.setup.decode is not None:
            self._decode_seen = len(self.setup.decode.calls)
            self._captures_seen = len(self.setup.decode.captures)
        self._captures = acl_graph.captures()

    def _close_decode(self, mode: CompiledMode) -> None:
        decode = self.setup.decode
        if decode is None:
            return
        for call in decode.calls[self._decode_seen :]:
            mode.decode_steps += 1
            mode.decode_graphs[call.key] += call.graphs
            mode.timed_graphs += call.graphs if call.timed else 0
        mode.capture_records += decode.captures[self._captures_seen :]
        now = acl_graph.captures()
        if self.setup.backend == TORCHAIR and now is not None:
            mode.captures = (mode.captures or 0) + now - (self._captures or 0)

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


def _whole(compiled):
    """A fullgraph decode that breaks: one line naming the break, not torch's traceback."""
    import torch

    def run(*args, **kwargs):
        try:
            return compiled(*args, **kwargs)
        except torch._dynamo.exc.Unsupported as exc:
            raise PtoPatchError(
                f"the decode step does not compile whole for ACL graph (fullgraph=True): {short_reason(exc)}",
                "run the same verify with --use_compile --cache static instead of --use_acl_graph: "
                "its report names every graph break per mode",
            ) from exc

    return run


def cache_kind(options) -> str:
    """The KV cache a compiled run generates with: static for graph runs unless asked otherwise."""
    chosen = getattr(options, "cache", graph_decode.AUTO)
    if chosen != graph_decode.AUTO:
        return chosen
    graph = options.use_acl_graph or options.compile_mode in CAPTURING_MODES
    return graph_decode.STATIC if graph else graph_decode.DYNAMIC


# torch 2.9.0's CPU inductor, with dynamic shapes, writes the bounds check of an indexed load before the
# index it checks in transformers' attention-mask kernel ("'tmp2' was not declared in this scope", a C++
# compile error; seen on 2.9.0, not on 2.13.0 or 2.14.1; 2.10 - 2.12 untested, so treated as 2.9).
INDUCTOR_CPU_BOUNDS_CHECK_FIXED = (2, 13)


def inductor_workarounds(backend: str | None, device_kind: str) -> list[str]:
    """Set what this torch's inductor needs to compile a patched model here; one note per setting."""
    if backend != "inductor" or device_kind != "cpu":
        return []
    import torch

    release = tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2])
    if release >= INDUCTOR_CPU_BOUNDS_CHECK_FIXED:
        return []
    import torch._inductor.config as inductor

    inductor.assert_indirect_indexing = False
    return [
        f"torch {torch.__version__}: inductor's index bounds checks are off on the CPU (its C++ code "
        "checks an index before defining it in transformers' mask kernel; fixed by torch 2.13)"
    ]


def apply_compile(model, options, warnings: list[str], kernels=None) -> CompileSetup | None:
    """Wrap model.forward for a compiled run (None when the run is eager).

    A graph run (`--use_acl_graph`, a capturing `--mode`, or a static cache) compiles the decode step
    alone with fixed shapes (`graph_decode`): torchair's ACL graph with the reference's settings where
    torchair is usable, else torch.compile with `--backend`. Any other compiled run wraps the whole
    forward with dynamic shapes (one compile serves every prompt length). torchair's GE mode is refused
    per op by `enable()` (pto_kernels.ops.refuse_graph_mode) once torchair is imported, as it is here."""
    if not (options.use_compile or options.use_acl_graph):
        return None
    import torch

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    device_kind = getattr(getattr(model, "device", None), "type", "cpu")
    warnings += inductor_workarounds(options.compile_backend, device_kind)
    cache = cache_kind(options)
    graph = options.use_acl_graph or cache == graph_decode.STATIC
    if options.warmup == 0:
        warnings.append(
            "--warmup 0 with a graph run: one untimed capture run per mode and batch size runs anyway"
            if graph
            else "--warmup 0 with a compiled model: one untimed run per mode runs anyway, compiling it"
        )
    if not graph:
        model.forward = torch.compile(
            model.forward, backend=options.compile_backend, mode=options.compile_mode, dynamic=True
        )
        return CompileSetup(options.compile_backend, options.compile_mode, True)
    static = cache == graph_decode.STATIC
    if options.use_acl_graph:
        torchair = acl_graph.import_torchair()
        if torchair is None:
            warnings.append(
                "--use_acl_graph: torchair is not usable here; "
                f"using torch.compile(backend={options.compile_backend!r}) over the decode step instead"
            )
        else:
            chosen = acl_graph.acl_graph_backend(torchair)
            warnings += [f"torchair: {note}" for note in chosen.notes]
            graph_ops = graph_decode.GraphOps()
            compiled = _whole(
                torch.compile(
                    model.forward,
                    backend=graph_ops.backend(chosen.backend, None, chosen.options),
                    fullgraph=True,
                    dynamic=False,
                )
            )
            decode = graph_decode.install(
                model, compiled, static_cache=static, kernels=kernels, graph_ops=graph_ops
            )
            return CompileSetup(TORCHAIR, chosen.kind, False, cache, ("decode",), True, chosen, decode)
    graph_ops = graph_decode.GraphOps()
    compiled = torch.compile(
        model.forward, backend=graph_ops.backend(options.compile_backend, options.compile_mode), dynamic=False
    )
    decode = graph_decode.install(model, compiled, static_cache=static, kernels=kernels, graph_ops=graph_ops)
    on_cuda = getattr(getattr(model, "device", None), "type", None) == "cuda"
    captured = ("decode",) if options.compile_mode in CAPTURING_MODES and on_cuda else ()
    return CompileSetup(options.compile_backend, options.compile_mode, False, cache, captured, decode=decode)
