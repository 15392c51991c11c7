"""A KV cache put back exactly as it was: what lets an eager priming step run before a capture unseen.

The eager decode step that builds every kernel before a capture (`graph_decode`, `CaptureRecord`) runs on
the generation's own cache, and transformers' caches keep their bookkeeping in the cache itself:

- `StaticLayer` (4.57.6, 5.0.0) writes the step's row at `cache_position` and counts its length from the
  rows it holds (`keys[0, 0].any(-1).sum()`): the row written is the one the capture writes again;
- `StaticLayer` (5.4 on: seen in 5.8.1, 5.16.1, 5.24.0, 5.25.0) writes at its own `cumulative_length` (a
  tensor, advanced in place by `add_`, marked as a static address) and the model takes its positions from
  it, so a second step writes one row further and every later position is one too far;
- `DynamicLayer` (every release) rebinds `keys` and `values` to a longer `torch.cat`, so a second step
  leaves the row twice; the sliding layers also keep an int `cumulative_length` (`_int` from 5.8).

`kept(cache)` snapshots every layer's attributes (tensors by contents) and puts them back afterwards:
tensors the step changed in place get their contents copied back into the same storage (a capture keeps
their addresses), attributes it rebound are bound to the original objects again, those it added are
removed. The cost is one copy of the cache, once per capture key (batch size and cache length).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_MISSING = object()


class _Saved:
    """One object's attributes: each one's object, and a tensor's contents beside it."""

    def __init__(self, owner: Any, skip: tuple[str, ...] = ()):
        import torch

        self.owner = owner
        self.skip = skip
        self.attributes = {name: value for name, value in vars(owner).items() if name not in skip}
        self.contents = {
            name: value.detach().clone()
            for name, value in self.attributes.items()
            if isinstance(value, torch.Tensor)
        }

    def restore(self) -> None:
        import torch

        for name in [
            name for name in vars(self.owner) if name not in self.attributes and name not in self.skip
        ]:
            delattr(self.owner, name)  # added by the step (a lazy initialisation)
        for name, value in self.attributes.items():
            if name in self.contents:
                with torch.no_grad():
                    value.copy_(self.contents[name])  # the same storage, the contents from before
            if vars(self.owner).get(name, _MISSING) is not value:
                setattr(self.owner, name, value)


def layers_of(cache: Any) -> list[Any]:
    """The cache's layer objects (transformers 4.56 on keep them in `cache.layers`)."""
    return list(getattr(cache, "layers", None) or [])


@contextmanager
def kept(cache: Any) -> Iterator[None]:
    """Whatever runs inside may write `cache`; on leaving, it holds what it held on entering."""
    if cache is None:
        yield
        return
    layers = getattr(cache, "layers", None)
    saved = [_Saved(layer) for layer in layers_of(cache)] + [_Saved(cache, skip=("layers",))]
    listed = list(layers) if isinstance(layers, list) else None
    try:
        yield
    finally:
        if listed is not None:
            layers[:] = listed  # layers a step appended (a dynamic cache's lazy layers) go again
        for owner in saved:
            owner.restore()
