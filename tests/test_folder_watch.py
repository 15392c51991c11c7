"""A run whose model folder changes under it fails, never passes (issue 51, item 6; run/folder_watch.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pto_patch.errors import EXIT_VERIFY_FAILED
from pto_patch.patching.folder_watch import FolderState
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
    from pto_patch.run import bench, verify

    module = verify if command == "verify" else bench
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


def test_the_folder_state_is_decided_once_a_verify(patched_copy: Path, monkeypatch, capsys):
    """The plan decides the folder's patch state and the ops the run may switch on, once; the reference's
    view and the load take them from it (the patch state of the reference's own view is another folder's)."""
    from pto_patch.model.spec import OpsAsked
    from pto_patch.patching import folder_check, run_folder
    from pto_patch.patching import patch_state as patch_state_module

    folder = Path(patched_copy).resolve()
    decided, candidates = [], []
    real_state, real_candidates = patch_state_module.patch_state, OpsAsked.may_switch_on

    def counted_state(path):
        if Path(path).resolve() == folder:
            decided.append(path)
        return real_state(path)

    def counted_candidates(*args, **kwargs):
        candidates.append(args)
        return real_candidates(*args, **kwargs)

    for module in (run_folder, folder_check):
        monkeypatch.setattr(module, "patch_state", counted_state)
    monkeypatch.setattr(OpsAsked, "may_switch_on", counted_candidates)
    code = run_in_process("verify", "--model-path", str(patched_copy), *QUICK, "--json")
    document = json.loads(capsys.readouterr().out)
    assert code == 0 and document["passed"] is True, document
    assert len(decided) == 1 and len(candidates) == 1, (decided, candidates)


@pytest.mark.parametrize("step", ["reference", "load"])
def test_a_folder_changed_after_the_plan_is_refused_before_it_is_read(step, patched_copy: Path, capsys):
    """What the plan decided (patched, which ops, where the originals lie) holds only for the files it saw:
    a file changed before the reference or the load reads the folder stops the run, one line."""
    from pto_patch.errors import ModelFolderError
    from pto_patch.run.reference import open_reference
    from pto_patch.run.start import plan_run, start_run
    from pto_patch.run.verify import VerifyOptions

    plan = plan_run(VerifyOptions(model_path=str(patched_copy)), batch=1, use_pto=True)
    (patched_copy / "generation_config.json").write_text("{}\n")
    with pytest.raises(ModelFolderError) as raised:
        if step == "reference":
            with open_reference(plan):
                pass
        else:
            start_run(plan)
    assert "changed since this run checked it (generation_config.json rewritten)" in raised.value.message
    assert "\n" not in raised.value.message


def test_an_unchanged_folder_goes_on_from_its_plan(patched_copy: Path):
    from pto_patch.run.start import plan_run
    from pto_patch.run.verify import VerifyOptions

    plan = plan_run(VerifyOptions(model_path=str(patched_copy)), batch=1, use_pto=True)
    plan.check_unchanged()  # nothing changed: no error
    assert plan.read.checked.patched and plan.read.checked.patch is not None
    assert plan.read.may_switch_on == ("rms_norm", "mrope", "swiglu_mlp")
