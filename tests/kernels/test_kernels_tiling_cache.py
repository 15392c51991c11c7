"""The tile table's lookups and the bounded kernel cache, without pypto (fake kernels)."""

import json
from dataclasses import asdict

import pytest
from pto_kernels.backends import pypto_runtime
from pto_kernels.tiling.tile_table import DECODE_MAX_ROWS, TILE_TABLE, TileConfig, shape_class, tile_config


class FakeKernel:
    """Stands in for a pypto jit wrapper: the cache wraps `compile`, which a call runs once."""

    def __init__(self):
        self.compiled = 0

    def compile(self):
        self.compiled += 1

    def __call__(self):
        self.compile()


def test_shape_class_boundary():
    assert shape_class(1) == shape_class(DECODE_MAX_ROWS) == "decode"
    assert shape_class(DECODE_MAX_ROWS + 1) == "prefill"


def test_every_op_has_both_classes_for_any_width():
    for op in ("rms_norm", "mrope", "swiglu_mlp"):
        for klass in ("decode", "prefill"):
            assert (op, klass, None) in TILE_TABLE, (op, klass)


def test_width_specific_entry_wins(monkeypatch):
    special = TileConfig(row_tile=5)
    monkeypatch.setitem(TILE_TABLE, ("rms_norm", "prefill", 999), special)
    assert tile_config("rms_norm", 100, 999) == ("prefill", special)
    assert tile_config("rms_norm", 100, 998)[1] == TILE_TABLE[("rms_norm", "prefill", None)]
    assert tile_config("rms_norm", 3, 999)[1] == TILE_TABLE[("rms_norm", "decode", None)]


def test_config_round_trips_through_json():
    config = TileConfig(row_tile=16, cube_k=(128, 512), pass_settings=(("cube_l1_reuse_setting", -1, 4),))
    again = TileConfig.from_dict(json.loads(json.dumps(asdict(config))))
    assert again == config and hash(again) == hash(config)
    assert again.pass_options() == {"cube_l1_reuse_setting": {-1: 4}}
    assert TileConfig(row_tile=1).pass_options() is None


def test_cache_counts_builds_hits_compiles_and_evicts_least_recent():
    cache = pypto_runtime.KernelCache(capacity=2)
    built = []

    def build():
        built.append(FakeKernel())
        return built[-1]

    a = cache.get(("rms_norm", "a"), build)
    a()
    assert cache.get(("rms_norm", "a"), build) is a
    a()
    cache.get(("mrope", "b"), build)
    cache.get(("rms_norm", "a"), build)  # a is now the most recent: b goes first
    cache.get(("swiglu_mlp", "c"), build)
    assert len(built) == 3
    stats = cache.stats()
    assert stats["rms_norm"].pop("compile_s") >= 0.0  # time inside the two compiles
    assert stats["rms_norm"] == {"built": 1, "compiles": 2, "cache_hits": 2, "evicted": 0, "cached": 1}
    assert stats["mrope"] == {
        "built": 1,
        "compiles": 0,
        "compile_s": 0.0,
        "cache_hits": 0,
        "evicted": 1,
        "cached": 0,
    }
    assert stats["swiglu_mlp"]["cached"] == 1
    assert cache.get(("mrope", "b"), build) is built[-1] and len(built) == 4  # rebuilt after eviction
    cache.reset_counts()  # counters restart; the kernels held stay
    assert cache.stats()["mrope"] == {
        "built": 0,
        "compiles": 0,
        "compile_s": 0.0,
        "cache_hits": 0,
        "evicted": 0,
        "cached": 1,
    }
    assert "rms_norm" not in cache.stats()  # its kernel was evicted when b came back


def test_compile_time_is_counted_apart_from_the_run():
    import time

    class SlowCompile(FakeKernel):
        def compile(self):
            time.sleep(0.05)

        def __call__(self):
            self.compile()
            time.sleep(0.2)  # the run itself: not compile time

    cache = pypto_runtime.KernelCache()
    cache.get(("rms_norm", "slow"), SlowCompile)()
    seconds = cache.stats()["rms_norm"]["compile_s"]
    assert 0.05 <= seconds < 0.2


def test_cache_bound_holds_under_many_shapes():
    cache = pypto_runtime.KernelCache(capacity=pypto_runtime.KERNEL_CACHE_SIZE)
    for width in range(3 * pypto_runtime.KERNEL_CACHE_SIZE):
        cache.get(("rms_norm", width), FakeKernel)
    stats = cache.stats()["rms_norm"]
    assert stats["cached"] == pypto_runtime.KERNEL_CACHE_SIZE
    assert stats["evicted"] == 2 * pypto_runtime.KERNEL_CACHE_SIZE


@pytest.mark.parametrize("rows", [1, 16, 17, 5000])
def test_dynamic_kernels_share_one_key_per_class(rows):
    _, config = tile_config("rms_norm", rows, 2048)
    key = pypto_runtime.kernel_key("rms_norm", config, rows, 2048)
    other_rows = 2 if rows <= DECODE_MAX_ROWS else rows + 1
    assert key == pypto_runtime.kernel_key("rms_norm", config, other_rows, 2048)
