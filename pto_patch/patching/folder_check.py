"""May this folder run: its patch state decided once (`run.start.plan_run` asks, under the folder's lock) and
checked (interrupted, unpatched, drifted, an overlay whose source changed); the result is carried by the
run's plan to the reference and the load, which never decide it again."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pto_patch.errors import ModelFolderError, PtoPatchError
from pto_patch.patching.folder_contents import kept_copy_path
from pto_patch.patching.patch_state import PatchState, patch_state


@dataclass(frozen=True)
class CheckedFolder:
    folder: Path
    patched: bool
    patched_ops: tuple[str, ...]
    modified_files: tuple[str, ...]
    source_changed: tuple[str, ...] = ()  # apply --overlay: what changed in the source since apply
    patch: PatchState | None = (
        None  # the state it was decided from (the reference rebuilds the original from it)
    )


def check_folder(
    folder: Path, *, use_pto: bool, allow_modified: bool, state: PatchState | None = None
) -> CheckedFolder:
    """Refuse to run half-patched code, or code that differs from what apply wrote (unless allowed).
    `state`: the folder's patch state where the caller decided it already (a run's plan)."""
    from pto_patch.patching.overlay import record_of, source_changes

    state = state if state is not None else patch_state(folder)
    if state.interrupted:
        raise ModelFolderError(
            f"{folder} holds an interrupted apply; refusing to run its half-patched files",
            f"run `pto-patch restore --model-path {folder}` (or `pto-patch apply` again)",
        )
    if not state.patched:
        if use_pto:
            raise ModelFolderError(
                f"{folder} is not patched (no .pto_patch/manifest.json): there is no PTO run to compare",
                f"run `pto-patch apply --model-path {folder}` first "
                "(`pto-patch verify --baseline-only` runs the unpatched model alone)",
            )
        return CheckedFolder(folder, False, (), (), patch=state)
    drifted = state.drifted
    if drifted and not allow_modified:
        shown = ", ".join(drifted[:4]) + (" ..." if len(drifted) > 4 else "")
        raise PtoPatchError(
            f"{folder}: {len(drifted)} patched file(s) differ from what apply wrote ({shown}); "
            "refusing to execute them",
            f"to start over, `pto-patch restore --model-path {folder} --force` keeps your edit as "
            f"{kept_copy_path(folder / drifted[0]).name}; then apply again. Or pass --allow-modified to run them",
        )
    source_changed = tuple(source_changes(folder, state.manifest))
    if source_changed and not allow_modified:
        shown = ", ".join(source_changed[:4]) + (" ..." if len(source_changed) > 4 else "")
        raise PtoPatchError(
            f"{folder} is an overlay whose source folder {record_of(folder, state.manifest).source} changed "
            f"since apply ({shown}); its patched files were made for the old one",
            f"run `pto-patch restore --model-path {folder}`, then apply --overlay {folder} again, "
            "or pass --allow-modified to run it anyway",
        )
    return CheckedFolder(folder, True, tuple(state.manifest.ops), drifted, source_changed, state)
