"""One function decides a folder's patch state; every command asks it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pto_patch.errors import ModelFolderError
from pto_patch.patching import engine
from pto_patch.patching.manifest import MANIFEST_DIR, STATE_IN_PROGRESS, Manifest
from pto_patch.patching.patch_state import (
    COMPLETE,
    DRIFTED,
    IN_PROGRESS,
    NONE,
    patch_state,
    state_before_writing,
)
from pto_patch.tiny.model import make_tiny


@pytest.fixture(scope="module")
def patched(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("state") / "model"
    make_tiny(folder, layers=1)
    engine.apply_patch(model_path=folder)
    return folder


@pytest.fixture
def copy(patched: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(patched, target, symlinks=True)
    return target


def test_a_plain_folder_holds_no_patch(tmp_path: Path):
    make_tiny(tmp_path / "plain", layers=1)
    state = patch_state(tmp_path / "plain")
    assert state.state == NONE and state.manifest is None and not state.patched and not state.interrupted
    assert patch_state(tmp_path / "absent").state == NONE


def test_a_finished_apply_is_complete(copy: Path):
    state = patch_state(copy)
    assert state.state == COMPLETE and state.patched and state.drifted == ()
    assert state.manifest == Manifest.load(copy)


def test_an_edited_patched_file_is_drift(copy: Path):
    with open(copy / "modeling_qwen2_5_vl.py", "a", encoding="utf-8") as handle:
        handle.write("\n# edited\n")
    state = patch_state(copy)
    assert state.state == DRIFTED and state.patched and state.drifted == ("modeling_qwen2_5_vl.py",)


def test_a_manifest_in_progress_is_an_interrupted_apply(copy: Path):
    Manifest.load(copy).with_state(STATE_IN_PROGRESS).save(copy)
    state = patch_state(copy)
    assert state.state == IN_PROGRESS and state.interrupted and not state.patched
    assert state.manifest is not None


def test_backups_without_a_manifest_are_an_interrupted_apply(copy: Path):
    Manifest.path_in(copy).unlink()  # apply stopped after the backups, before the manifest
    assert any((copy / MANIFEST_DIR).rglob("*"))
    state = patch_state(copy)
    assert state.state == IN_PROGRESS and state.manifest is None


def test_every_command_sees_backups_alone_as_an_interrupted_apply(copy: Path):
    Manifest.path_in(copy).unlink()
    status = engine.model_status(model_path=copy)
    assert status.state == "in_progress" and not status.patched
    with pytest.raises(ModelFolderError, match="interrupted apply"):
        engine.apply_patch(model_path=copy, dry_run=True)
    assert engine.restore_model(model_path=copy).was_interrupted
    assert patch_state(copy).state == NONE


def test_a_damaged_manifest_is_an_error_not_a_state(copy: Path):
    Manifest.path_in(copy).write_text("{}", encoding="utf-8")
    with pytest.raises(ModelFolderError, match="damaged"):
        patch_state(copy)


def test_before_writing_a_damaged_manifest_counts_as_a_patch(copy: Path, tmp_path: Path):
    assert state_before_writing(copy) == COMPLETE
    Manifest.path_in(copy).write_text("{}", encoding="utf-8")
    assert state_before_writing(copy) == COMPLETE
    Manifest.path_in(copy).unlink()
    assert state_before_writing(copy) == IN_PROGRESS
    assert state_before_writing(tmp_path / "nothing here") == NONE
