"""Where a decode step's new keys and values go in transformers' static KV cache, so the attention prologue's
kernel can write them itself, and what transformers' own update would have done besides.

A patched attention's prologue asks `write_target` before its kernel runs. When the answer is a target, the
prologue's op writes k and v into the layer's caches (one kernel on the pypto backend, in place of the two
`index_copy_` of StaticLayer.update) and the attention skips its `cache.update` call; otherwise the prologue
returns k and v and the update runs as written. transformers' StaticLayer.update, by release:
- 4.57 - 5.0: writes at `cache_kwargs["cache_position"]`, the attention's `cache_position` argument;
- 5.8 - 5.25: writes at its own `cumulative_length` (int64: shape [1] in 5.8, 0-d from 5.16) and advances
  it in place by the new rows (`advance`: the op does that after the write, as the update would; on the
  pypto backend inside the same kernel).
A target is given only for what the op takes and transformers' update would do the same: one new row a
sequence (a decode step at any batch: every sequence of a left-padded batch writes at the one position the
update writes at, its row of the batch axis); the cache's own `Cache.update` (not a subclass's) with no
offloading; the layer a `StaticLayer` (not a sliding-window one) already allocated for the call's batch,
in the new rows' dtype and on their device; an int64 position. Anything else (prefill, a dynamic cache)
goes through transformers' update.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

_TRANSFORMERS_CACHE = "transformers.cache_utils"


class WriteTarget(NamedTuple):
    keys: torch.Tensor  # [batch, kv_heads, cache_len, head_dim]
    values: torch.Tensor
    position: torch.Tensor  # int64, its first element the new row's position
    advance: bool  # the layer counts its own length (5.8+): the op advances it after the write


def _is_transformers(cls: type, name: str) -> bool:
    return cls.__name__ == name and cls.__module__ == _TRANSFORMERS_CACHE


def _updates_as_transformers(cache) -> bool:
    """The cache's update is transformers' `Cache.update` (a subclass may do more, or differently)."""
    for cls in type(cache).__mro__:
        if _is_transformers(cls, "Cache"):
            return getattr(type(cache), "update", None) is cls.update
    return False


def write_target(
    cache, layer_idx: int, hidden_states: torch.Tensor, cache_position=None
) -> WriteTarget | None:
    """The caches and position the attention's `cache.update(k, v, layer_idx, ...)` would write this call's
    new rows (one a sequence) at, or None when the update must run as written (see the module's docstring)."""
    if cache is None or hidden_states.dim() != 3 or hidden_states.shape[1] != 1:
        return None
    layers = getattr(cache, "layers", None)
    if getattr(cache, "offloading", False) or not isinstance(layers, list) or layer_idx >= len(layers):
        return None
    layer = layers[layer_idx]
    if not _is_transformers(type(layer), "StaticLayer") or not getattr(layer, "is_initialized", False):
        return None
    if not _updates_as_transformers(cache):
        return None
    counter = getattr(layer, "cumulative_length", None)
    position = counter if isinstance(counter, torch.Tensor) else cache_position
    if not isinstance(position, torch.Tensor) or position.dtype != torch.int64 or position.numel() < 1:
        return None
    keys, values = layer.keys, layer.values
    if keys.shape[0] != hidden_states.shape[0] or keys.dtype != hidden_states.dtype:
        return None
    if keys.device != hidden_states.device:
        return None
    if position.device != keys.device:
        return None
    return WriteTarget(keys, values, position, isinstance(counter, torch.Tensor))
