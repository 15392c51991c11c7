"""The decoder-layer blocks' tile entries (tile_table.BLOCK_TILE_TABLE), without pypto."""

import json
from dataclasses import asdict

import pytest
from pto_kernels.tiling.tile_table import BLOCK_TILE_TABLE, TILE_TABLE, TileConfig, tile_config

BLOCKS = ("residual_rms_norm", "mlp_block", "attention_prologue")


def test_every_block_has_both_classes_and_none_leaks_into_the_per_op_table():
    for op in BLOCKS:
        for klass in ("decode", "prefill"):
            assert (op, klass, None) in BLOCK_TILE_TABLE, (op, klass)
    assert not {key[0] for key in TILE_TABLE} & set(BLOCKS)  # the per-op interpreter tests run TILE_TABLE


def test_blocks_look_up_their_own_table():
    assert tile_config("mlp_block", 2, 2048) == ("decode", BLOCK_TILE_TABLE[("mlp_block", "decode", None)])
    assert (
        tile_config("attention_prologue", 700, 2048)[1]
        is BLOCK_TILE_TABLE[("attention_prologue", "prefill", None)]
    )
    assert tile_config("rms_norm", 1, 2048)[1] is TILE_TABLE[("rms_norm", "decode", None)]


@pytest.mark.parametrize("op", ["attention_prologue", "mlp_block"])
def test_one_row_has_its_own_kernel_and_two_rows_the_decode_one(op):
    one = tile_config(op, 1, 2048)
    assert one == ("one_row", BLOCK_TILE_TABLE[(op, "one_row", None)])
    assert (
        one[1].static and one[1].row_tile == 1 and one[1].norm_rows == 1
    )  # a 1-row loop over more rows would read the weights per row
    assert tile_config(op, 2, 2048)[0] == "decode"
    assert tile_config("residual_rms_norm", 1, 2048)[0] == "decode"  # no one_row entry: the decode one


def test_mlp_block_keeps_its_o_proj_out_of_the_l1_reuse_merge():
    """Subgraph 0 is the o_proj matmul: merged 8 at a time it ran as 2 tasks of ~97k cycles at decode."""
    for klass in ("one_row", "decode", "prefill"):
        options = BLOCK_TILE_TABLE[("mlp_block", klass, None)].pass_options()
        assert options["cube_l1_reuse_setting"][0] == 1 and options["cube_l1_reuse_setting"][-1] > 1, klass


def test_norm_runs_as_one_task_at_decode_only():
    for op in BLOCKS:
        assert BLOCK_TILE_TABLE[(op, "decode", None)].norm_one_task, op
        assert not BLOCK_TILE_TABLE[(op, "prefill", None)].norm_one_task, op


def test_block_configs_round_trip_through_json():
    for config in BLOCK_TILE_TABLE.values():
        again = TileConfig.from_dict(json.loads(json.dumps(asdict(config))))
        assert again == config and hash(again) == hash(config)
