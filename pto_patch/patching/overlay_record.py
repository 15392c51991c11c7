"""An overlay's record in its manifest (`extra.overlay`): the source folder, the links and folders apply
made in OUT, and the sha256 of every source file. The overlay writes it; put_back and status read it.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pto_patch.errors import ModelFolderError
from pto_patch.patching.manifest import MANIFEST_DIR, Manifest

OVERLAY_KEY = "overlay"


@dataclass(frozen=True)
class SourceEntry:
    """One file of the source folder as apply saw it."""

    path: str  # relative, '/'-separated
    sha256: str | None  # of the bytes it leads to; None for a dangling link
    link_target: str | None = None  # the entry is itself a link (an HF-cache snapshot file)
    stat: tuple[int, int, int, int] | None = None  # (dev, inode, size, mtime_ns) of the file it leads to

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "link_target": self.link_target, "stat": self.stat}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SourceEntry:
        stat = data.get("stat")
        return cls(data["path"], data.get("sha256"), data.get("link_target"), tuple(stat) if stat else None)


@dataclass(frozen=True)
class OverlayRecord:
    source: str  # the source folder, absolute
    created_folder: bool  # apply created OUT itself (restore then removes it)
    links: tuple[str, ...]  # OUT/<path> -> <source>/<path>
    dirs: tuple[str, ...]  # folders apply made in OUT for links (pto_kernels/ is the manifest's added dir)
    entries: tuple[SourceEntry, ...]

    def link_target(self, relative: str) -> str:
        return os.path.join(self.source, *relative.split("/"))

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "created_folder": self.created_folder,
            "links": list(self.links),
            "dirs": list(self.dirs),
            "entries": [entry.to_json() for entry in self.entries],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OverlayRecord:
        return cls(
            source=str(data["source"]),
            created_folder=bool(data["created_folder"]),
            links=tuple(data["links"]),
            dirs=tuple(data["dirs"]),
            entries=tuple(SourceEntry.from_json(item) for item in data["entries"]),
        )


def record_of(folder: Path, manifest: Manifest) -> OverlayRecord | None:
    """The manifest's overlay record, checked like the rest of it; None for an in-place patch."""
    data = manifest.extra.get(OVERLAY_KEY)
    if data is None:
        return None
    try:
        record = OverlayRecord.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise _damaged(folder, f"its overlay record is malformed ({exc})") from exc
    if not os.path.isabs(record.source):
        raise _damaged(folder, f"overlay source {record.source!r} is not an absolute path")
    for relative in (*record.links, *record.dirs, *(entry.path for entry in record.entries)):
        problem = _path_problem(folder, relative)
        if problem:
            raise _damaged(folder, problem)
    return record


def _damaged(folder: Path, problem: str) -> ModelFolderError:
    return ModelFolderError(
        f"the pto-patch manifest {Manifest.path_in(folder)} is damaged: {problem}",
        "nothing was changed; delete the overlay folder and run apply --overlay again",
    )


def _path_problem(folder: Path, relative: Any) -> str | None:
    """Why `relative` is not a path inside `folder` that apply could have made, or None."""
    if not isinstance(relative, str) or not relative:
        return f"{relative!r} is not a path"
    if (
        relative.startswith("/")
        or "\\" in relative
        or "\0" in relative
        or posixpath.normpath(relative) != relative
    ):
        return f"{relative!r} is not a plain relative path"
    if any(part in ("..", ".") for part in relative.split("/")) or relative.split("/")[0] == MANIFEST_DIR:
        return f"{relative!r} leaves the folder or enters {MANIFEST_DIR}/"
    resolved_parent = os.path.realpath((folder / relative).parent)
    if not Path(resolved_parent).is_relative_to(Path(folder).resolve()):
        return f"{relative!r} lies under a link that leads out of {folder}"
    return None


# --- reading the source ---------------------------------------------------------------------------
