"""Where a patched folder's files as they were before apply lie: what a verify's reference rebuilds the
unpatched model from (`run.reference.unpatched_view`).

In place, each file apply modified has its backup (checked against the manifest's hash of the file
before apply: a backup that is missing or changed cannot stand for the original) and each file it added
is left out; an overlay's original is its source folder as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pto_patch.errors import ModelFolderError
from pto_patch.patching.fileio import sha256_file
from pto_patch.patching.overlay_record import record_of
from pto_patch.patching.patch_state import PatchState


@dataclass(frozen=True)
class Originals:
    """An in-place patch's originals (`modified`: path -> where its bytes before apply lie; `added`: the
    paths apply added), or an overlay's (`source`: the folder it was made from)."""

    modified: dict[str, Path] = field(default_factory=dict)
    added: frozenset[str] = frozenset()
    source: Path | None = None


def original_files(folder: Path, state: PatchState) -> Originals:
    """The originals of `folder` as its patch state (decided by the caller) records them; ModelFolderError
    where the folder is not patched or a backup is not what stood there before apply."""
    if not state.patched:
        raise ModelFolderError(
            f"{folder} is not patched: there is no unpatched model to take as the reference apart from itself",
            f"run `pto-patch apply --model-path {folder}` first",
        )
    manifest = state.manifest
    overlay = record_of(folder, manifest)
    if overlay is not None:
        return Originals(source=Path(overlay.source))
    modified: dict[str, Path] = {}
    added: set[str] = set()
    for record in manifest.files:
        if record.action == "added":
            added.add(record.path)
            continue
        if record.symlink_target is not None:
            modified[record.path] = (folder / record.path).parent / record.symlink_target
            continue
        backup = folder / record.backup if record.backup else None
        if backup is None or not backup.is_file() or sha256_file(backup) != record.sha256_before:
            raise ModelFolderError(
                f"{folder}: the backup of {record.path} is missing or not what stood there before apply, "
                "so the unpatched model cannot be rebuilt as the reference",
                f"run `pto-patch status --model-path {folder}`; a folder downloaded again and patched again has one",
            )
        modified[record.path] = backup
    return Originals(modified, frozenset(added))
