"""The record of what apply changed in a model folder: `<folder>/.pto_patch/manifest.json`.

For every file it holds whether apply added or modified it, its sha256 before and after, where
its backup lies, and, for a file that was a symbolic link, the link's target. `restore` and
`status` trust nothing else.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pto_patch.errors import ModelFolderError
from pto_patch.model import input_files
from pto_patch.model.folder import DOWNLOAD_RECORD  # noqa: F401 - a file of the folder the manifest names
from pto_patch.patching.fileio import atomic_write_bytes, sha256_file

MANIFEST_DIR = ".pto_patch"
MANIFEST_NAME = "manifest.json"
BACKUP_DIR = "backup"
SCHEMA_VERSION = 1

STATE_IN_PROGRESS = "in_progress"
STATE_COMPLETE = "complete"


@dataclass(frozen=True)
class FileRecord:
    path: str  # relative to the model folder, '/'-separated
    action: str  # "added" or "modified"
    sha256_before: str | None
    sha256_after: str
    backup: str | None = None  # relative to the model folder
    symlink_target: str | None = None  # the link that stood here before apply
    mode: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileRecord:
        return cls(
            path=data["path"],
            action=data["action"],
            sha256_before=data.get("sha256_before"),
            sha256_after=data["sha256_after"],
            backup=data.get("backup"),
            symlink_target=data.get("symlink_target"),
            mode=data.get("mode"),
        )


@dataclass(frozen=True)
class Manifest:
    tool_version: str
    spec: str
    ops: tuple[str, ...]
    transformers_release: str
    source: str  # where the modeling source came from
    source_sha256: str
    files: tuple[FileRecord, ...]
    added_dirs: tuple[str, ...] = ()
    state: str = STATE_COMPLETE
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def with_state(self, state: str) -> Manifest:
        return Manifest(**{**self._fields(), "state": state})

    def _fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ops"] = list(self.ops)
        data["added_dirs"] = list(self.added_dirs)
        data["files"] = [asdict(record) for record in self.files]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        return cls(
            tool_version=data["tool_version"],
            spec=data["spec"],
            ops=tuple(data["ops"]),
            transformers_release=data["transformers_release"],
            source=data["source"],
            source_sha256=data["source_sha256"],
            files=tuple(FileRecord.from_json(item) for item in data["files"]),
            added_dirs=tuple(data.get("added_dirs", ())),
            state=data.get("state", STATE_COMPLETE),
            schema_version=data.get("schema_version", SCHEMA_VERSION),
            extra=dict(data.get("extra", {})),
        )

    @staticmethod
    def path_in(folder: Path) -> Path:
        return Path(folder) / MANIFEST_DIR / MANIFEST_NAME

    @classmethod
    def exists_in(cls, folder: Path) -> bool:
        """Whether there is a manifest to honour; anything standing at its path counts (load judges it)."""
        path = cls.path_in(folder)
        return path.exists() or path.is_symlink() or (path.parent.exists() and not path.parent.is_dir())

    @classmethod
    def load(cls, folder: Path) -> Manifest:
        """The folder's manifest, refused as damaged unless well formed and confined to the folder."""
        path = cls.path_in(folder)
        if path.parent.exists() and not path.parent.is_dir():
            raise _damaged(path, f"{MANIFEST_DIR} is not a folder")
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise _damaged(path, "it is not a plain file")
        try:
            manifest = cls.from_json(input_files.load_json(path))
        except FileNotFoundError as exc:
            raise ModelFolderError(
                f"{folder} holds no pto-patch manifest", "run `pto-patch apply` first"
            ) from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise _damaged(path, f"unreadable: {exc}") from exc
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise _damaged(path, f"{type(exc).__name__}: {exc}") from exc
        problem = malformed(manifest) or escape(Path(folder), manifest)
        if problem:
            raise _damaged(path, problem)
        return manifest

    def save(self, folder: Path) -> None:
        text = json.dumps(self.to_json(), indent=2) + "\n"
        atomic_write_bytes(self.path_in(folder), text.encode("utf-8"))


# --- what a manifest may name --------------------------------------------------------------------
# A model folder can come from anywhere (a tarball, a hub repo that ships .pto_patch/), so every path
# a manifest names is checked before restore acts on it: a crafted record must not reach outside.

_HEX = frozenset("0123456789abcdef")
_ACTIONS = ("added", "modified")
_STATES = (STATE_IN_PROGRESS, STATE_COMPLETE)


def _damaged(path: Path, problem: str) -> ModelFolderError:
    return ModelFolderError(
        f"the pto-patch manifest {path} is damaged: {problem}",
        "nothing was changed; this .pto_patch/ cannot be trusted: put the original files back by hand "
        "(or download the model again), then delete .pto_patch/",
    )


def is_sha256(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def _relative_problem(value: Any, what: str) -> str | None:
    """Why `value` is not a plain relative path such as apply writes ('a/b.py'), or None."""
    if not isinstance(value, str) or not value:
        return f"{what} {value!r} is not a path"
    if value.startswith("/") or "\\" in value or "\0" in value or posixpath.normpath(value) != value:
        return f"{what} {value!r} is not a plain relative path"
    if any(part in ("..", ".") for part in value.split("/")):
        return f"{what} {value!r} climbs out of the folder"
    return None


def malformed(manifest: Manifest) -> str | None:
    """What makes the manifest's contents impossible for apply to have written, or None."""
    if not isinstance(manifest.state, str) or manifest.state not in _STATES:
        return f"state {manifest.state!r} is unknown"
    for record in manifest.files:
        problem = _relative_problem(record.path, "path")
        if problem:
            return problem
        if record.path == MANIFEST_DIR or record.path.startswith(f"{MANIFEST_DIR}/"):
            return f"path {record.path!r} lies in pto-patch's own {MANIFEST_DIR}/"
        if record.action not in _ACTIONS:
            return f"{record.path}: action {record.action!r} is neither added nor modified"
        if not is_sha256(record.sha256_after):
            return f"{record.path}: sha256_after is not a sha256"
        if record.mode is not None and (not isinstance(record.mode, int) or not 0 <= record.mode <= 0o7777):
            return f"{record.path}: mode {record.mode!r} is not a file mode"
        if record.symlink_target is not None and (
            not isinstance(record.symlink_target, str)
            or not record.symlink_target
            or "\0" in record.symlink_target
        ):
            return f"{record.path}: symlink_target {record.symlink_target!r} is not a link target"
        if record.action == "modified":
            if not is_sha256(record.sha256_before):
                return f"{record.path}: sha256_before is not a sha256"
            problem = _relative_problem(record.backup, f"{record.path}: backup")
            if problem:
                return problem
            if not record.backup.startswith(f"{MANIFEST_DIR}/{BACKUP_DIR}/"):
                return f"{record.path}: backup {record.backup!r} lies outside {MANIFEST_DIR}/{BACKUP_DIR}/"
        elif record.backup is not None or record.symlink_target is not None:
            return f"{record.path}: an added file has no backup or link to put back"
    for directory in manifest.added_dirs:
        problem = _relative_problem(directory, "added dir")
        if problem:
            return problem
        if directory == MANIFEST_DIR or directory.startswith(f"{MANIFEST_DIR}/"):
            return f"added dir {directory!r} lies in pto-patch's own {MANIFEST_DIR}/"
    return None


def _inside(path: str | Path, root: Path) -> bool:
    return Path(path) == root or Path(path).is_relative_to(root)


def blob_store(folder: Path) -> Path | None:
    """The blob store of a Hugging Face cache snapshot (<repo>/snapshots/<rev> -> <repo>/blobs), or None."""
    return folder.parent.parent / "blobs" if folder.parent.name == "snapshots" else None


def link_target_escapes(folder: Path, link: Path, target: str) -> bool:
    """Whether a link at `link` to `target` leads out of `folder` (the HF cache's own blob store allowed)."""
    resolved = os.path.realpath(os.path.join(link.parent, target))
    store = blob_store(folder)
    return not (_inside(resolved, folder) or (store is not None and _inside(resolved, store.resolve())))


def parent_escapes(folder: Path, relative: str) -> bool:
    """Whether a folder on the way to `relative` is a link that leads out of `folder` (resolved)."""
    return not _inside(os.path.realpath((folder / relative).parent), folder)


def escape(folder: Path, manifest: Manifest) -> str | None:
    """The first path of the manifest that resolves outside `folder` through links, or None.

    A file itself may be a link (restore replaces the link, never writes through it), but no folder
    on its way may lead out; a backup and an added dir must resolve inside; a link restore recreates
    must point inside the folder or into the blob store of the HF cache the folder belongs to.
    """
    root = Path(folder).resolve()
    for record in manifest.files:
        if parent_escapes(root, record.path):
            return f"path {record.path!r} leads out of {root} through a link"
        if record.backup is not None and not _inside(
            os.path.realpath(root / record.backup), root / MANIFEST_DIR / BACKUP_DIR
        ):
            return f"{record.path}: backup {record.backup!r} leads out of {root / MANIFEST_DIR / BACKUP_DIR}"
        if record.symlink_target is not None and link_target_escapes(
            root, root / record.path, record.symlink_target
        ):
            return f"{record.path}: link target {record.symlink_target!r} leads out of {root}"
    for directory in manifest.added_dirs:
        if not _inside(os.path.realpath(root / directory), root) or (root / directory).is_symlink():
            return f"added dir {directory!r} leads out of {root} through a link"
    return None


def drifted_files(folder: Path, manifest: Manifest | None = None) -> list[str]:
    """Relative paths of the files apply wrote whose bytes now differ (or that are gone)."""
    folder = Path(folder)
    manifest = manifest or Manifest.load(folder)
    drifted = []
    for record in manifest.files:
        path = folder / record.path
        if path.is_symlink() or not path.is_file() or sha256_file(path) != record.sha256_after:
            drifted.append(record.path)
    return drifted
