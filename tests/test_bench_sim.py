"""benchmarks/bench_sim.py's arithmetic: swim-lane spans, the bandwidth floor, roofline ratios, targets."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_sim  # noqa: E402

SOC = {"ddr_rate_bytes_per_cycle": 32, "ai_core_cnt": 24, "cube_freq_mhz": 1850}


def test_swim_span_counts_aicore_lanes_only(tmp_path):
    lanes = [
        {"blockIdx": 0, "coreType": "HUB", "tasks": [{"execStart": 100, "execEnd": 101}]},
        {"blockIdx": 1, "coreType": "AIC", "tasks": [{"execStart": 5000, "execEnd": 9000}]},
        {"blockIdx": 2, "coreType": "AIV", "tasks": [{"execStart": 4000, "execEnd": 8000}]},
        {"blockIdx": 3, "coreType": "HUB", "tasks": [{"execStart": 20000, "execEnd": 20001}]},
    ]
    path = tmp_path / "_simulate.swim.json"
    path.write_text(json.dumps(lanes))
    assert bench_sim.swim_span(path) == (5000, 2)
    path.write_text(json.dumps(lanes[:1]))
    assert bench_sim.swim_span(path) is None


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
