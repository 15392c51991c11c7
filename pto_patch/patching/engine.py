"""The patch engine: apply for one model folder (restore and status, which rewrite nothing, live in
restore.py and folder_status.py, and are named here too).

apply plans every change in memory first (codemods, config.json, the kernel package), then
writes backups, a manifest marked in progress, the files (each atomically), and finally marks
the manifest complete. Any command that finds a manifest still in progress rolls that apply
back, so an interrupted apply never leaves a half-patched folder behind (put_back.py does the
putting back). apply and restore hold the folder's lock (folder_lock.py) from start to end.
"""

from __future__ import annotations

import errno
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pto_patch.errors import DriftError, ModelFolderError, PtoPatchError
from pto_patch.model.folder import resolve_model_folder
from pto_patch.model.hub_cache import is_snapshot
from pto_patch.model.spec import ModelSpec, load_spec, parse_ops
from pto_patch.patching import folder_lock, put_back
from pto_patch.patching import overlay as overlays
from pto_patch.patching.fileio import (
    atomic_write_bytes,
    make_dirs,
    sha256_bytes,
)
from pto_patch.patching.folder_contents import kept_copy_path
from pto_patch.patching.folder_kernels import KERNEL_PACKAGE  # noqa: F401 - the engine's API
from pto_patch.patching.folder_status import StatusResult, model_status  # noqa: F401 - the engine's API
from pto_patch.patching.manifest import (
    BACKUP_DIR,
    MANIFEST_DIR,
    STATE_COMPLETE,
    FileRecord,
)
from pto_patch.patching.patch_state import NONE, patch_state
from pto_patch.patching.plan import (  # noqa: F401 - the engine's API
    ApplyResult,
    PlannedFile,
    manifest_in_progress,
    plan_patch,
    unified_diff,
)
from pto_patch.patching.restore import RestoreResult, restore_model  # noqa: F401 - the engine's API
from pto_patch.patching.rewrite_cache import RewriteCache, cache_dir


def rewrite_cache(use_cache: bool, warn: Callable[[str], None] | None = None) -> RewriteCache | None:
    """The user's rewrite cache (its warnings to `warn`, else one line on stderr), or None for `--no-cache`."""
    return RewriteCache(cache_dir(), warn or _warn_on_stderr) if use_cache else None


def _warn_on_stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


# --- writing and undoing ---------------------------------------------------------------------------


def _write_patch(folder: Path, spec: ModelSpec, ops: tuple[str, ...], planned: list[PlannedFile], info: dict):
    records = []
    for item in planned:
        backup = None
        if item.old_bytes is not None:
            backup = f"{MANIFEST_DIR}/{BACKUP_DIR}/{item.path}"
            atomic_write_bytes(folder / backup, item.old_bytes)
        records.append(
            FileRecord(
                path=item.path,
                action=item.action,
                sha256_before=sha256_bytes(item.old_bytes) if item.old_bytes is not None else None,
                sha256_after=sha256_bytes(item.new_bytes),
                backup=backup,
                symlink_target=item.symlink_target,
                mode=item.mode,
            )
        )
    added_dirs = () if (folder / KERNEL_PACKAGE).exists() else (KERNEL_PACKAGE,)
    manifest = manifest_in_progress(spec, ops, info, tuple(records), added_dirs)
    make_dirs(folder / MANIFEST_DIR)
    manifest.save(folder)
    for item in planned:
        atomic_write_bytes(
            folder / item.path, item.new_bytes, mode=item.mode if item.mode is not None else 0o644
        )
    manifest.with_state(STATE_COMPLETE).save(folder)


# --- the three commands ----------------------------------------------------------------------------


def apply_patch(
    model: str = "gutenocr_3b",
    model_path: Path | str | None = None,
    ops: str | tuple[str, ...] | None = None,
    dry_run: bool = False,
    overlay: Path | str | None = None,
    use_cache: bool = True,
    warn: Callable[[str], None] | None = None,
) -> ApplyResult:
    """Patch the model folder in place, or with `overlay` build a patched overlay there (see overlay.py).

    `use_cache` reuses (and keeps) rewrites in the user's rewrite cache; a dry run only reads it. `warn`
    takes the cache's one-line warnings (the CLI passes its console's).
    """
    started = time.perf_counter()
    spec = load_spec(model)
    folder = resolve_model_folder(model_path, spec)
    chosen = parse_ops(",".join(ops) if isinstance(ops, tuple | list) else ops, spec)
    cache = rewrite_cache(use_cache, warn)
    if overlay is not None:
        return overlays.apply_overlay(spec, folder, overlay, chosen, dry_run, started, cache)
    if is_snapshot(folder) and warn is not None:
        warn(
            f"{folder} is a Hugging Face cache snapshot: an in-place apply changes files other snapshots "
            f"and users may share; `pto-patch apply --model-path {folder} --overlay DIR` leaves it untouched"
        )
    with folder_lock.locked(folder, folder_lock.SHARED if dry_run else folder_lock.EXCLUSIVE):
        return _apply_locked(spec, folder, chosen, dry_run, started, cache)


def _apply_locked(
    spec: ModelSpec,
    folder: Path,
    chosen: tuple[str, ...],
    dry_run: bool,
    started: float,
    cache: RewriteCache | None = None,
):
    rolled_back = False
    state = patch_state(folder)
    if state.state != NONE:
        manifest = state.manifest
        if state.patched:
            if set(manifest.ops) != set(chosen):
                raise ModelFolderError(
                    f"{folder} is already patched with ops {', '.join(manifest.ops)}",
                    "run `pto-patch restore` first, then apply with the new --ops",
                )
            drifted = state.drifted
            if drifted:  # edited since, or a restore that stopped halfway: not "already patched"
                raise DriftError(
                    f"{folder} is patched, but {', '.join(drifted)} changed since apply",
                    f"run `pto-patch restore --model-path {folder} --force` (it keeps your edit as "
                    f"{kept_copy_path(folder / drifted[0]).name}), then apply again",
                )
            return replace(ApplyResult.already_applied_from(folder, manifest, started), dry_run=dry_run)
        if dry_run:
            raise ModelFolderError(
                f"{folder} holds an interrupted apply", "run `pto-patch restore` (or apply without --dry-run)"
            )
    if not dry_run:
        read_only = overlays.read_only_error(folder)  # names --overlay; also a folder without write bits
        if read_only is not None:
            raise read_only
        try:
            rolled_back = put_back.recover(folder)
        except OSError as exc:
            raise PtoPatchError(
                f"rolling back the interrupted apply in {folder} failed ({exc.strerror or exc}); "
                f"left: {put_back.what_is_left(folder)}",
                "fix the cause (free disk space, permissions), then run `pto-patch restore`",
            ) from exc
    planned, info = plan_patch(folder, spec, chosen, cache, save_to_cache=not dry_run)
    result = ApplyResult(
        folder=folder,
        spec=spec.name,
        ops=chosen,
        release=info["release"],
        source=info["source"],
        source_release=info["source_release"],
        files=tuple((item.path, item.action) for item in planned),
        config_changes=info["config_changes"],
    )
    if dry_run:
        diff = unified_diff(planned)
        return replace(result, dry_run=True, diff=diff, elapsed_s=time.perf_counter() - started)
    try:
        _write_patch(folder, spec, chosen, planned, info)
    except OSError as exc:
        error = put_back.failed_apply_error(folder, exc)
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            error.hint = f"{error.hint}; or: {overlays.OVERLAY_HINT}"
        raise error from exc
    except BaseException:
        put_back.roll_back_failed_apply(folder)
        raise
    return replace(result, rolled_back_interrupted=rolled_back, elapsed_s=time.perf_counter() - started)
