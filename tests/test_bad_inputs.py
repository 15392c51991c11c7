"""A corpus of bad inputs: each gives one error line, a hint and a non-zero exit, never a traceback,
and leaves the folder exactly as it was.

Broken and foreign config.json files, garbage and foreign modeling files shipped in the folder,
damaged and escaping manifests, a config.json that is a folder or a dangling link, and a read-only
folder. Every case runs `apply`, `status` and `restore` through the real command line.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from pto_patch.errors import EXIT_OK
from pto_patch.patching import engine, fileio
from tests.folder_snapshot import snapshot
from tests.helpers.cli import run_cli
from tests.helpers.folders import HUB_CONFIG, write_config
from tests.robustness_counts import COUNTS

COMMANDS = ("apply", "status", "restore")


def config(**changes) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        write_config(folder, {**HUB_CONFIG, **changes})

    return make


def config_bytes(data: bytes) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        (folder / "config.json").write_bytes(data)

    return make


def with_modeling(data: bytes, name: str = "modeling_qwen2_5_vl.py") -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        write_config(folder, HUB_CONFIG)
        (folder / name).write_bytes(data)

    return make


def _installed_modeling() -> bytes:
    from pto_patch.model.locate import installed_transformers_dir

    return (installed_transformers_dir() / "models" / "qwen2_5_vl" / "modeling_qwen2_5_vl.py").read_bytes()


def config_dir(folder: Path) -> None:
    (folder / "config.json").mkdir()
    (folder / "config.json" / "x").write_text("{}")


def config_dangling(folder: Path) -> None:
    os.symlink("../blobs/gone", folder / "config.json")


_PATCHED: list[Path] = []  # one patched folder, made on first use and copied for each case


def patched_then(change: Callable[[Path], None]) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        if not _PATCHED:
            template = Path(tempfile.mkdtemp(prefix="pto-patch-bad-inputs-")) / "model"
            template.mkdir()
            write_config(template, HUB_CONFIG)
            engine.apply_patch(model_path=template)
            _PATCHED.append(template)
        shutil.rmtree(folder)
        shutil.copytree(_PATCHED[0], folder, symlinks=True)
        change(folder)

    return make


@pytest.fixture(scope="module", autouse=True)
def _drop_patched_template():
    yield
    for template in _PATCHED:
        shutil.rmtree(template.parent, ignore_errors=True)


def manifest_edit(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        path = folder / ".pto_patch" / "manifest.json"
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))

    return change


def manifest_bytes(data: bytes) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        (folder / ".pto_patch" / "manifest.json").write_bytes(data)

    return change


def manifest_is_a_folder(folder: Path) -> None:
    (folder / ".pto_patch" / "manifest.json").unlink()
    (folder / ".pto_patch" / "manifest.json").mkdir()


def pto_patch_is_a_file(folder: Path) -> None:
    shutil.rmtree(folder / ".pto_patch")
    (folder / ".pto_patch").write_text("not a folder")


def backup_missing(folder: Path) -> None:
    (folder / ".pto_patch" / "backup" / "config.json").unlink()


def _added(path: str) -> Callable[[dict], None]:
    return lambda m: m["files"].append(
        {"path": path, "action": "added", "sha256_before": None, "sha256_after": "0" * 64}
    )


CORPUS: dict[str, Callable[[Path], None]] = {
    # config.json
    "config-not-json": config_bytes(b"{ not json"),
    "config-binary": config_bytes(os.urandom(64) + b"\xff"),
    "config-empty": config_bytes(b""),
    "config-a-list": config_bytes(b"[1, 2]"),
    "config-foreign-model": config(model_type="llama"),
    "config-no-model-type": config(model_type=None),
    "config-no-head-size": lambda f: write_config(
        f, {k: v for k, v in HUB_CONFIG.items() if k not in ("hidden_size", "num_attention_heads")}
    ),
    "config-hidden-size-text": config(hidden_size="2048"),
    "config-zero-heads": config(num_attention_heads=0),
    "config-text-config-number": config(text_config=5),
    "config-rope-scaling-text": config(rope_scaling="mrope"),
    "config-mrope-not-fitting": config(rope_scaling={"type": "mrope", "mrope_section": [10, 10, 10]}),
    "config-mrope-words": config(rope_scaling={"mrope_section": ["a", 1, 2]}),
    "config-mrope-a-string": config(rope_scaling={"mrope_section": "16,24,24"}),
    "config-is-a-folder": config_dir,
    "config-dangling-link": config_dangling,
    # modeling files shipped in the folder
    "modeling-binary": with_modeling(os.urandom(512)),
    "modeling-latin1": with_modeling("# café\nx = 1\n".encode("latin-1")),
    "modeling-not-python": with_modeling(b"def (:\n  oops\n"),
    "modeling-foreign": with_modeling(b"import torch\n\n\nclass LlamaRMSNorm(torch.nn.Module):\n    pass\n"),
    "modeling-empty": with_modeling(b""),
    "configuration-binary": lambda f: (
        with_modeling(_installed_modeling())(f),
        with_modeling(os.urandom(256), "configuration_qwen2_5_vl.py")(f),
    ),
    # manifests
    "manifest-not-json": patched_then(manifest_bytes(b"{]")),
    "manifest-empty": patched_then(manifest_bytes(b"")),
    "manifest-a-list": patched_then(manifest_bytes(b"[]")),
    "manifest-binary": patched_then(manifest_bytes(b"\xff\xfe\x00")),
    "manifest-no-files": patched_then(manifest_edit(lambda m: m.pop("files"))),
    "manifest-record-a-number": patched_then(manifest_edit(lambda m: m["files"].append(7))),
    "manifest-is-a-folder": patched_then(manifest_is_a_folder),
    "pto-patch-is-a-file": patched_then(pto_patch_is_a_file),
    "manifest-backup-missing": patched_then(backup_missing),
    "manifest-escapes-dotdot": patched_then(manifest_edit(_added("../outside.txt"))),
    "manifest-escapes-absolute": patched_then(manifest_edit(_added("/etc/hostname"))),
    "manifest-escapes-backup": patched_then(
        manifest_edit(lambda m: m["files"][2].update(backup=".pto_patch/backup/../../../outside.txt"))
    ),
}
# Where a command may fairly succeed: status reports any folder it can read, restore of a folder that
# holds no patch is a no-op, and a patched folder whose backup is gone is still patched (only restore
# needs the backup, and refuses).
ACCEPTED = {
    (command, name)
    for name in CORPUS
    if not name.startswith(("manifest-", "pto-patch-"))
    for command in ("status", "restore")
}
ACCEPTED |= {("status", "manifest-backup-missing"), ("apply", "manifest-backup-missing")}


@pytest.mark.parametrize("name", list(CORPUS))
def test_a_bad_input_is_one_line_a_hint_and_changes_nothing(tmp_path: Path, name: str, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "outside.txt").write_text("keep")
    CORPUS[name](folder)
    capsys.readouterr()
    before = snapshot(tmp_path)
    failed = 0
    for command in COMMANDS:
        code = run_cli(command, "--model-path", str(folder))
        captured = capsys.readouterr()
        COUNTS["bad_input_runs"] += 1
        assert snapshot(tmp_path) == before, (name, command)
        if code == EXIT_OK:
            assert (command, name) in ACCEPTED, (name, command, captured)
            continue
        failed += 1
        lines = captured.err.strip().splitlines()
        assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), (
            name,
            command,
            captured.err,
        )
        assert "Traceback" not in captured.err and "unexpected error" not in captured.err, (
            name,
            captured.err,
        )
    assert failed, f"{name}: no command refused it"
    COUNTS["bad_inputs"] += 1


def test_a_read_only_folder_is_one_line_and_changes_nothing(tmp_path: Path, capsys):
    """A folder apply cannot write into: refused before anything is written."""
    folder = tmp_path / "model"
    folder.mkdir()
    write_config(folder, HUB_CONFIG)
    before = snapshot(folder)
    if os.geteuid() != 0:  # root writes through permission bits, so this case only holds for others
        folder.chmod(0o555)
        try:
            assert run_cli("apply", "--model-path", str(folder)) == 1
            err = capsys.readouterr().err
            assert "is read-only" in err and "hint:" in err and "Traceback" not in err
        finally:
            folder.chmod(0o755)
        assert snapshot(folder) == before
    # A read-only file system (EROFS) fails every write whoever runs it: the file layer fakes one.
    read_only = fileio.FaultPlan(
        nth=1, error=30, kinds=(fileio.WRITE, fileio.RENAME, fileio.LINK), persistent=True
    )
    with fileio.injected_faults(read_only):
        assert run_cli("apply", "--model-path", str(folder)) == 1
    err = capsys.readouterr().err
    assert "Read-only file system" in err and "rolled back to its original bytes" in err
    assert len(err.strip().splitlines()) == 2 and "Traceback" not in err
    assert snapshot(folder) == before
    COUNTS["bad_inputs"] += 1
