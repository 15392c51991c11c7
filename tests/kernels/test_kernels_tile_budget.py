"""Every tiling inside the AI Core's buffers by PyPTO's documented formulas (tile_budget.py), without pypto."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from pto_kernels.backends import pypto_ops
from pto_kernels.tiling import tile_budget
from pto_kernels.tiling.tile_table import BLOCK_TILE_TABLE, TILE_TABLE, TileConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import tile_search  # noqa: E402

ENTRIES = {**TILE_TABLE, **BLOCK_TILE_TABLE}
# mlp_block's decode entry as it was: gate/up k [256, 1024], n [128, 256] need 544 KiB of L1
OLD_MLP_BLOCK_DECODE = TileConfig(
    row_tile=16,
    norm_rows=8,
    cube_k=(256, 1024),
    cube_n=(128, 256),
    down_cube_k=(256, 1024),
    down_cube_n=(128, 128),
    proj_cube_k=(256, 1024),
    proj_cube_n=(128, 128),
)


@pytest.mark.parametrize("key", list(ENTRIES), ids=["/".join(map(str, key)) for key in ENTRIES])
def test_every_tile_table_entry_fits_the_buffers(key):
    assert tile_budget.problems(key[0], ENTRIES[key]) == []


def test_the_old_mlp_block_decode_entry_is_refused_for_its_l1():
    found = tile_budget.problems("mlp_block", OLD_MLP_BLOCK_DECODE)
    assert found == [
        "gate/up: L1 544 KiB over the 512 KiB of an Ascend910B (A2/A3) (m [16, 16], k [256, 1024],"
        " n [128, 256], 2-byte inputs)"
    ]


@pytest.mark.parametrize(
    ("op", "config", "buffer"),
    [
        ("linear", TileConfig(row_tile=16, cube_k=(512, 512), cube_n=(128, 128)), "L0B 128 KiB"),
        ("linear", TileConfig(row_tile=16, cube_m=512, cube_k=(128, 128), cube_n=(16, 16)), "L0A 128 KiB"),
        ("swiglu_mlp", TileConfig(row_tile=256, cube_m=256, cube_n=(256, 256)), "L0C 256 KiB"),
        ("attention_prologue", TileConfig(row_tile=16, proj_cube_k=(64, 100)), "must be positive"),
    ],
)
def test_each_buffer_overflow_is_named(op, config, buffer):
    assert any(buffer in line for line in tile_budget.problems(op, config))


def test_the_documented_recommended_tilings_fit_and_fill_the_buffers_as_the_docs_say():
    # pypto's matmul guide: [128,128],[64,256],[256,256] in fp16 keeps L0A / L0B at 32 KiB or less
    tiles = tile_budget.CubeTiles("doc", (128, 128), (64, 256), (256, 256))
    assert tile_budget.footprint(tiles, 2) == {
        "l0a": 16 * 1024,
        "l0b": 32 * 1024,
        "l0c": 128 * 1024,
        "l1": (128 * 256 + 256 * 256) * 2,
    }
    # odd sizes round up to whole 16-element blocks
    assert (
        tile_budget.footprint(tile_budget.CubeTiles("odd", (1, 1), (17, 17), (1, 1)), 2)["l0a"] == 16 * 32 * 2
    )


def test_fp32_inputs_take_twice_the_bytes_and_a_small_matrix_clips_the_tiles():
    config = TILE_TABLE[("swiglu_mlp", "decode", None)]
    assert tile_budget.problems("swiglu_mlp", config, in_bytes=4)  # 544 KiB of L1 at full width
    narrow = {"gate/up": (16, 64, 128), "down": (16, 128, 64)}  # the interpreter tests' widths
    assert tile_budget.problems("swiglu_mlp", config, in_bytes=4, dims=narrow) == []


def test_vector_only_kernels_have_no_cube_tiles():
    for op in ("rms_norm", "mrope", "residual_rms_norm"):
        assert tile_budget.cube_tiles(op, TileConfig(row_tile=1)) == []


def test_double_buffering_room_is_half_of_l0a_and_l0b():
    roomy = TileConfig(row_tile=16, cube_k=(128, 1024), cube_n=(128, 128))
    assert tile_budget.double_buffered("linear", roomy)
    assert not tile_budget.double_buffered("linear", replace(roomy, cube_k=(256, 1024)))


@pytest.mark.parametrize(
    "klass",
    [
        k
        for k in tile_search.CANDIDATES
        if k[0] in ("mlp_block", "attention_prologue", "linear", "attention_core")
    ],
)
def test_the_block_decode_entries_are_the_searchs_first_choice(klass):
    """tile_search.json holds the cost model's cycles per candidate: the entry is the one it ranks first."""
    cycles, config = tile_search.best(tile_search.load(), klass)[0]
    assert BLOCK_TILE_TABLE[klass] == TileConfig.from_dict(json.loads(config)), cycles


def _expanded(*shape, dtype=torch.float32):
    return torch.zeros((), dtype=dtype).expand(*shape)  # the shape without the memory


def test_an_over_budget_call_is_refused_before_pypto_compiles():
    x = torch.randn(1, 2048)  # fp32 at GutenOCR width: the decode entry's gate/up need 544 KiB of L1
    weights = (_expanded(11008, 2048), _expanded(11008, 2048), _expanded(2048, 11008))
    with pytest.raises(
        tile_budget.TileBudgetError, match=r"swiglu_mlp tiling does not fit the chip: gate/up: L1"
    ):
        pypto_ops._run_swiglu_mlp(x, *weights)


def test_an_over_budget_kernel_falls_back_with_its_reason_counted():
    import pto_kernels

    mlp = torch.nn.Module()
    mlp.gate_proj, mlp.up_proj = (
        torch.nn.Linear(2048, 11008, bias=False),
        torch.nn.Linear(2048, 11008, bias=False),
    )
    mlp.down_proj, mlp.act_fn = torch.nn.Linear(11008, 2048, bias=False), torch.nn.SiLU()
    x = torch.randn(1, 1, 2048)
    with torch.no_grad(), pto_kernels.enabled(("swiglu_mlp",), backend="pypto"):
        got = pto_kernels.swiglu_mlp_wrapper(mlp, x)
        stats = pto_kernels.stats()["swiglu_mlp"]
    assert stats["fallbacks"] == 1 and stats["backends"] == {"torch": 1}
    assert "TileBudgetError" in stats["first_fallback_error"]
    assert "L1 544 KiB" in stats["first_fallback_error"]
    torch.testing.assert_close(
        got, mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    )


def test_tile_search_never_ranks_an_over_budget_candidate():
    klass = ("mlp_block", "decode", None)
    shapes, configs = tile_search.CANDIDATES[klass]
    results = {}
    for cycles, config in zip(range(100, 100 * (len(configs) + 1), 100), configs, strict=True):
        for params in shapes:
            results[tile_search._key("mlp_block", params, config)] = {"status": "ok", "cycles": cycles}
    ranked = tile_search.best(results, klass)
    assert len(ranked) == len(configs) - 1  # the old entry, the fastest here, is refused
    assert all(tile_budget.problems("mlp_block", config) == [] for config in configs[1:])
    assert 100 * len(shapes) not in [cycles for cycles, _ in ranked]


def test_tile_search_prefers_double_buffering_that_costs_no_more_than_the_margin():
    klass = ("linear", "decode", None)
    shapes, configs = tile_search.CANDIDATES[klass]
    full, roomy = configs[0], configs[1]
    assert not tile_budget.double_buffered("linear", full) and tile_budget.double_buffered("linear", roomy)

    def ranked(full_cycles, roomy_cycles):
        results = {}
        for config, cycles in ((full, full_cycles), (roomy, roomy_cycles)):
            for params in shapes:
                results[tile_search._key("linear", params, config)] = {"status": "ok", "cycles": cycles}
        return [cycles for cycles, _ in tile_search.best(results, klass)]

    assert ranked(1000, 1010) == [2020, 2000]  # 1 % slower with room for a second tile: first
    assert ranked(1000, 1100) == [2000, 2200]  # 10 % slower: the full one first
