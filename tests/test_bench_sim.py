"""benchmarks/bench_sim.py's arithmetic: swim-lane spans, the bandwidth floor, roofline ratios, targets."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_sim  # noqa: E402

SOC = {
    "ddr_rate_bytes_per_cycle": 32,
    "ai_core_cnt": 24,
    "cube_freq_mhz": 1850,
    "cube_core_cnt": 24,
    "cube_macs_per_cycle": 16 * 16 * 16,
}


def test_swim_span_counts_aicore_lanes_only(tmp_path):
    lanes = [
        {"blockIdx": 0, "coreType": "HUB", "tasks": [{"execStart": 100, "execEnd": 101}]},
        {"blockIdx": 1, "coreType": "AIC", "tasks": [{"execStart": 5000, "execEnd": 9000}]},
        {"blockIdx": 2, "coreType": "AIV", "tasks": [{"execStart": 4000, "execEnd": 8000}]},
        {"blockIdx": 3, "coreType": "HUB", "tasks": [{"execStart": 20000, "execEnd": 20001}]},
    ]
    path = tmp_path / "_simulate.swim.json"
    path.write_text(json.dumps(lanes))
    assert bench_sim.swim_span(bench_sim.aicore_tasks(path)) == (5000, 2)
    path.write_text(json.dumps(lanes[:1]))
    assert bench_sim.swim_span(bench_sim.aicore_tasks(path)) is None


def test_roofline_ratio_and_targets():
    moved = bench_sim.min_bytes("swiglu_mlp", {"rows": 1})
    assert moved == 2 * (3 * 2048 * 11008 + 2 * 2048)
    floor = moved / (32 * 24)
    at_floor = bench_sim.with_roofline(
        {"op": "swiglu_mlp", "params": {"rows": 1}, "status": "ok", "cycles": floor * 1.25}, SOC
    )
    assert at_floor["ratio"] == pytest.approx(1.25) and at_floor["target_met"]
    slow = bench_sim.with_roofline(
        {"op": "swiglu_mlp", "params": {"rows": 4}, "status": "ok", "cycles": floor * 1.31}, SOC
    )
    assert not slow["target_met"]
    decode_norm = bench_sim.with_roofline(
        {"op": "rms_norm", "params": {"rows": 1, "width": 2048}, "status": "ok", "cycles": 3600, "us": 2.0},
        SOC,
    )
    assert decode_norm["target"] == "us <= 2.0" and decode_norm["target_met"]
    failed = bench_sim.with_roofline({"op": "mrope", "params": {"rows": 700}, "status": "not available"}, SOC)
    assert "ratio" not in failed and "target_met" not in failed


@pytest.mark.skipif(importlib.util.find_spec("pypto") is None, reason="pypto not installed (extra `pto`)")
def test_soc_config_comes_from_the_installed_pypto():
    soc = bench_sim.soc_config()
    assert Path(soc["path"]).name == "A2A3.ini" and Path(soc["path"]).is_file()
    assert soc["ddr_rate_bytes_per_cycle"] > 0 and soc["ai_core_cnt"] > 0 and soc["cube_freq_mhz"] > 0


def _pipe_lane(block, task, copies, latency=1400):
    ops = [
        {
            "execStart": i * latency,
            "execEnd": (i + 1) * latency,
            "tileOp": f"1 COPY_IN a TO b TASK[{task}] (a)",
        }
        for i in range(copies)
    ]
    ops.append({"execStart": 0, "execEnd": 7, "tileOp": f"2 VEC_DUP TO c TASK[{task}]"})
    return {"blockIdx": block, "coreType": "AIV", "pipeLogs": {"MTE_IN": ops}}


def test_fixed_costs_name_the_longest_task_the_dispatch_spread_and_serial_copies(tmp_path):
    swim, pipes = tmp_path / "_simulate.swim.json", tmp_path / "_simulate.pipe.swim.json"
    swim.write_text(
        json.dumps(
            [
                {"blockIdx": 0, "coreType": "HUB", "tasks": [{"execStart": 1, "execEnd": 90000}]},
                {"blockIdx": 24, "coreType": "AIV", "tasks": [{"execStart": 3600, "execEnd": 7064}]},
                {"blockIdx": 25, "coreType": "AIV", "tasks": [{"execStart": 3800, "execEnd": 8300}]},
            ]
        )
    )
    pipes.write_text(json.dumps([_pipe_lane(24, 0, 2), _pipe_lane(25, 1, 3, latency=1500)]))
    costs = bench_sim.fixed_costs(bench_sim.aicore_tasks(swim), pipes)
    assert costs == {
        "longest_task": 4500,
        "dispatch_spread": 200,
        "copy_ins_per_task": 3,
        "copy_in_cycles_median": 1500,
    }
    pipes.unlink()  # an older pypto without the pipe lanes: the task figures alone
    assert bench_sim.fixed_costs(bench_sim.aicore_tasks(swim), pipes)["copy_ins_per_task"] == 0
    swim.write_text(
        json.dumps([{"blockIdx": 0, "coreType": "HUB", "tasks": [{"execStart": 1, "execEnd": 2}]}])
    )
    assert bench_sim.fixed_costs(bench_sim.aicore_tasks(swim), pipes) is None


def test_a_long_prefill_mlp_is_judged_against_the_compute_floor_too():
    bandwidth = bench_sim.min_bytes("swiglu_mlp", {"rows": 2048}) / (32 * 24)
    compute = 3 * 2048 * 2048 * 11008 / (16 * 16 * 16 * 24)
    assert compute > bandwidth  # 2048 tokens: the cube, not the weights, sets the floor
    entry = bench_sim.with_roofline(
        {"op": "swiglu_mlp", "params": {"rows": 2048}, "status": "ok", "cycles": compute * 2}, SOC
    )
    assert entry["roofline_ratio"] == pytest.approx(2.0) and entry["ratio"] > 2.0
    decode_floor = bench_sim.min_bytes("swiglu_mlp", {"rows": 1}) / (32 * 24)
    decode = bench_sim.with_roofline(
        {"op": "swiglu_mlp", "params": {"rows": 1}, "status": "ok", "cycles": decode_floor * 1.2}, SOC
    )
    assert decode["ratio"] == pytest.approx(1.2) and decode["roofline_ratio"] == pytest.approx(1.2)
    norm = bench_sim.with_roofline(
        {"op": "rms_norm", "params": {"rows": 8, "width": 2048}, "status": "ok", "cycles": 5000, "us": 2.8},
        SOC,
    )
    assert "compute_floor_cycles" not in norm and norm["roofline_ratio"] == norm["ratio"]


def test_block_floors_are_the_weights_they_stream():
    """The issue's floors: MLP about 176,160 cycles (+ o_proj 10,923), q/k/v 13,653, a layer about 200,700."""
    per_cycle = 32 * 24
    mlp = bench_sim.min_bytes("mlp_block", {"rows": 1}) / per_cycle
    weights = 2 * (3 * 2048 * 11008 + 2048 * 2048) / per_cycle  # 176,128 + 10,923
    assert weights < mlp < weights + 30  # plus the row's activations and the norm weight
    prologue = bench_sim.min_bytes("attention_prologue", {"rows": 1}) / per_cycle
    assert 13_653 < prologue < 13_653 + 30
    layer = bench_sim.min_bytes("decoder_layer/fused", {"rows": 1}) / per_cycle
    assert layer == bench_sim.min_bytes("decoder_layer/per_op", {"rows": 1}) / per_cycle
    assert 200_700 < layer < 200_760
    assert bench_sim.min_bytes("residual_rms_norm", {"rows": 1, "width": 2048}) == 2 * (4 * 2048 + 2048)
    assert bench_sim.min_bytes("linear", {"rows": 2, "in": 2048, "out": 256}) == 2 * (2048 * 256 + 2 * 2304)
    assert bench_sim.matmul_macs("mlp_block", {"rows": 4}) == 4 * (3 * 2048 * 11008 + 2048 * 2048)


def test_block_targets():
    def judged(op, rows, **fields):
        params = {"rows": rows, "width": 2048} if op == "residual_rms_norm" else {"rows": rows}
        return bench_sim.with_roofline({"op": op, "params": params, "status": "ok", **fields}, SOC)

    assert judged("residual_rms_norm", 1, cycles=3500, us=1.95)["target_met"]
    assert not judged("residual_rms_norm", 1, cycles=4914, us=2.73)["target_met"]
    assert "target" not in judged("residual_rms_norm", 8, cycles=6000, us=3.3)  # the target is for 1 row
    floor = bench_sim.min_bytes("mlp_block", {"rows": 1}) / (32 * 24)
    assert judged("mlp_block", 1, cycles=floor * 1.19)["target_met"]
    assert not judged("mlp_block", 16, cycles=floor * 1.21)["target_met"]
    floor = bench_sim.min_bytes("attention_prologue", {"rows": 1}) / (32 * 24)
    assert judged("attention_prologue", 1, cycles=floor * 1.5)["target"] == "ratio <= 1.5"
    assert "target" not in judged("decoder_layer/per_op", 1, cycles=300_000)


def _ok(op, params, cycles):
    return {"op": op, "params": params, "status": "ok", "cycles": cycles, "tasks": 2, "wall_s": 1.0}


def test_decoder_layer_rows_sum_their_kernels_spans():
    entries = [
        _ok(op, {"rows": 1} | p, 1000 * (n + 1)) for n, (op, p) in enumerate(bench_sim.block_shapes((1,)))
    ]
    layers = {e["op"]: e for e in bench_sim.layer_entries(entries, SOC)}
    assert set(layers) == {"decoder_layer/per_op", "decoder_layer/fused"}
    spans = {(e["op"], str(sorted(e["params"].items()))): e["cycles"] for e in entries}

    def expected(variant):
        return sum(
            spans[(op, str(sorted(({"rows": 1} | p).items())))] for op, p in bench_sim.LAYER_KERNELS[variant]
        )

    for variant in ("per_op", "fused"):
        layer = layers[f"decoder_layer/{variant}"]
        assert layer["cycles"] == expected(variant)
        assert layer["kernels"] == len(bench_sim.LAYER_KERNELS[variant])
        assert layer["ratio"] == pytest.approx(
            layer["cycles"] / (bench_sim.min_bytes(layer["op"], {"rows": 1}) / 768)
        )
    assert layers["decoder_layer/per_op"]["kernels"] == 8  # rms_norm x2, q, k, v, mrope, o, swiglu_mlp
    assert layers["decoder_layer/fused"]["target"] == "ratio <= 1.3"


def test_a_decoder_layer_with_a_kernel_that_did_not_simulate_is_not_available():
    entries = [_ok(op, {"rows": 4} | p, 5000) for op, p in bench_sim.block_shapes((4,))]
    entries[1] = entries[1] | {"status": "not available", "reason": "SIM did not finish in 300 s"}
    layers = bench_sim.layer_entries(entries, SOC)
    broken = [e for e in layers if e["status"] != "ok"]
    assert broken and all("not simulated" in e["reason"] for e in broken)
    # a variant whose kernels were not all run gets no row at all: here the per-op one
    assert [e["op"] for e in bench_sim.layer_entries(entries[:3], SOC)] == ["decoder_layer/fused"]


def test_block_shapes_list_each_kernel_once_per_row_count():
    shapes = bench_sim.block_shapes()
    assert len(shapes) == len({(op, str(sorted(p.items()))) for op, p in shapes})
    assert {p["rows"] for _, p in shapes} == set(bench_sim.DECODE_ROWS)
    ops = {op for op, _ in shapes}
    assert {"residual_rms_norm", "mlp_block", "attention_prologue", "linear", "swiglu_mlp"} <= ops
    # q, k, v and o: at GutenOCR width q and o are both 2048 x 2048 and k, v both 2048 -> 256
    assert sum(1 for op, p in shapes if op == "linear" and p["rows"] == 1) == 2


def test_each_kernel_row_names_its_largest_tiles_and_whether_they_fit():
    from dataclasses import asdict

    from pto_kernels.tiling.tile_table import TileConfig

    assert bench_sim.buffer_use("rms_norm", {"rows": 1, "width": 2048}) is None  # no matmul
    assert bench_sim.buffer_use("kv_cache_write", {"rows": 1, "context": 1024}) is None
    # 4 rows and 1 (the decode and one_row kernels, the same matmul tiles): gate/up's whole-width L1 tiles
    # fill the 512 KiB, its 112-column L0B tile takes 56 KiB
    assert bench_sim.buffer_use("mlp_block", {"rows": 4}) == {"l1_kib": 512, "l0b_kib": 56, "fits": True}
    assert bench_sim.buffer_use("mlp_block", {"rows": 1}) == {"l1_kib": 512, "l0b_kib": 56, "fits": True}
    over = TileConfig(row_tile=16, cube_k=(256, 1024), cube_n=(128, 256))
    assert bench_sim.buffer_use("mlp_block", {"rows": 1}, asdict(over)) == {
        "l1_kib": 544,
        "l0b_kib": 64,
        "fits": False,
    }
    assert bench_sim._buffers({"buffers": {"l1_kib": 544, "l0b_kib": 64, "fits": False}}) == "544/64 OVER"
