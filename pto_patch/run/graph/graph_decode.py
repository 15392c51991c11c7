"""Decode that captures once: a static KV cache per run, the decode step compiled with fixed shapes.

A captured graph (ACL graph, CUDA graph) replays fixed buffers, so decode captures once only if every
step sees the same shapes. transformers' growing `DynamicCache` gives each step a new KV length (a new
graph per token); its `StaticCache` does not. `GraphDecode` replaces `model.forward`:

- the first call of a generation (prefill) runs eagerly: prompt lengths vary, a prefill is a few large
  kernels that launch costs little against, and transformers' own static-cache code expects an eager
  prefill (it marks the cache's addresses static there). vLLM's FULL_DECODE_ONLY captures the same way;
- every later call (one decode step) runs the compiled forward, over one `StaticCache` per batch size
  and cache length, kept for the whole run and reset before each generation, so every step and every
  generation hands the graph the same shapes and the same cache addresses (what a frozen capture needs).

The cache length is the prompt plus the most new tokens the run asks for, rounded up to CACHE_BUCKET,
so nearby prompt lengths share a cache and its capture. Each decode call is recorded (its batch and
cache, the graphs torch compiled during it, whether it was timed) for `CompileWatch`.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pto_patch.run.graph import cache_state

# Granularity of the static cache length: at most 255 unused positions per sequence (decode attention
# spans the whole cache), and prompts within one bucket share a cache and its capture.
CACHE_BUCKET = 256
STATIC = "static"
DYNAMIC = "dynamic"
AUTO = "auto"
CACHE_KINDS = (AUTO, STATIC, DYNAMIC)
# generate() takes a cache object as `cache` from transformers 5.24.0 (`past_key_values` is then a
# deprecated alias, removed in 5.40); 4.57.6 through 5.23 take `past_key_values` and refuse an unknown
# model keyword ("The following `model_kwargs` are not used by the model").
CACHE_KEYWORD_SINCE = (5, 24)


def cache_keyword(release: str | None = None) -> str:
    """The keyword under which `release` (default: the installed transformers) takes a cache object."""
    return "cache" if _release(release)[1] >= CACHE_KEYWORD_SINCE else "past_key_values"


# The oldest release whose StaticCache takes (config, max_cache_len) and sizes its batch on first use, as
# this module builds it: the layered caches of 4.56, tested from 4.57.6 (the floor pyproject declares).
STATIC_CACHE_SINCE = (4, 57)


def _release(release: str | None) -> tuple[str, tuple[int, int]]:
    if release is None:
        import transformers

        release = transformers.__version__
    major, minor = (int(part) for part in re.match(r"(\d+)\.(\d+)", release).groups())
    return release, (major, minor)


def check_release(release: str | None = None) -> None:
    """Refuse a graph run (a static cache) on a transformers release it cannot work on, before loading."""
    from pto_patch.errors import PtoPatchError

    release, version = _release(release)
    if version < STATIC_CACHE_SINCE:
        raise PtoPatchError(
            f"transformers {release} cannot run a graph decode: its StaticCache is built another way "
            f"(pto-patch's graph runs need {'.'.join(map(str, STATIC_CACHE_SINCE))} or newer)",
            "pip install 'transformers>=4.57.6,<5.26', or run without --use_acl_graph and --cache static",
        )


def static_cache_length(tokens: int, bucket: int = CACHE_BUCKET) -> int:
    """`tokens` rounded up to a whole number of buckets (at least one)."""
    return max(1, -(-tokens // bucket)) * bucket


@dataclass(frozen=True)
class CaptureRecord:
    """The first compiled call of one capture key (batch and cache, and the kernel switches on).

    torch_npu's npugraph_ex and torchair's reduce-overhead capture on the first call of a graph, with no
    eager run before (`AclConcreteGraph(..., num_warmup_iters=0)`): whatever the graph launches must exist
    by then. So one eager decode step runs first (`primed`), with the same switches over the same cache:
    every kernel it needs is built there, and the cache is put back as it was after it (`cache_state.kept`:
    transformers 5.4+ advance a static layer's length per step, a dynamic layer appends), so the capture
    and the generation see the cache they would have seen without the priming.
    """

    key: str
    switches: str  # the kernel switches on, e.g. "rms_norm=fused, mrope=fused"
    primed: bool  # an eager step ran before the capture
    built_before: int  # PyPTO kernels the eager step built
    built_during: dict[str, int]  # op -> PyPTO kernels built inside the capture (a real capture: an error)
    fallbacks_during: dict[str, int]  # op -> calls that fell back inside the capture (what replays run)
    eager_calls: dict[str, int]  # op -> calls one eager decode step makes
    graph_ops: dict[str, int] | None  # op -> pto_kernels nodes in the graphs compiled for it (None: not read)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "switches": self.switches,
            "primed": self.primed,
            "kernels_built_before": self.built_before,
            "kernels_built_during": dict(self.built_during),
            "fallbacks_during": dict(self.fallbacks_during),
            "eager_calls": dict(self.eager_calls),
            "graph_ops": None if self.graph_ops is None else dict(self.graph_ops),
        }


class GraphOps:
    """The pto_kernels custom ops each compiled FX graph holds, read when the backend is handed the graph
    (replays run no Python: what the graph holds is what runs)."""

    def __init__(self) -> None:
        self.graphs: list[dict[str, int]] = []

    def backend(self, backend, mode: str | None = None, options: dict | None = None):
        """`backend` (a name or a callable, with torch.compile's mode and options) as a callable that
        records each graph's pto_kernels nodes first."""
        import torch

        if backend == "inductor":
            inner = torch._TorchCompileInductorWrapper(mode, options, False)
        elif isinstance(backend, str) or mode or options:
            inner = torch._TorchCompileWrapper(backend, mode, options, False)
        else:
            inner = backend

        def counting(gm, example_inputs, **kwargs):
            self.graphs.append(pto_kernels_nodes(gm))
            return inner(gm, example_inputs, **kwargs)

        counting.__name__ = f"counting_{getattr(inner, '__name__', type(inner).__name__)}"
        return counting


def pto_kernels_nodes(gm) -> dict[str, int]:
    """op name -> calls of a pto_kernels custom op among the FX graph's nodes."""
    found: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = node.target.name() if hasattr(node.target, "name") else ""  # OpOverload: "ns::op.overload"
        namespace, _, rest = name.partition("::")
        if namespace == "pto_kernels":
            op = rest.split(".")[0]
            found[op] = found.get(op, 0) + 1
    return found


def _kernel_counts(kernels) -> dict[str, tuple[int, int, int]]:
    """op -> (calls, fallbacks, PyPTO kernels built), as the kernel package counts them now."""
    stats = getattr(kernels, "stats", None)
    if not callable(stats):
        return {}
    return {
        op: (entry["calls"], entry["fallbacks"], (entry.get("pypto_kernels") or {}).get("built", 0))
        for op, entry in stats().items()
    }


def _moved(before: dict, after: dict, field: int) -> dict[str, int]:
    moved = {op: after[op][field] - before.get(op, (0, 0, 0))[field] for op in after}
    return {op: count for op, count in moved.items() if count > 0}


def _switches(kernels) -> str:
    on = getattr(kernels, "switched_on", None)
    if not callable(on):
        return ""
    chosen = getattr(kernels, "backends", lambda: {})()
    return ", ".join(f"{op}={chosen.get(op, '?')}" for op in on()) or "none"


@dataclass(frozen=True)
class DecodeCall:
    """One decode step through the compiled forward."""

    key: str  # the batch size and cache it ran with, e.g. "batch 2, static cache 256"
    graphs: int  # graphs torch compiled during this call
    timed: bool  # made during a timed run


def _unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


class GraphDecode:
    """`model.forward` for a graph run: prefill eager, decode through `compiled`."""

    def __init__(
        self,
        model,
        compiled: Callable,
        *,
        static_cache: bool,
        kernels=None,
        graph_ops: GraphOps | None = None,
    ):
        self.eager = model.forward
        self.__signature__ = inspect.signature(self.eager)  # generate() checks its kwargs against it
        self.compiled = compiled
        self.static_cache = static_cache
        self.model = model
        self.calls: list[DecodeCall] = []
        self.prefills = 0
        self.timing = False
        self._reserved = 0
        self._caches: dict[tuple[int, int], Any] = {}
        self._key: str | None = None  # set inside a generation only
        self._step = 0
        self.keyword = cache_keyword()
        self.kernels = kernels
        self.graph_ops = graph_ops
        # an eager step before each capture; PTO_PATCH_CAPTURE_WITHOUT_WARMUP=1 shows what a capture without
        # it does (a PyPTO kernel first built inside it fails the run)
        self.prime = os.environ.get("PTO_PATCH_CAPTURE_WITHOUT_WARMUP") != "1"
        self.captures: list[CaptureRecord] = []
        self._captured: set[tuple[str, str]] = set()

    def reserve(self, new_tokens: int) -> None:
        """Size the caches for generations of up to `new_tokens`, so warm-ups and timed runs share them."""
        self._reserved = max(self._reserved, new_tokens)

    @contextmanager
    def generation(self, input_ids, new_tokens: int) -> Iterator[dict[str, Any]]:
        """One generate() call: yields the keyword arguments it needs (the reset static cache)."""
        self.reserve(new_tokens)
        batch, prompt = int(input_ids.shape[0]), int(input_ids.shape[1])
        extra: dict[str, Any] = {}
        if self.static_cache:
            length = static_cache_length(prompt + self._reserved)
            cache = self._caches.get((batch, length))
            if cache is None:
                from transformers import StaticCache

                cache = self._caches[(batch, length)] = StaticCache(
                    config=self.model.config.get_text_config(decoder=True), max_cache_len=length
                )
            else:
                cache.reset()
            extra[self.keyword] = cache
            self._key = f"batch {batch}, static cache {length}"
        else:
            self._key = f"batch {batch}, dynamic cache"
        self._step = 0
        try:
            yield extra
        finally:
            self._key = None

    def __call__(self, *args, **kwargs):
        if self._key is None:  # outside generate(): as the model was
            return self.eager(*args, **kwargs)
        self._step += 1
        if self._step == 1:
            self.prefills += 1
            return self.eager(*args, **kwargs)
        switches = _switches(self.kernels)
        if (self._key, switches) in self._captured:
            before = _unique_graphs()
            out = self.compiled(*args, **kwargs)
            self.calls.append(DecodeCall(self._key, _unique_graphs() - before, self.timing))
            return out
        return self._capture(switches, args, kwargs)

    def _capture(self, switches: str, args, kwargs):
        """The first compiled call for a key and switches: an eager step first, then the capture, counted."""
        self._captured.add((self._key, switches))
        start = _kernel_counts(self.kernels)
        if self.prime:  # builds every kernel the step runs, and leaves the cache as it found it
            with cache_state.kept(_cache_in(args, kwargs)):
                self.eager(*args, **kwargs)
        primed = _kernel_counts(self.kernels)
        seen = len(self.graph_ops.graphs) if self.graph_ops is not None else 0
        before = _unique_graphs()
        out = self.compiled(*args, **kwargs)
        self.calls.append(DecodeCall(self._key, _unique_graphs() - before, self.timing))
        after = _kernel_counts(self.kernels)
        graph_ops = None
        if self.graph_ops is not None and len(self.graph_ops.graphs) > seen:
            graph_ops = {}
            # a custom op counts under its op (mrope_mixed -> mrope), as the kernel stats do
            op_of = getattr(self.kernels, "op_of", str)
            for graph in self.graph_ops.graphs[seen:]:
                for entry, count in graph.items():
                    op = op_of(entry)
                    graph_ops[op] = graph_ops.get(op, 0) + count
        self.captures.append(
            CaptureRecord(
                key=self._key,
                switches=switches,
                primed=self.prime,
                built_before=sum(_moved(start, primed, 2).values()),
                built_during=_moved(primed, after, 2),
                fallbacks_during=_moved(primed, after, 1),
                eager_calls=_moved(start, primed, 0),
                graph_ops=graph_ops,
            )
        )
        return out


def _cache_in(args, kwargs):
    """The transformers cache a forward call was handed (None: it was handed none)."""
    try:
        from transformers.cache_utils import Cache
    except ImportError:
        return None
    return next((value for value in (*args, *kwargs.values()) if isinstance(value, Cache)), None)


def installed(model) -> GraphDecode | None:
    """The model's GraphDecode, where a graph run put one."""
    forward = getattr(model, "forward", None)
    return forward if isinstance(forward, GraphDecode) else None


def install(
    model, compiled: Callable, *, static_cache: bool, kernels=None, graph_ops: GraphOps | None = None
) -> GraphDecode:
    """Replace model.forward; each decode step counts once as a replay of the ops captured in it."""
    counting = getattr(kernels, "count_replays", None)  # absent from older kernel packages
    decode = GraphDecode(
        model,
        counting(compiled) if callable(counting) else compiled,
        static_cache=static_cache,
        kernels=kernels,
        graph_ops=graph_ops,
    )
    model.forward = decode
    return decode


@contextmanager
def timed(model) -> Iterator[None]:
    """Mark the decode calls made inside as timed (a graph compiled then means the timing holds a compile)."""
    decode = installed(model)
    if decode is None:
        yield
        return
    decode.timing = True
    try:
        yield
    finally:
        decode.timing = False
