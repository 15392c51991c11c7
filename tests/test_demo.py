"""`pto-patch demo`: offline, end to end, and nothing left behind without --keep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pto_patch.errors import PtoPatchError
from pto_patch.run import demo
from pto_patch.tiny.model import make_tiny
from tests.folder_snapshot import snapshot

pytestmark = pytest.mark.slow


def run_demo_cli(args: list[str], tmp_path: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "1"}
    for name in ("HF_MODULES_CACHE", "PTO_KERNELS_BACKEND", "GUTENOCR_MODEL_PATH"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "pto_patch", "demo", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )


def test_demo_in_a_temporary_folder_leaves_nothing_behind(tmp_path: Path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    work = tmp_path / "work"
    done = run_demo_cli(["--dir", str(work), "--json"], tmp_path, cwd)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json.loads(done.stdout)
    assert doc["passed"] and doc["hashes_identical"] and doc["files_compared"] > 0
    assert [step["step"] for step in doc["steps"]] == [
        "make-tiny",
        "apply",
        "status",
        "verify --use_pto",
        "restore",
    ]
    report = doc["verify"]
    assert report["passed"] and report["input"]["kind"] == "image"
    # Timing on the tiny model: more than a couple of runs per mode, and labelled for what it is.
    assert len(report["baseline"]["latencies_s"]) >= 5 and len(report["pto"]["latencies_s"]) >= 5
    assert report["options"]["warmup"] >= 2
    assert "indicative only" in doc["timing_note"] and "pto-patch bench" in doc["timing_note"]
    assert report["dtype"] == "bfloat16" and report["accuracy"]["max_abs_logit_diff"] == 0
    assert all(report["pto"]["ops"][op]["calls"] > 0 for op in report["switched_on"])
    assert doc["modules_cache"] == str(work / demo.MODULES_DIR)
    assert not work.exists()  # created by the demo, removed by it
    assert list(cwd.iterdir()) == []
    assert not (tmp_path / "hf-home").exists()  # remote code went to the demo's own cache


def test_demo_keep_leaves_the_restored_model(tmp_path: Path):
    work = tmp_path / "mine"
    work.mkdir()
    (work / "notes.txt").write_text("the user's file\n", encoding="utf-8")
    done = run_demo_cli(["--dir", str(work), "--keep"], tmp_path, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert "PASSED" in done.stdout and "identical" in done.stdout
    assert "indicative only" in done.stdout and "--full-width" in done.stdout
    model = work / demo.MODEL_DIR
    assert (model / "config.json").is_file() and (work / demo.IMAGE_NAME).is_file()
    assert not (model / ".pto_patch").exists() and not (model / "pto_kernels").exists()
    assert (work / "notes.txt").read_text(encoding="utf-8") == "the user's file\n"
    # Not the demo's own hash check: a fresh tiny model of the same seed is the same bytes, so the
    # restored folder must equal it file for file, mode for mode, folder for folder.
    fresh = tmp_path / "fresh" / demo.MODEL_DIR
    make_tiny(fresh)
    assert snapshot(model) == snapshot(fresh)


def test_demo_refuses_a_folder_holding_its_files(tmp_path: Path):
    (tmp_path / demo.MODEL_DIR).mkdir()
    with pytest.raises(PtoPatchError, match=demo.MODEL_DIR):
        demo.run_demo(tmp_path)
    assert (tmp_path / demo.MODEL_DIR).is_dir()  # untouched
