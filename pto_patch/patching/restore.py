"""restore: put every byte of a patched model folder back as it was before apply.

Kept apart from the engine, which plans and writes patches: restore rewrites nothing, so it imports
nothing of the rewrite (codemods, config changes, the rewrite cache) and starts fast.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pto_patch.errors import DriftError
from pto_patch.model.folder import check_writable, resolve_model_folder
from pto_patch.model.spec import load_spec
from pto_patch.patching import folder_lock, put_back
from pto_patch.patching import overlay as overlays
from pto_patch.patching.folder_contents import kept_copies, unexpected_entries
from pto_patch.patching.patch_state import NONE, patch_state


@dataclass(frozen=True)
class RestoreResult:
    folder: Path
    restored: tuple[str, ...]
    removed: tuple[str, ...]
    kept_edited: tuple[str, ...] = ()
    was_interrupted: bool = False
    purged_module_caches: tuple[str, ...] = ()
    overlay_of: Path | None = None  # the overlay's source folder, left untouched
    removed_folder: bool = False  # the overlay folder itself, which apply had created
    elapsed_s: float = 0.0
    not_patched: bool = False  # nothing to restore: the folder holds no patch (exit 0, a no-op)
    kept_edits: tuple[str, ...] = ()  # every kept edit in the folder after the restore, earlier ones too
    unexpected: tuple[str, ...] = ()  # left as they were: put there by neither the checkpoint nor the patch


def restore_model(model: str = "gutenocr_3b", model_path: Path | str | None = None, force: bool = False):
    started = time.perf_counter()
    spec = load_spec(model)
    folder = resolve_model_folder(model_path, spec)
    with folder_lock.exclusive(folder):
        return _restore_locked(folder, force, started)


def _restore_locked(folder: Path, force: bool, started: float) -> RestoreResult:
    state = patch_state(folder)
    if state.state == NONE:  # a no-op, as apply of a patched folder is: `trap 'pto-patch restore' EXIT` works
        return RestoreResult(
            folder,
            (),
            (),
            not_patched=True,
            kept_edits=tuple(kept_copies(folder)),
            unexpected=tuple(unexpected_entries(folder)),
            elapsed_s=time.perf_counter() - started,
        )
    check_writable(folder, "restore")
    if state.manifest is None:
        try:
            put_back.recover(folder)
        except OSError as exc:
            raise put_back.stopped_restore_error(folder, exc) from exc
        return RestoreResult(folder, (), (), was_interrupted=True, elapsed_s=time.perf_counter() - started)
    manifest, interrupted = state.manifest, state.interrupted
    # a file already back to its original is the trace of a restore that stopped, not an edit
    drifted = [] if interrupted else sorted(set(state.drifted) - put_back.original_paths(folder, manifest))
    if drifted and not force:
        raise DriftError(
            f"{', '.join(drifted)} in {folder} changed since apply",
            "rerun with --force to restore anyway (the edited copies are kept beside as *.edited)",
        )
    put_back.check_backups(folder, manifest)  # before anything is touched
    overlay_record = overlays.record_of(folder, manifest)
    try:
        kept = put_back.keep_edited_copies(folder, drifted)
        if not interrupted:
            put_back.mark_restoring(folder, manifest)
        try:
            restored, removed = put_back.finish_restore(folder, manifest)
        except OSError:  # once more at once, as apply rolls back at once: a passing fault is gone
            restored, removed = put_back.finish_restore(folder, manifest)
    except OSError as exc:
        raise put_back.stopped_restore_error(folder, exc) from exc
    purged = put_back.purge_module_caches(folder, manifest)
    return RestoreResult(
        folder=folder,
        restored=tuple(restored),
        removed=tuple(removed),
        kept_edited=tuple(kept),
        was_interrupted=interrupted,
        purged_module_caches=tuple(purged),
        overlay_of=Path(overlay_record.source) if overlay_record else None,
        removed_folder=overlays.remove_created_folder(folder, overlay_record),
        elapsed_s=time.perf_counter() - started,
        **_left_in(folder),
    )


def _left_in(folder: Path) -> dict[str, tuple[str, ...]]:
    """What the folder holds after a restore besides the checkpoint (a removed overlay holds nothing)."""
    if not folder.is_dir():
        return {}
    return {"kept_edits": tuple(kept_copies(folder)), "unexpected": tuple(unexpected_entries(folder))}
