"""Each sequence's valid range of the KV cache (its first valid position and its length), read from the
attention mask a decoder layer's attention receives.

transformers hands the attention its mask in one of three forms: None (every key position visible to the
last row: a growing cache under sdpa or flash attention; see attention_core_model_wrapper for sdpa's
`is_causal` prefill), a bool mask [b, 1, q, kv] (True: visible; sdpa over a static cache), or an
additive float mask of the same shape (0: visible, the dtype's minimum: masked; eager); a 2-D [b, kv]
padding mask under flash attention. The last query row of a decode step sees every valid position: its
first visible position is the sequence's start (left padding: the pads before it), the count of its visible
positions its length. That is the sequence's range provided what it sees is one run of positions, as
`generate` builds a left-padded batch's mask; a mask with a hole inside a sequence is not one range
(`one_range_each`), and the patched attention then runs the model's own function.

The mask is one tensor per forward, shared by every layer: the lengths are counted once per forward and
reused (keyed on the mask's identity and version; without a mask, on the keys' shape), so a step pays for
them once, not per layer. Inside a device-graph capture the count is recorded once, in the first layer,
and every replay recounts into the same tensor the later layers read.
"""

from __future__ import annotations

import torch


def version_of(tensor: torch.Tensor) -> int:
    """A tensor's version counter, -1 for an inference tensor (torch.inference_mode), which has none: it
    cannot be changed in place outside inference mode."""
    return -1 if tensor.is_inference() else tensor._version


def _visible(attention_mask: torch.Tensor, cache_len: int) -> torch.Tensor:
    """[b, cache_len] bool: the positions each sequence's last query row sees."""
    last = attention_mask if attention_mask.dim() == 2 else attention_mask[:, 0, -1]
    last = last[..., :cache_len]
    return last if last.dtype == torch.bool else (last == 0 if last.is_floating_point() else last != 0)


def count(attention_mask: torch.Tensor | None, keys: torch.Tensor) -> torch.Tensor:
    """[b] int64: the visible positions of each sequence's last query row, at most the keys' length."""
    batch, cache_len = keys.shape[0], keys.shape[2]
    if attention_mask is None:
        return torch.full((batch,), cache_len, dtype=torch.int64, device=keys.device)
    return _visible(attention_mask, cache_len).sum(-1)


def starts(attention_mask: torch.Tensor | None, keys: torch.Tensor) -> torch.Tensor:
    """[b] int64: each sequence's first position its last query row sees (0 without a mask, or when it
    sees none)."""
    if attention_mask is None:
        return torch.zeros(keys.shape[0], dtype=torch.int64, device=keys.device)
    return _visible(attention_mask, keys.shape[2]).to(torch.int32).argmax(-1)  # argmax: the first maximum


def ranges(attention_mask: torch.Tensor | None, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts, lengths), each [b] int64: the range of the cache each sequence's last query row sees."""
    return starts(attention_mask, keys), count(attention_mask, keys)


def is_one_range_each(attention_mask: torch.Tensor | None, keys: torch.Tensor) -> bool:
    """Whether every sequence's visible positions are one run (left padding, nothing masked inside): reads
    one value back to the host."""
    if attention_mask is None:
        return True
    visible = _visible(attention_mask, keys.shape[2]).to(torch.int32)
    runs = (visible[:, 1:] > visible[:, :-1]).sum(-1) + visible[:, 0]  # a run starts where 0 -> 1
    return bool((runs <= 1).all())


class _Lengths:
    """The last mask's ranges (and whether they are one run each), reused while the same mask (identity,
    version, shape) comes back."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._held: tuple | None = None  # the mask and keys kept alive, so an id is never reused meanwhile
        self._value: tuple[torch.Tensor, torch.Tensor] | None = None
        self._one_range: bool | None = None
        self.builds = 0

    def _refresh(self, attention_mask: torch.Tensor | None, keys: torch.Tensor) -> None:
        if attention_mask is None:  # the lengths are the keys': the same for every layer of a forward
            key = (None, keys.shape[0], keys.shape[2], keys.device)
        else:
            key = (id(attention_mask), version_of(attention_mask), tuple(attention_mask.shape), keys.shape[2])
        if key != self._key:
            self._key, self._held = key, (attention_mask,)
            self._value = ranges(attention_mask, keys)
            self._one_range = None
            self.builds += 1

    def get(
        self, attention_mask: torch.Tensor | None, keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(starts, lengths) [b] int64 (see `ranges`)."""
        self._refresh(attention_mask, keys)
        return self._value

    def one_range_each(self, attention_mask: torch.Tensor | None, keys: torch.Tensor) -> bool:
        """is_one_range_each, asked once per mask (one value read back to the host a forward)."""
        self._refresh(attention_mask, keys)
        if self._one_range is None:
            self._one_range = is_one_range_each(attention_mask, keys)
        return self._one_range


LENGTHS = _Lengths()
