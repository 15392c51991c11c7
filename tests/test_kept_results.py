"""Nothing measured is lost (issue 51, item 2): a place without room is refused before the run, and a write
that still fails after the work keeps its bytes in pto-patch's cache, names them, and prints the verdict
(run/kept_results.py). The fault is an OSError(ENOSPC) injected at the writer."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from pto_patch.errors import EXIT_ERROR, EXIT_USAGE
from pto_patch.patching import fileio
from pto_patch.run import kept_results
from tests.spec_pipeline import run_in_process

QUICK = ["--warmup", "0", "--iters", "1", "--output_length", "2"]


def _full_disk_under(monkeypatch, folder: Path) -> None:
    """Every file written under `folder` fails with ENOSPC at the writer (a disk that filled during the run)."""
    real_beside = fileio._written_beside

    def written_beside(path, data, mode):
        if Path(path).resolve().is_relative_to(folder.resolve()):
            raise OSError(errno.ENOSPC, "No space left on device (injected)", str(path))
        return real_beside(path, data, mode)

    monkeypatch.setattr(fileio, "_written_beside", written_beside)


def _no_room(monkeypatch, folder: Path, free: int = 0) -> None:
    """statvfs says `folder` has `free` bytes left (a full disk; mkstemp still makes an empty file)."""
    real = os.statvfs

    class Full:
        def __init__(self, stats):
            self.f_frsize, self.f_bavail = stats.f_frsize, free // stats.f_frsize

    def statvfs(path):
        stats = real(path)
        return Full(stats) if Path(path).resolve() == folder.resolve() else stats

    monkeypatch.setattr(kept_results.os, "statvfs", statvfs)


def _loads_nothing(monkeypatch) -> None:
    from pto_patch.run import loading

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the write's place was checked")

    monkeypatch.setattr(loading, "load_model", load_model)


def _kept_files(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / kept_results.KEPT).rglob("*") if p.is_file())


# --- before the run: room as well as permission ------------------------------------------------------


def test_room_is_checked_with_a_margin_and_real_bytes(tmp_path: Path, monkeypatch):
    assert kept_results.room_problem(tmp_path) is None
    _no_room(monkeypatch, tmp_path, free=kept_results.ROOM_MARGIN_BYTES - 1)
    assert "under the 16.0 MB a run needs" in kept_results.room_problem(tmp_path)
    monkeypatch.undo()
    real_write = os.write

    def write(fd, data):  # an empty file is made, its first real bytes are refused
        if os.readlink(f"/proc/self/fd/{fd}").split("/")[-1].startswith(".pto-patch-probe-"):
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        return real_write(fd, data)

    monkeypatch.setattr(kept_results.os, "write", write)
    problem = kept_results.room_problem(tmp_path)
    monkeypatch.undo()
    assert problem == f"cannot write in {tmp_path} (Disk quota exceeded)"
    assert list(tmp_path.iterdir()) == []  # the probe is gone


@pytest.mark.parametrize(
    "command",
    [
        ["verify", "--report-file", "{out}/report.json"],
        ["verify", "--ocr", "--save-outputs", "{out}/answers.json"],
        ["bench", "--output-dir", "{out}"],
        ["bench", "--ocr", "--plot", "{out}/plot.png"],
    ],
)
def test_a_place_without_room_is_refused_before_anything_loads(
    command, patched_tiny: Path, tmp_path: Path, monkeypatch, capsys
):
    out = tmp_path / "out"
    out.mkdir()
    _no_room(monkeypatch, out)
    _loads_nothing(monkeypatch)
    args = [a.replace("{out}", str(out)) for a in command]
    code = run_in_process(*args, "--model-path", str(patched_tiny))
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and "0.0 MB free, under the 16.0 MB a run needs" in err, err
    assert "Traceback" not in err and list(out.iterdir()) == []


def test_tune_checks_its_tuning_files_place_before_the_search(patched_copy: Path, monkeypatch, capsys):
    _no_room(monkeypatch, patched_copy / ".pto_patch")
    _loads_nothing(monkeypatch)
    code = run_in_process("tune", "--model-path", str(patched_copy), "--batches", "1")
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and "the tuning file" in err and "a run needs before it writes there" in err, (
        err
    )


# --- after the work: the results kept, the verdict printed -------------------------------------------


def test_verify_keeps_its_report_and_prints_its_verdict_when_the_write_fails(
    patched_tiny: Path, tmp_path: Path, monkeypatch, capsys
):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PTO_PATCH_CACHE", str(cache))
    out = tmp_path / "out"
    out.mkdir()
    target = out / "report.json"
    target.write_text("the earlier report")
    _full_disk_under(monkeypatch, out)
    code = run_in_process("verify", "--model-path", str(patched_tiny), *QUICK, "--report-file", str(target))
    captured = capsys.readouterr()
    assert code == EXIT_ERROR, captured.err
    assert "PASSED" in captured.out and "report written to" not in captured.out
    (kept,) = _kept_files(cache)
    assert (
        f"error: cannot write --report-file {target}: No space left on device (injected); kept at {kept}"
        in (" ".join(captured.err.split()))
    )
    assert json.loads(kept.read_text())["passed"] is True  # every measurement, in the cache
    assert target.read_text() == "the earlier report" and sorted(p.name for p in out.iterdir()) == [
        "report.json"
    ]


def test_verify_json_still_prints_one_document_naming_the_kept_report(
    patched_tiny: Path, tmp_path: Path, monkeypatch, capsys
):
    monkeypatch.setenv("PTO_PATCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    out.mkdir()
    _full_disk_under(monkeypatch, out)
    code = run_in_process(
        "verify", "--model-path", str(patched_tiny), *QUICK, "--report-file", str(out / "r.json"), "--json"
    )
    document = json.loads(capsys.readouterr().out)
    assert code == EXIT_ERROR and document["passed"] is True and document["report_file"] is None
    (kept,) = document["kept"]
    assert kept["flag"] == "--report-file" and kept["target"] == str(out / "r.json")
    saved = json.loads(Path(kept["kept"]).read_text())
    assert saved.pop("report_file") == str(out / "r.json")  # as it would have been written
    assert saved == {key: value for key, value in document.items() if key not in ("kept", "report_file")}


def test_bench_keeps_both_reports_when_its_folder_fills(
    patched_tiny: Path, tmp_path: Path, monkeypatch, capsys
):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PTO_PATCH_CACHE", str(cache))
    out = tmp_path / "out"
    _full_disk_under(monkeypatch, tmp_path / "out")
    code = run_in_process(
        "bench", "--model-path", str(patched_tiny), *QUICK, "--output-dir", str(out), "--json"
    )
    document = json.loads(capsys.readouterr().out)
    assert code == EXIT_ERROR
    assert [Path(kept["kept"]).parent for kept in document["kept"]] == [cache / kept_results.KEPT] * 2
    assert sorted(document["files"]) == sorted(kept["kept"] for kept in document["kept"])
    assert [json.loads(p.read_text())["mode"] for p in _kept_files(cache)] != []
    assert not out.exists() or list(out.iterdir()) == []


def test_a_cache_that_cannot_take_them_either_still_prints_the_verdict(
    patched_tiny: Path, tmp_path: Path, monkeypatch, capsys
):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PTO_PATCH_CACHE", str(cache))
    _full_disk_under(monkeypatch, tmp_path)
    code = run_in_process(
        "verify", "--model-path", str(patched_tiny), *QUICK, "--report-file", str(tmp_path / "r.json")
    )
    captured = capsys.readouterr()
    assert code == EXIT_ERROR and "PASSED" in captured.out
    assert "could not be kept in pto-patch's cache either" in " ".join(captured.err.split())
    assert not (tmp_path / "r.json").exists()


def test_verify_ocr_keeps_its_answers_and_report(patched_tiny: Path, tmp_path: Path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PTO_PATCH_CACHE", str(cache))
    out = tmp_path / "out"
    out.mkdir()
    _full_disk_under(monkeypatch, out)
    args = ["--save-outputs", str(out / "answers.json"), "--report-file", str(out / "report.json")]
    code = run_in_process("verify", "--ocr", "--model-path", str(patched_tiny), *QUICK, *args, "--json")
    document = json.loads(capsys.readouterr().out)
    assert code != 0 and document["saved_outputs"] is None
    assert [kept["flag"] for kept in document["kept"]] == ["--save-outputs", "--report-file"]
    answers = json.loads(Path(document["kept"][0]["kept"]).read_text())
    assert answers["answers"] and answers["weights_digest"]
    assert list(out.iterdir()) == []


def test_tune_keeps_its_tuning_when_the_write_fails(patched_copy: Path, tmp_path: Path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PTO_PATCH_CACHE", str(cache))
    _full_disk_under(monkeypatch, patched_copy / ".pto_patch")
    manifest = (patched_copy / ".pto_patch" / "manifest.json").read_bytes()
    code = run_in_process(
        "tune", "--model-path", str(patched_copy), "--batches", "1", "--output_length", "2", "--json"
    )
    document = json.loads(capsys.readouterr().out)
    assert document["tuning_file"] is None and code != 0
    (kept,) = document["kept"]
    assert kept["flag"] == "the tuning file" and json.loads(Path(kept["kept"]).read_text())["batches"]
    assert not (patched_copy / ".pto_patch" / "tuning.json").exists()
    assert (patched_copy / ".pto_patch" / "manifest.json").read_bytes() == manifest
