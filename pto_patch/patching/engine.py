"""The patch engine: apply for one model folder (restore and status, which rewrite nothing, live in
restore.py and folder_status.py, and are named here too).

apply plans every change in memory first (codemods, config.json, the kernel package), then
writes backups, a manifest marked in progress, the files (each atomically), and finally marks
the manifest complete. Any command that finds a manifest still in progress rolls that apply
back, so an interrupted apply never leaves a half-patched folder behind (undo.py does the
putting back). apply and restore hold the folder's lock (folder_lock.py) from start to end.
"""

from __future__ import annotations

import difflib
import errno
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from pto_patch import __version__, folder_lock, undo
from pto_patch import overlay as overlays
from pto_patch.config_fix import ConfigChange, config_changes, fixed_config, render_config
from pto_patch.errors import AnchorNotFoundError, DriftError, ModelFolderError, PtoPatchError
from pto_patch.fileio import (
    atomic_write_bytes,
    file_mode,
    make_dirs,
    sha256_bytes,
)
from pto_patch.folder_status import StatusResult, model_status  # noqa: F401 - the engine's API
from pto_patch.locate import locate_sources
from pto_patch.manifest import (
    BACKUP_DIR,
    MANIFEST_DIR,
    STATE_COMPLETE,
    STATE_IN_PROGRESS,
    FileRecord,
    Manifest,
    link_target_escapes,
    parent_escapes,
)
from pto_patch.model_folder import read_model_config, resolve_model_folder
from pto_patch.patch_context import PatchContext
from pto_patch.patch_state import NONE, patch_state
from pto_patch.resources import kernel_package_dir
from pto_patch.restore import RestoreResult, restore_model  # noqa: F401 - the engine's API
from pto_patch.rewrite_cache import RewriteCache, cache_dir
from pto_patch.spec import ModelSpec, load_spec, parse_ops

KERNEL_PACKAGE = "pto_kernels"


@dataclass(frozen=True)
class PlannedFile:
    path: str  # relative, '/'-separated
    new_bytes: bytes
    old_bytes: bytes | None  # None: apply adds the file
    symlink_target: str | None = None
    mode: int | None = None

    @property
    def action(self) -> str:
        return "added" if self.old_bytes is None else "modified"


@dataclass(frozen=True)
class ApplyResult:
    folder: Path
    spec: str
    ops: tuple[str, ...]
    release: str
    source: str
    files: tuple[tuple[str, str], ...]  # (path, "added" | "modified")
    config_changes: tuple[ConfigChange, ...] = ()  # what apply changes (or changed) in config.json
    dry_run: bool = False
    diff: str = ""
    already_applied: bool = False
    rolled_back_interrupted: bool = False
    overlay_of: Path | None = None  # apply --overlay: the source folder, which was only read
    elapsed_s: float = 0.0

    @classmethod
    def already_applied_from(
        cls, folder: Path, manifest: Manifest, started: float, overlay_of: Path | None = None
    ) -> ApplyResult:
        """The result of an apply that found `folder` already patched as `manifest` records."""
        return cls(
            folder=folder,
            spec=manifest.spec,
            ops=manifest.ops,
            release=manifest.transformers_release,
            source=manifest.source,
            files=tuple((r.path, r.action) for r in manifest.files),
            already_applied=True,
            overlay_of=overlay_of,
            elapsed_s=time.perf_counter() - started,
        )


# --- planning (in memory only) --------------------------------------------------------------------


def _read_existing(folder: Path, relative: str) -> tuple[bytes | None, str | None, int | None]:
    """Bytes (through a link), link target and mode of a file in the folder, or Nones if absent.

    Refuses what restore could not put back inside the folder: a path under a link that leads out,
    a link that leads out (other than into the HF cache's blob store), a folder or a dangling link.
    """
    path = folder / relative
    if parent_escapes(folder, relative):
        raise ModelFolderError(
            f"{relative} in {folder} lies under a link that leads out of the folder",
            "replace that linked folder by a real one, then run apply again",
        )
    target = os.readlink(path) if path.is_symlink() else None
    if target is not None and link_target_escapes(folder, path, target):
        raise ModelFolderError(
            f"{path} is a link to {target}, outside the folder",
            f"replace the link by a copy of its file (cp --remove-destination {os.path.realpath(path)} {path})",
        )
    if target is not None and not path.exists():
        raise ModelFolderError(
            f"{path} is a link to {target}, which does not exist", "fix or remove the link"
        )
    if not path.exists():
        return None, None, None
    if not path.is_file():
        raise ModelFolderError(
            f"{path} is not a regular file", "move it out of the way, then run apply again"
        )
    return path.read_bytes(), target, file_mode(path)


def _planned(folder: Path, relative: str, new_bytes: bytes) -> PlannedFile:
    old, target, mode = _read_existing(folder, relative)
    return PlannedFile(relative, new_bytes, old, target, mode if target is None else None)


def _kernel_package_files() -> list[tuple[str, bytes]]:
    root = kernel_package_dir()
    files = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            relative = f"{KERNEL_PACKAGE}/{path.relative_to(root).as_posix()}"
            files.append((relative, path.read_bytes()))
    return files


def rewrite_cache(use_cache: bool) -> RewriteCache | None:
    """The user's rewrite cache (warnings on stderr), or None for `--no-cache`."""
    from pto_patch.console import warn

    return RewriteCache(cache_dir(), warn) if use_cache else None


def plan_patch(
    folder: Path,
    spec: ModelSpec,
    ops: tuple[str, ...],
    cache: RewriteCache | None = None,
    save_to_cache: bool = True,
) -> tuple[list[PlannedFile], dict]:
    """Every file apply will write, computed in memory; raises before anything is written.

    With `cache`, a rewrite done before with byte-identical inputs is reused (rewrite_cache.py), and
    with `save_to_cache` a new one is kept there.
    """
    config = read_model_config(folder, spec)
    sources = locate_sources(folder, spec)
    modeling_bytes = sources.modeling.read_bytes()
    context = PatchContext(
        spec=spec,
        ops=ops,
        release=sources.release,
        tool_version=__version__,
        source_sha256=sha256_bytes(modeling_bytes),
    )

    def rewritten(kind: str, path: Path, data: bytes) -> str:
        def run() -> str:
            from pto_patch import codemods  # libcst: only for a rewrite the cache does not hold

            rewrite = codemods.rewrite_modeling if kind == "modeling" else codemods.rewrite_configuration
            return _rewritten(folder, path, data, rewrite, context)

        return run() if cache is None else cache.rewritten(kind, data, context, run, save=save_to_cache)

    modeling = rewritten("modeling", sources.modeling, modeling_bytes)
    configuration = rewritten("configuration", sources.configuration, sources.configuration.read_bytes())
    new_data = fixed_config(config, spec)
    new_config = render_config(new_data, config.raw_bytes)

    planned = [
        _planned(folder, spec.modeling_file, modeling.encode("utf-8")),
        _planned(folder, spec.configuration_file, configuration.encode("utf-8")),
        _planned(folder, "config.json", new_config),
    ]
    planned += [_planned(folder, relative, data) for relative, data in _kernel_package_files()]
    info = {
        "release": sources.release,
        "source": str(sources.modeling),
        "source_sha256": context.source_sha256,
        "from_folder": sources.from_folder,
        "config_changes": tuple(config_changes(config.data, new_data)),
    }
    return planned, info


def _rewritten(folder: Path, path: Path, data: bytes, rewrite, context) -> str:
    """`rewrite` of a source file; where the file is the folder's own, its faults are the folder's."""
    own = path.parent == folder
    if own:
        context = replace(context, source_folder=folder)
    try:
        return rewrite(data.decode("utf-8"), context)
    except UnicodeDecodeError as exc:
        if own:
            raise ModelFolderError(
                f"{context.where(path.name)} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                _OWN_SOURCE_HINT.format(name=path.name),
            ) from exc
        raise AnchorNotFoundError(
            f"{context.where(path.name)} is not UTF-8 text ({exc.reason} at byte {exc.start})",
            "the source file is damaged; reinstall transformers",
        ) from exc
    except AnchorNotFoundError as exc:
        if not own:
            raise
        raise ModelFolderError(exc.message, _OWN_SOURCE_HINT.format(name=path.name)) from exc


_OWN_SOURCE_HINT = (
    "the folder's own {name} is not the transformers code pto-patch patches: move it out of the folder "
    "(the installed release's file is used then), or download the model again"
)


def unified_diff(planned: list[PlannedFile]) -> str:
    chunks = []
    kernel_files = [item for item in planned if item.path.startswith(f"{KERNEL_PACKAGE}/")]
    for item in planned:
        if item in kernel_files:
            continue
        old = (item.old_bytes or b"").decode("utf-8").splitlines(keepends=True)
        new = item.new_bytes.decode("utf-8").splitlines(keepends=True)
        before = f"a/{item.path}" if item.old_bytes is not None else "/dev/null"
        chunks.extend(difflib.unified_diff(old, new, before, f"b/{item.path}"))
    if kernel_files:
        chunks.append(
            f"# plus {len(kernel_files)} file(s) of the kernel package, added under {KERNEL_PACKAGE}/:\n"
        )
        chunks.extend(f"#   {item.action} {item.path}\n" for item in kernel_files)
    return "".join(chunk if chunk.endswith("\n") else chunk + "\n" for chunk in chunks)


# --- writing and undoing ---------------------------------------------------------------------------


def manifest_in_progress(
    spec: ModelSpec,
    ops: tuple[str, ...],
    info: dict,
    files: tuple[FileRecord, ...],
    added_dirs: tuple[str, ...],
    extra: dict | None = None,
) -> Manifest:
    """The manifest an apply (in place or overlay) saves before it writes a patched byte: this tool's
    version, the modeling source `plan_patch` found (its `info`), state in progress."""
    return Manifest(
        tool_version=__version__,
        spec=spec.name,
        ops=ops,
        transformers_release=info["release"],
        source=info["source"],
        source_sha256=info["source_sha256"],
        files=files,
        added_dirs=added_dirs,
        state=STATE_IN_PROGRESS,
        extra=extra or {},
    )


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
) -> ApplyResult:
    """Patch the model folder in place, or with `overlay` build a patched overlay there (see overlay.py).

    `use_cache` reuses (and keeps) rewrites in the user's rewrite cache; a dry run only reads it.
    """
    started = time.perf_counter()
    spec = load_spec(model)
    folder = resolve_model_folder(model_path, spec)
    chosen = parse_ops(",".join(ops) if isinstance(ops, tuple | list) else ops, spec)
    cache = rewrite_cache(use_cache)
    if overlay is not None:
        return overlays.apply_overlay(spec, folder, overlay, chosen, dry_run, started, cache)
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
                    "run `pto-patch restore` (with --force the edits are kept beside as *.edited), "
                    "then apply again",
                )
            return ApplyResult.already_applied_from(folder, manifest, started)
        if dry_run:
            raise ModelFolderError(
                f"{folder} holds an interrupted apply", "run `pto-patch restore` (or apply without --dry-run)"
            )
    if not dry_run:
        read_only = overlays.read_only_error(folder)  # names --overlay; also a folder without write bits
        if read_only is not None:
            raise read_only
        try:
            rolled_back = undo.recover(folder)
        except OSError as exc:
            raise PtoPatchError(
                f"rolling back the interrupted apply in {folder} failed ({exc.strerror or exc}); "
                f"left: {undo.what_is_left(folder)}",
                "fix the cause (free disk space, permissions), then run `pto-patch restore`",
            ) from exc
    planned, info = plan_patch(folder, spec, chosen, cache, save_to_cache=not dry_run)
    result = ApplyResult(
        folder=folder,
        spec=spec.name,
        ops=chosen,
        release=info["release"],
        source=info["source"],
        files=tuple((item.path, item.action) for item in planned),
        config_changes=info["config_changes"],
    )
    if dry_run:
        diff = unified_diff(planned)
        return replace(result, dry_run=True, diff=diff, elapsed_s=time.perf_counter() - started)
    try:
        _write_patch(folder, spec, chosen, planned, info)
    except OSError as exc:
        error = undo.failed_apply_error(folder, exc)
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            error.hint = f"{error.hint}; or: {overlays.OVERLAY_HINT}"
        raise error from exc
    except BaseException:
        undo.roll_back_failed_apply(folder)
        raise
    return replace(result, rolled_back_interrupted=rolled_back, elapsed_s=time.perf_counter() - started)
