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
