"""A run whose model folder changes under it fails, never passes (issue 51, item 6; run/folder_watch.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pto_patch.errors import EXIT_VERIFY_FAILED
from pto_patch.run.folder_watch import FolderState
from tests.spec_pipeline import run_in_process

QUICK = ["--warmup", "0", "--iters", "1", "--output_length", "2"]


def test_a_file_added_removed_or_rewritten_is_named(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pto_kernels").mkdir()
    (tmp_path / "pto_kernels" / "ops.py").write_text("x = 1\n")
    state = FolderState.now(tmp_path)
    assert state.changes() == []
    (tmp_path / "pto_kernels" / "__pycache__").mkdir()  # the import's own byte code is no change
    (tmp_path / "pto_kernels" / "__pycache__" / "ops.cpython-312.pyc").write_bytes(b"\0")
    assert state.changes() == []
    stats = (tmp_path / "config.json").stat()
    (tmp_path / "config.json").write_text("{ }")
    os.utime(tmp_path / "config.json", ns=(stats.st_atime_ns, stats.st_mtime_ns + 10**9))
    (tmp_path / "pto_kernels" / "ops.py").unlink()
    (tmp_path / "extra.py").write_text("")
    (failure,) = state.changes()
    assert failure.startswith(
        "the model folder changed during the run (config.json rewritten, extra.py added, pto_kernels/ops.py removed)"
    )


@pytest.mark.parametrize("command", ["verify", "bench"])
def test_a_restore_during_the_run_fails_it(command, patched_copy: Path, tmp_path: Path, monkeypatch, capsys):
    """restore takes the folder's lock once the load has let it go; the run goes on over kernels that are
    gone (every op falls back, eager against eager), and must not say PASSED."""
    from pto_patch.patching.restore import restore_model
    from pto_patch.run import bench, verification

    module = verification if command == "verify" else bench
    real = module.measure_modes

    def restored_meanwhile(*args, **kwargs):
        timed = real(*args, **kwargs)
        restore_model(model_path=patched_copy)
        return timed

    monkeypatch.setattr(module, "measure_modes", restored_meanwhile)
    extra = ["--batches", "1", "--output-dir", str(tmp_path / "out")] if command == "bench" else []
    code = run_in_process(command, "--model-path", str(patched_copy), *QUICK, *extra, "--json")
    document = json.loads(capsys.readouterr().out)
    assert code == EXIT_VERIFY_FAILED and document["passed"] is False, document
    assert any(f.startswith("the model folder changed during the run (") for f in document["failures"])
    assert not (patched_copy / ".pto_patch").exists()  # it was restored indeed
