"""The attention prologue writing a decode step's k and v into transformers' static KV cache itself
(pto_kernels.static_cache, attention_prologue_cache_wrapper): when it may, and that what it leaves in the
cache, and in the cache's length, is what transformers' own update leaves there.

Run against the installed transformers release's StaticCache, DynamicCache and layers; the graph-decode
release matrix (tests/test_graph_releases.py) runs the whole path under every release of the matrix.
"""

import copy

import pto_kernels
import pytest
import torch
from pto_kernels import static_cache
from transformers import DynamicCache, PretrainedConfig, StaticCache

HIDDEN, HEADS, KV_HEADS, DIM, CACHE_LEN = 32, 4, 2, 8, 12
SECTION = [2, 1, 1]


def _config():
    return PretrainedConfig(
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=DIM,
        num_hidden_layers=2,
        max_position_embeddings=64,
    )


def _prefilled(cache_cls=StaticCache, rows: int = 5, batch: int = 1):
    """A cache of 2 layers after a prefill of `rows` positions through transformers' own update."""
    cache = (
        cache_cls(config=_config(), max_cache_len=CACHE_LEN)
        if cache_cls is not DynamicCache
        else DynamicCache()
    )
    gen = torch.Generator().manual_seed(3)
    for layer in range(2):
        k, v = (torch.randn(batch, KV_HEADS, rows, DIM, generator=gen) for _ in "kv")
        cache.update(k, v, layer, {"cache_position": torch.arange(rows)})
    return cache


def _position(cache, layer: int = 0):
    held = getattr(cache.layers[layer], "cumulative_length", None)
    return None if isinstance(held, torch.Tensor) else torch.tensor([5])


@pytest.mark.parametrize("batch", [1, 4])
def test_a_static_cache_at_decode_is_a_target(batch):
    cache = _prefilled(batch=batch)
    target = static_cache.write_target(cache, 1, torch.zeros(batch, 1, HIDDEN), _position(cache, 1))
    layer = cache.layers[1]
    assert target is not None and target.keys is layer.keys and target.values is layer.values
    counter = getattr(layer, "cumulative_length", None)
    assert target.advance == isinstance(counter, torch.Tensor)
    assert int(target.position.reshape(-1)[0]) == 5


class _OwnUpdate(StaticCache):
    def update(self, *args, **kwargs):  # a cache that does more than transformers' update
        return super().update(*args, **kwargs)


@pytest.mark.parametrize(
    "why",
    [
        "dynamic",
        "two rows",
        "another batch",
        "own update",
        "offloading",
        "dtype",
        "not allocated",
        "no position",
    ],
)
def test_what_is_not_a_target(why):
    hidden, cache = torch.zeros(1, 1, HIDDEN), None
    if why == "dynamic":
        cache = _prefilled(DynamicCache)
    elif why == "two rows":
        cache, hidden = _prefilled(), torch.zeros(1, 2, HIDDEN)
    elif why == "another batch":  # a cache allocated for 2 sequences, a call of 3: the update would fail
        cache, hidden = _prefilled(batch=2), torch.zeros(3, 1, HIDDEN)
    elif why == "own update":
        cache = _prefilled(_OwnUpdate)
    elif why == "offloading":
        cache = _prefilled()
        cache.offloading = True
    elif why == "dtype":
        cache, hidden = _prefilled(), torch.zeros(1, 1, HIDDEN, dtype=torch.bfloat16)
    elif why == "not allocated":
        cache = StaticCache(config=_config(), max_cache_len=CACHE_LEN)
    position = _position(cache) if why != "no position" else None
    if why == "no position":
        cache = _prefilled()
        if isinstance(getattr(cache.layers[0], "cumulative_length", None), torch.Tensor):
            del cache.layers[0].cumulative_length  # as 4.57's layer, which counts nothing
    assert static_cache.write_target(cache, 0, hidden, position) is None


class _Module(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q_proj = torch.nn.Linear(HIDDEN, HEADS * DIM)
        self.k_proj = torch.nn.Linear(HIDDEN, KV_HEADS * DIM)
        self.v_proj = torch.nn.Linear(HIDDEN, KV_HEADS * DIM)
        self.head_dim, self.layer_idx = DIM, 1
        self.norm = torch.nn.Module()
        self.norm.weight, self.norm.variance_epsilon = torch.nn.Parameter(torch.rand(HIDDEN) + 0.5), 1e-6


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("backend", ["torch", "fused"])
def test_the_wrapper_leaves_what_transformers_update_leaves(backend, batch):
    """The prologue's write, then transformers' update of a copy with the prologue's own k and v: the same
    caches (every sequence's row), the same length, advanced once; q as the prologue without the cache."""
    module, cache = _Module(), _prefilled(batch=batch)
    twin = copy.deepcopy(cache)
    x = torch.randn(batch, 1, HIDDEN)
    angles = torch.randn(3, batch, 1, DIM // 2).repeat(1, 1, 1, 2)
    cos, sin = angles.cos(), angles.sin()
    with pto_kernels.enabled(ops=["attention_prologue"], backend=backend), torch.no_grad():
        q0, k0, v0 = pto_kernels.attention_prologue_wrapper(module, module.norm, x, cos, sin, SECTION)
        q, keys, values, written = pto_kernels.attention_prologue_cache_wrapper(
            module, module.norm, x, cos, sin, SECTION, cache, _position(cache, 1)
        )
        writes = pto_kernels.stats()["attention_prologue"]["cache_writes"]
    want_keys, want_values = twin.update(k0, v0, 1, {"cache_position": torch.tensor([5])})
    assert written and writes == 1
    torch.testing.assert_close(q, q0, rtol=0, atol=0)
    torch.testing.assert_close(keys, want_keys, rtol=0, atol=0)
    torch.testing.assert_close(values, want_values, rtol=0, atol=0)
    assert keys is cache.layers[1].keys
    assert cache.layers[1].get_seq_length() == twin.layers[1].get_seq_length()
    if isinstance(getattr(twin.layers[1], "cumulative_length", None), torch.Tensor):
        assert int(cache.layers[1].get_seq_length()) == 6  # advanced by one step, whatever the batch
    assert int(cache.layers[0].get_seq_length()) == 5  # another layer's length is its own
    assert int((keys[:, :, 5] != 0).all()) and keys.shape[0] == batch  # every sequence's row written


def test_the_wrapper_falls_through_to_the_update_when_there_is_no_target():
    module, cache = _Module(), _prefilled(DynamicCache)
    angles = torch.randn(3, 1, 1, DIM // 2).repeat(1, 1, 1, 2)
    with pto_kernels.enabled(ops=["attention_prologue"], backend="fused"), torch.no_grad():
        q, k, v, written = pto_kernels.attention_prologue_cache_wrapper(
            module, module.norm, torch.randn(1, 1, HIDDEN), angles.cos(), angles.sin(), SECTION, cache, None
        )
        assert pto_kernels.stats()["attention_prologue"]["cache_writes"] == 0
    assert not written and k.shape == (1, KV_HEADS, 1, DIM) and cache.get_seq_length() == 5


def test_one_rows_write_launches_what_transformers_update_does():
    """The torch path's write of one new row: the two index_copy_ at the position tensor itself, no index
    built (transformers 4.57 - 5.0 pass their cache_position straight to index_copy_)."""
    from pto_kernels.backends import reference
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.kernels = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not getattr(func, "is_view", False):
                self.kernels.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    caches = [torch.zeros(1, KV_HEADS, CACHE_LEN, DIM) for _ in "kv"]
    new = [torch.randn(1, KV_HEADS, 1, DIM) for _ in "kv"]
    with Counting() as counted:
        reference.write_cache(*caches, *new, torch.tensor([4]))
    assert counted.kernels == ["aten.index_copy_", "aten.index_copy_"]
    torch.testing.assert_close(caches[0][:, :, 4:5], new[0], rtol=0, atol=0)


def _pypto_cached_entry_at(batch, mixed, monkeypatch):
    """The pypto cached entry at `batch` sequences, its kernels stood in for (the interpreter is slow): the
    caches handed to each _prologue call (None for the plain prologue), q, the caches and the position."""
    from pto_kernels.backends import pypto_prologue

    seen = []

    def prologue(x, *rest, cache=None):
        seen.append(cache)
        if cache:  # the cached kernel: q alone, the writes its own (not stood in)
            return torch.ones(batch, HEADS, 1, DIM)
        k = torch.full((batch, KV_HEADS, 1, DIM), 2.0)
        return torch.ones(batch, HEADS, 1, DIM), k, k + 1

    # _prologue(x, norm_w, eps, projections, cos, sin, head_dim[, cache])
    monkeypatch.setattr(
        pypto_prologue, "_prologue", lambda *args: prologue(*args[:7], cache=(args[7:] or [None])[0])
    )
    monkeypatch.setattr(pypto_prologue, "_mixed_tables", lambda *args: (None, None))
    caches = [torch.zeros(batch, KV_HEADS, CACHE_LEN, DIM) for _ in "kv"]
    position = torch.tensor([5])
    weights = (None,) * 8  # norm_w, eps, q/k/v weights and biases
    tables = (torch.zeros(3, batch, 1, DIM),) * 2
    args = (torch.zeros(batch, 1, HIDDEN), *weights, *tables) + (() if mixed else (SECTION,))
    args += (DIM, *caches, position, True)
    entry = (
        pypto_prologue.attention_prologue_mixed_cached if mixed else pypto_prologue.attention_prologue_cached
    )
    return seen, entry(*args), caches, position


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("batch", [3, 16])
def test_the_pypto_prologue_at_a_batch_runs_the_cached_kernel(batch, mixed, monkeypatch):
    """At a batch the decode tiling takes (up to 16 sequences) the entry runs the cached kernel, once, on the
    caches and the position: no plain prologue, no write or advance of torch's after it."""
    seen, q, caches, position = _pypto_cached_entry_at(batch, mixed, monkeypatch)
    ((key_cache, value_cache, at, advance),) = seen
    assert key_cache is caches[0] and value_cache is caches[1] and at is position and advance is True
    assert q.shape == (batch, HEADS, 1, DIM)
    assert position.tolist() == [5] and not caches[0].any() and not caches[1].any()


@pytest.mark.parametrize("mixed", [False, True])
def test_the_pypto_prologue_past_the_decode_batches_runs_its_kernel_then_writes_and_advances_once(
    mixed, monkeypatch
):
    """Past 16 sequences the entry runs the prologue's own kernel and then transformers' write, the length
    advanced once."""
    seen, q, caches, position = _pypto_cached_entry_at(17, mixed, monkeypatch)
    assert seen == [None] and q.shape == (17, HEADS, 1, DIM)  # the uncached kernel, once
    assert position.tolist() == [6]  # advanced once
    assert (caches[0][:, :, 5] == 2).all() and (caches[1][:, :, 5] == 3).all()
    assert not caches[0][:, :, :5].any() and not caches[0][:, :, 6:].any()
