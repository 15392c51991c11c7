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
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

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

    def __init__(self, model, compiled: Callable, *, static_cache: bool):
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

    def reserve(self, new_tokens: int) -> None:
        """Size the caches for generations of up to `new_tokens`, so warm-ups and timed runs share them."""
        self._reserved = max(self._reserved, new_tokens)

    def cache_lengths(self) -> list[int]:
        return sorted({length for _, length in self._caches})

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
        before = _unique_graphs()
        out = self.compiled(*args, **kwargs)
        self.calls.append(DecodeCall(self._key, _unique_graphs() - before, self.timing))
        return out


def installed(model) -> GraphDecode | None:
    """The model's GraphDecode, where a graph run put one."""
    forward = getattr(model, "forward", None)
    return forward if isinstance(forward, GraphDecode) else None


def install(model, compiled: Callable, *, static_cache: bool, kernels=None) -> GraphDecode:
    """Replace model.forward; each decode step counts once as a replay of the ops captured in it."""
    counting = getattr(kernels, "count_replays", None)  # absent from older kernel packages
    decode = GraphDecode(
        model, counting(compiled) if callable(counting) else compiled, static_cache=static_cache
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
