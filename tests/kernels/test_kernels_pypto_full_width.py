"""The blocks and the MLP at GutenOCR-3B's full widths through PyPTO's interpreter, rows ending in a partial
tile, against float64 (benchmarks/full_width_interpreter.py). Here: attention_prologue at 5 rows (about 20 s);
the MLP cases take minutes each in the interpreter, so they and the prefill row counts run in the script,
whose results docs/pypto-on-device.md records."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import full_width_interpreter as full_width  # noqa: E402

ROWS = 5  # the decode tiling's 16-row tiles: one partial tile


def _case(rows=3, width=8):
    buffer, view = full_width.poisoned(rows, width, torch.bfloat16)
    expected = torch.randn(rows, width, dtype=torch.float64)
    return buffer, view, expected


def test_a_right_output_passes():
    buffer, view, expected = _case()
    view.copy_(expected)
    verdict = full_width.check_output("out", buffer, 3, expected)
    assert verdict["ok"] and verdict["unwritten_rows"] == verdict["sentinel_rows_changed"] == 0


def test_a_row_left_unwritten_fails():
    buffer, view, expected = _case()
    view[:2].copy_(expected[:2])  # the tail row stays NaN
    verdict = full_width.check_output("out", buffer, 3, expected)
    assert not verdict["ok"] and verdict["unwritten_rows"] == 1


def test_a_tail_tile_written_past_its_valid_rows_fails():
    buffer, view, expected = _case()
    view.copy_(expected)
    buffer[3:5] = 0.0  # as a whole tile assembled over the sentinel rows would
    verdict = full_width.check_output("out", buffer, 3, expected)
    assert not verdict["ok"] and verdict["sentinel_rows_changed"] == 2


def test_a_wrong_value_fails():
    buffer, view, expected = _case()
    view.copy_(expected * 1.05)
    verdict = full_width.check_output("out", buffer, 3, expected)
    assert not verdict["ok"] and verdict["rel_error"] > full_width.REL_TOL


@pytest.mark.slow
@pytest.mark.pypto
@pytest.mark.skipif(importlib.util.find_spec("pypto") is None, reason="pypto not installed (extra `pto`)")
def test_full_width_with_a_partial_tile_matches_float64():
    result = full_width.run_in_subprocess("attention_prologue", ROWS, timeout_s=900)
    assert result["ok"], result
    assert result["row_tile"] == 16 and result["rows"] % result["row_tile"]  # a partial tile ran
    assert all(o["sentinel_rows_changed"] == 0 and o["unwritten_rows"] == 0 for o in result["outputs"])
