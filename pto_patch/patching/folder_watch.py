"""A run whose model folder changes under it fails, never passes (issue 51, item 6).

verify, bench and tune read the folder while it is locked for the load; after that, a `restore`, an
`apply` or a hand edit could change the files the run was judged on (a restore mid-verify makes every op
fall back to the eager code, and the comparison of eager with eager would pass). The folder's state is
taken when the run's plan checks the folder, under its lock (`FolderState.now`: every file's path, size, modification time and inode, by
`stat` only, links judged by what they point at) and compared when the work is done (`changes`): any file
added, removed or rewritten is a failure naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# What pto-patch itself writes there during a run: never a change of what was run. tune's tuning file and
# the manifest recording it are written by the run itself, after the measuring.
OWN_WRITES = (".pto_patch/tuning.json", ".pto_patch/manifest.json", ".pto_patch/lock")
MAX_NAMED = 3


def _files(folder: Path) -> dict[str, tuple[int, int, int]]:
    found: dict[str, tuple[int, int, int]] = {}
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            path = Path(root) / name
            relative = path.relative_to(folder).as_posix()
            if relative in OWN_WRITES or relative.endswith(".pyc"):
                continue
            try:
                stats = path.stat()
            except OSError:
                stats = path.lstat()  # a dangling link: judged by the link itself
            found[relative] = (stats.st_size, stats.st_mtime_ns, stats.st_ino)
    return found


def named(changed: list[str]) -> str:
    """The first MAX_NAMED changes, and how many more: one line's worth."""
    more = f" and {len(changed) - MAX_NAMED} more" if len(changed) > MAX_NAMED else ""
    return ", ".join(changed[:MAX_NAMED]) + more


@dataclass(frozen=True)
class FolderState:
    folder: Path
    files: dict[str, tuple[int, int, int]]

    @classmethod
    def now(cls, folder: Path) -> FolderState:
        return cls(Path(folder), _files(Path(folder)))

    def changed(self) -> list[str]:
        """What changed in the folder since `now` ("NAME removed", "added", "rewritten"), sorted."""
        later = _files(self.folder)
        return sorted(
            [f"{name} removed" for name in self.files.keys() - later.keys()]
            + [f"{name} added" for name in later.keys() - self.files.keys()]
            + [
                f"{name} rewritten"
                for name in self.files.keys() & later.keys()
                if self.files[name] != later[name]
            ]
        )

    def changes(self) -> list[str]:
        """One failure naming what changed in the folder since `now`, or none."""
        changed = self.changed()
        if not changed:
            return []
        return [
            f"the model folder changed during the run ({named(changed)}): "
            "what ran is not what the folder holds now, so nothing here is verified; run again on a folder "
            "nothing changes meanwhile"
        ]
