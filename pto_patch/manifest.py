"""The record of what apply changed in a model folder: `<folder>/.pto_patch/manifest.json`.

For every file it holds whether apply added or modified it, its sha256 before and after, where
its backup lies, and, for a file that was a symbolic link, the link's target. `restore` and
`status` trust nothing else.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pto_patch.errors import ModelFolderError
from pto_patch.fileio import atomic_write_bytes, sha256_file

MANIFEST_DIR = ".pto_patch"
# What `download` leaves in the folder (the revision it fetched), shown by `status`.
DOWNLOAD_RECORD = ".pto_patch_download.json"
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
        )

    @staticmethod
    def path_in(folder: Path) -> Path:
        return Path(folder) / MANIFEST_DIR / MANIFEST_NAME

    @classmethod
    def exists_in(cls, folder: Path) -> bool:
        return cls.path_in(folder).is_file()

    @classmethod
    def load(cls, folder: Path) -> Manifest:
        path = cls.path_in(folder)
        try:
            return cls.from_json(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError as exc:
            raise ModelFolderError(
                f"{folder} holds no pto-patch manifest", "run `pto-patch apply` first"
            ) from exc
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ModelFolderError(
                f"the pto-patch manifest {path} is damaged ({exc})",
                "restore the folder's original files by hand (backups are in .pto_patch/backup/)",
            ) from exc

    def save(self, folder: Path) -> None:
        text = json.dumps(self.to_json(), indent=2) + "\n"
        atomic_write_bytes(self.path_in(folder), text.encode("utf-8"))


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
