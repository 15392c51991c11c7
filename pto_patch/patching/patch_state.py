"""A folder's patch state, decided in one place: none, in progress, complete or drifted.

apply, restore, status, verify, bench and download all ask `patch_state`. An apply that stopped
before writing its manifest leaves a `.pto_patch/` holding only backups: that is in progress too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pto_patch.errors import ModelFolderError
from pto_patch.patching.manifest import (
    MANIFEST_DIR,
    STATE_COMPLETE,
    STATE_IN_PROGRESS,
    Manifest,
    drifted_files,
)

NONE = "none"
IN_PROGRESS = STATE_IN_PROGRESS
COMPLETE = STATE_COMPLETE
DRIFTED = "drifted"  # complete, but a file apply wrote has changed since


@dataclass(frozen=True)
class PatchState:
    state: str
    manifest: Manifest | None = None  # None when there is none, or the apply stopped before writing it
    drifted: tuple[str, ...] = ()  # files apply wrote whose bytes differ now (complete manifests only)

    @property
    def patched(self) -> bool:
        return self.state in (COMPLETE, DRIFTED)

    @property
    def interrupted(self) -> bool:
        return self.state == IN_PROGRESS


def patch_state(folder: Path) -> PatchState:
    folder = Path(folder)
    patch_dir = folder / MANIFEST_DIR
    if not (patch_dir.exists() or patch_dir.is_symlink()):
        return PatchState(NONE)
    if not Manifest.exists_in(folder):
        return PatchState(IN_PROGRESS)
    manifest = Manifest.load(folder)
    if manifest.state == STATE_IN_PROGRESS:
        return PatchState(IN_PROGRESS, manifest)
    drifted = tuple(drifted_files(folder, manifest))
    return PatchState(DRIFTED if drifted else COMPLETE, manifest, drifted)


def state_before_writing(folder: Path) -> str:
    """The state for a command that only refuses to write over a patch (download, make-tiny): a
    manifest too damaged to read counts as complete, since a patch is there all the same."""
    try:
        return patch_state(folder).state
    except ModelFolderError:
        return COMPLETE
