"""A manifest may name nothing outside its folder: crafted records are refused before anything is touched.

A model folder can come from anywhere (a tarball, a hub repo that ships .pto_patch/), so each case
takes a real patched folder, rewrites its manifest the way an attacker (or a broken tool) could,
and checks that restore, apply and status refuse it as damaged, with or without --force, and that
neither the folder nor anything beside it changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from pto_patch.errors import ModelFolderError
from pto_patch.patching import engine
from tests.folder_snapshot import snapshot
from tests.helpers.cli import run_cli
from tests.helpers.folders import HUB_CONFIG, write_config

MANIFEST = Path(".pto_patch") / "manifest.json"


@pytest.fixture(scope="module")
def patched_once(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("template") / "model"
    folder.mkdir()
    write_config(folder, HUB_CONFIG)
    (folder / "tokenizer.json").write_text("{}")
    engine.apply_patch(model_path=folder)
    return folder


@pytest.fixture()
def patched(patched_once: Path, tmp_path: Path) -> Path:
    """A patched folder beside an outside file and an outside folder that must survive every case."""
    folder = tmp_path / "model"
    shutil.copytree(patched_once, folder, symlinks=True)
    (tmp_path / "outside.txt").write_text("not the model's")
    (tmp_path / "outside_dir").mkdir()
    (tmp_path / "outside_dir" / "keep.txt").write_text("keep me")
    return folder


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def added(path: str, folder: Path) -> dict:
    return {"path": path, "action": "added", "sha256_before": None, "sha256_after": sha256(folder)}


def _add_record(record: Callable[[Path], dict]) -> Callable[[dict, Path], None]:
    def change(manifest: dict, folder: Path) -> None:
        manifest["files"].append(record(folder))

    return change


def _set_config_field(**fields) -> Callable[[dict, Path], None]:
    def change(manifest: dict, folder: Path) -> None:
        record = next(r for r in manifest["files"] if r["path"] == "config.json")
        record.update(fields)

    return change


def _link_out(name: str, to: str, then: Callable[[dict, Path], None]) -> Callable[[dict, Path], None]:
    def change(manifest: dict, folder: Path) -> None:
        link = folder / name
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(to, link)
        then(manifest, folder)

    return change


def _added_dirs(*dirs: str) -> Callable[[dict, Path], None]:
    def change(manifest: dict, folder: Path) -> None:
        manifest["added_dirs"] = list(dirs)

    return change


CASES = {
    # the report: restore deleted ../outside.txt, whose real hash the record carried
    "dotdot-added": _add_record(lambda f: added("../outside.txt", f.parent / "outside.txt")),
    "absolute-added": _add_record(lambda f: added(str(f.parent / "outside.txt"), f.parent / "outside.txt")),
    "dotdot-inside-path": _add_record(
        lambda f: added("pto_kernels/../../outside.txt", f.parent / "outside.txt")
    ),
    "dotdot-backup": _set_config_field(backup="../outside.txt"),
    "absolute-backup": _set_config_field(backup="/etc/hostname"),
    "backup-outside-backup-dir": _set_config_field(backup="tokenizer.json"),
    "link-target-out": _set_config_field(symlink_target="../outside.txt"),
    "absolute-link-target": _set_config_field(symlink_target="/etc/hostname"),
    "dotdot-added-dir": _added_dirs("../outside_dir"),
    "absolute-added-dir": _added_dirs("/tmp"),
    "path-under-a-link-out": _link_out(
        "sub",
        "../outside_dir",
        _add_record(lambda f: added("sub/keep.txt", f.parent / "outside_dir/keep.txt")),
    ),
    "backup-is-a-link-out": _link_out(
        ".pto_patch/backup/evil.json",
        "../../../outside.txt",
        _set_config_field(backup=".pto_patch/backup/evil.json"),
    ),
    "added-dir-is-a-link-out": _link_out("gone", "../outside_dir", _added_dirs("gone")),
    "record-in-pto-patch-dir": _add_record(lambda f: added(".pto_patch/manifest.json", f / "config.json")),
}


def picture(root: Path) -> dict:
    return snapshot(root)


@pytest.mark.parametrize("name", list(CASES))
def test_an_escaping_manifest_is_refused_before_anything_is_touched(patched: Path, name: str, capsys):
    manifest_path = patched / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    CASES[name](manifest, patched)
    manifest_path.write_text(json.dumps(manifest))
    before = picture(patched.parent)  # the folder and everything beside it

    for args in (("restore",), ("restore", "--force"), ("status",), ("apply",)):
        assert run_cli(*args, "--model-path", str(patched)) == 1, args
        stderr = capsys.readouterr().err
        assert "is damaged" in stderr and "hint:" in stderr and "Traceback" not in stderr, stderr
        assert len(stderr.strip().splitlines()) == 2
        assert picture(patched.parent) == before, args
    assert (patched.parent / "outside.txt").read_text() == "not the model's"


def test_the_same_record_inside_the_folder_is_accepted(patched: Path):
    """The check is about where a path leads, not about records apply did not write."""
    extra = patched / "extra.txt"
    extra.write_text("added by hand")
    manifest_path = patched / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["files"].append(added("extra.txt", extra))
    manifest_path.write_text(json.dumps(manifest))
    engine.restore_model(model_path=patched)
    assert not extra.exists()


@pytest.mark.parametrize(
    "damage",
    [
        lambda m: m.update(files="config.json"),
        lambda m: m.update(files=[["config.json"]]),
        lambda m: m["files"][0].update(path=7),
        lambda m: m["files"][0].update(action="moved"),
        lambda m: m["files"][0].update(sha256_after="abc"),
        lambda m: m["files"][0].update(mode="rwx"),
        lambda m: m.update(state="half"),
        lambda m: m.update(added_dirs=[""]),
        lambda m: m.pop("files"),
    ],
    ids=["files-str", "record-list", "path-int", "action", "sha", "mode", "state", "empty-dir", "no-files"],
)
def test_a_malformed_manifest_is_one_line_and_changes_nothing(patched: Path, damage, capsys):
    manifest_path = patched / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    damage(manifest)
    manifest_path.write_text(json.dumps(manifest))
    before = picture(patched)
    with pytest.raises(ModelFolderError, match="is damaged"):
        engine.restore_model(model_path=patched, force=True)
    assert run_cli("restore", "--model-path", str(patched)) == 1
    assert "Traceback" not in capsys.readouterr().err
    assert picture(patched) == before


def test_apply_refuses_a_file_linked_outside_the_folder(tmp_path: Path):
    """restore could not recreate such a link safely, so apply does not take it over."""
    folder = tmp_path / "model"
    folder.mkdir()
    real = write_config(tmp_path, HUB_CONFIG)
    os.symlink(real, folder / "config.json")
    (folder / "tokenizer.json").write_text("{}")
    before = picture(tmp_path)
    with pytest.raises(ModelFolderError, match="outside the folder") as refused:
        engine.apply_patch(model_path=folder)
    assert "cp --remove-destination" in refused.value.hint
    assert picture(tmp_path) == before


def test_apply_refuses_to_write_under_a_linked_folder(tmp_path: Path):
    folder = tmp_path / "model"
    folder.mkdir()
    write_config(folder, HUB_CONFIG)
    (tmp_path / "elsewhere").mkdir()
    os.symlink("../elsewhere", folder / "pto_kernels")
    before = picture(tmp_path)
    with pytest.raises(ModelFolderError, match="leads out of the folder"):
        engine.apply_patch(model_path=folder)
    assert picture(tmp_path) == before
