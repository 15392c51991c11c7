"""Each sequence's valid KV length, read from the attention mask a decoder layer's attention receives.

transformers hands the attention its mask in one of three forms: None (every key position visible to the
last row: a growing cache under sdpa or flash attention; see attention_core_model_wrapper for sdpa's
`is_causal` prefill), a bool mask [b, 1, q, kv] (True: visible; sdpa over a static cache), or an
additive float mask of the same shape (0: visible, the dtype's minimum: masked; eager); a 2-D [b, kv]
padding mask under flash attention. The last query row of a decode step sees every valid position, so the
count of its visible positions is the sequence's length, provided what it sees is a prefix of the cache:
true at batch 1 (no padding; the patched attention only asks for batch 1), not for a left-padded batch.

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


def count(attention_mask: torch.Tensor | None, keys: torch.Tensor) -> torch.Tensor:
    """[b] int64: the visible positions of each sequence's last query row, at most the keys' length."""
    batch, cache_len = keys.shape[0], keys.shape[2]
    if attention_mask is None:
        return torch.full((batch,), cache_len, dtype=torch.int64, device=keys.device)
    last = attention_mask if attention_mask.dim() == 2 else attention_mask[:, 0, -1]
    last = last[..., :cache_len]
    visible = last if last.dtype == torch.bool else (last == 0 if last.is_floating_point() else last != 0)
    return visible.sum(-1)


class _Lengths:
    """The last mask's lengths, reused while the same mask (identity, version, shape) comes back."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._held: tuple | None = None  # the mask and keys kept alive, so an id is never reused meanwhile
        self._value: torch.Tensor | None = None
        self.builds = 0

    def get(self, attention_mask: torch.Tensor | None, keys: torch.Tensor) -> torch.Tensor:
        if attention_mask is None:  # the lengths are the keys': the same for every layer of a forward
            key = (None, keys.shape[0], keys.shape[2], keys.device)
        else:
            key = (id(attention_mask), version_of(attention_mask), tuple(attention_mask.shape), keys.shape[2])
        if key != self._key:
            self._key, self._held = key, (attention_mask,)
            self._value = count(attention_mask, keys)
            self.builds += 1
        return self._value


LENGTHS = _Lengths()
