"""The patch engine: apply, restore and status for one model folder.

apply plans every change in memory first (codemods, config.json, the kernel package), then
writes backups, a manifest marked in progress, the files (each atomically), and finally marks
the manifest complete. Any command that finds a manifest still in progress rolls that apply
back, so an interrupted apply never leaves a half-patched folder behind.
"""

from __future__ import annotations

import difflib
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from pto_patch import __version__
from pto_patch.config_fix import fixed_config, render_config
from pto_patch.errors import DriftError, ModelFolderError, PtoPatchError
from pto_patch.fileio import (
    atomic_symlink,
    atomic_write_bytes,
    file_mode,
    remove_path,
    sha256_bytes,
    sha256_file,
)
from pto_patch.locate import installed_transformers_release, locate_sources
from pto_patch.manifest import (
    BACKUP_DIR,
    MANIFEST_DIR,
    STATE_COMPLETE,
    STATE_IN_PROGRESS,
    FileRecord,
    Manifest,
)
from pto_patch.model_folder import read_download_record, read_model_config, resolve_model_folder
from pto_patch.patch_state import NONE, patch_state
from pto_patch.resources import kernel_package_dir
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
    dry_run: bool = False
    diff: str = ""
    already_applied: bool = False
    rolled_back_interrupted: bool = False
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class RestoreResult:
    folder: Path
    restored: tuple[str, ...]
    removed: tuple[str, ...]
    kept_edited: tuple[str, ...] = ()
    was_interrupted: bool = False
    purged_module_caches: tuple[str, ...] = ()
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class StatusResult:
    folder: Path
    spec: str
    patched: bool
    state: str | None = None  # None (not patched), "complete" or "in_progress"
    ops: tuple[str, ...] = ()
    ops_found: dict[str, list[str]] = field(default_factory=dict)
    release_at_apply: str | None = None
    release_now: str | None = None
    tool_version_at_apply: str | None = None
    drifted: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    download: dict | None = None

    @property
    def needs_reapply(self) -> bool:
        return self.patched and self.release_at_apply != self.release_now


# --- planning (in memory only) --------------------------------------------------------------------


def _read_existing(folder: Path, relative: str) -> tuple[bytes | None, str | None, int | None]:
    """Bytes (through a link), link target and mode of a file in the folder, or Nones if absent."""
    path = folder / relative
    if not path.exists():
        return None, None, None
    target = os.readlink(path) if path.is_symlink() else None
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


def plan_patch(folder: Path, spec: ModelSpec, ops: tuple[str, ...]) -> tuple[list[PlannedFile], dict]:
    """Every file apply will write, computed in memory; raises before anything is written."""
    from pto_patch.codemods import PatchContext, rewrite_configuration, rewrite_modeling

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
    modeling = rewrite_modeling(modeling_bytes.decode("utf-8"), context)
    configuration = rewrite_configuration(sources.configuration.read_bytes().decode("utf-8"), context)
    new_config = render_config(fixed_config(config, spec), config.raw_bytes)

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
    }
    return planned, info


def _unified_diff(folder: Path, planned: list[PlannedFile]) -> str:
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


def _write_patch(folder: Path, spec: ModelSpec, ops: tuple[str, ...], planned: list[PlannedFile], info: dict):
    manifest_dir = folder / MANIFEST_DIR
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
    manifest = Manifest(
        tool_version=__version__,
        spec=spec.name,
        ops=ops,
        transformers_release=info["release"],
        source=info["source"],
        source_sha256=info["source_sha256"],
        files=tuple(records),
        added_dirs=added_dirs,
        state=STATE_IN_PROGRESS,
    )
    manifest_dir.mkdir(exist_ok=True)
    manifest.save(folder)
    for item in planned:
        atomic_write_bytes(
            folder / item.path, item.new_bytes, mode=item.mode if item.mode is not None else 0o644
        )
    manifest.with_state(STATE_COMPLETE).save(folder)


def _remove_added_dirs(folder: Path, added_dirs: tuple[str, ...]) -> None:
    for relative in added_dirs:
        root = folder / relative
        if not root.is_dir():
            continue
        for cache in sorted(root.rglob("__pycache__"), reverse=True):  # written by `import pto_kernels`
            shutil.rmtree(cache, ignore_errors=True)
        for directory in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
            if not any(directory.iterdir()):
                directory.rmdir()
        if not any(root.iterdir()):
            root.rmdir()


def _put_back(
    folder: Path, manifest: Manifest, keep_edited: set[str]
) -> tuple[list[str], list[str], list[str]]:
    restored, removed, kept = [], [], []
    for record in manifest.files:
        path = folder / record.path
        if record.path in keep_edited and path.is_file():
            edited = path.with_name(path.name + ".edited")
            atomic_write_bytes(edited, path.read_bytes(), mode=file_mode(path))
            kept.append(edited.relative_to(folder).as_posix())
        if record.action == "added":
            if path.is_symlink() or path.exists():
                remove_path(path)
            removed.append(record.path)
            continue
        backup = (folder / record.backup).read_bytes() if record.backup else None
        if backup is None or sha256_bytes(backup) != record.sha256_before:
            raise PtoPatchError(
                f"the backup of {record.path} in {folder / MANIFEST_DIR} is missing or damaged",
                "the original file cannot be restored from this folder; download the model again",
            )
        if record.symlink_target is not None:
            atomic_symlink(path, record.symlink_target)
        else:
            atomic_write_bytes(path, backup, mode=record.mode)
        restored.append(record.path)
    _remove_added_dirs(folder, manifest.added_dirs)
    return restored, removed, kept


def _check_restored(folder: Path, manifest: Manifest) -> None:
    wrong = []
    for record in manifest.files:
        path = folder / record.path
        if record.action == "added":
            if path.exists() or path.is_symlink():
                wrong.append(record.path)
        elif record.symlink_target is not None:
            if not path.is_symlink() or os.readlink(path) != record.symlink_target:
                wrong.append(record.path)
        elif not path.is_file() or sha256_file(path) != record.sha256_before:
            wrong.append(record.path)
    if wrong:
        raise PtoPatchError(
            f"after restore, {', '.join(wrong)} in {folder} still differ from the original bytes",
            f"the backups are kept in {folder / MANIFEST_DIR}; copy them back by hand",
        )


def _sanitized(name: str) -> str:
    name = name.replace(".", "_dot_").replace("-", "_hyphen_")
    return f"_{name}" if name[:1].isdigit() else name


def _purge_module_caches(folder: Path, manifest: Manifest) -> list[str]:
    """Remove transformers' cached copies of the remote code apply wrote into this folder.

    transformers copies a local folder's code to `<modules>/transformers_modules/<name>[/<hash>]/`.
    Only copies whose bytes are exactly a file apply wrote are removed, so another folder with the
    same name keeps its cache.
    """
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface"
    )
    modules = Path(os.environ.get("HF_MODULES_CACHE") or os.path.join(home, "modules"))
    written = {record.sha256_after for record in manifest.files if record.path.endswith(".py")}
    purged = []
    for name in sorted({folder.name, _sanitized(folder.name)}):
        root = modules / "transformers_modules" / name
        if not root.is_dir():
            continue
        for candidate in sorted({root, *(p for p in root.iterdir() if p.is_dir())}, reverse=True):
            copies = [p for p in candidate.glob("*.py") if p.name != "__init__.py"]
            if copies and any(sha256_file(p) in written for p in copies):
                shutil.rmtree(candidate, ignore_errors=True)
                purged.append(str(candidate))
        if root.is_dir() and not [p for p in root.iterdir() if p.name not in ("__init__.py", "__pycache__")]:
            shutil.rmtree(root, ignore_errors=True)
    return purged


def _roll_back_failed_apply(folder: Path) -> None:
    """Undo a failed apply at once; if even that fails, the next command finds the manifest in progress."""
    try:
        _recover(folder)
    except Exception:  # the next command rolls back from the manifest
        pass


def _recover(folder: Path) -> bool:
    """Roll back an interrupted apply. Returns True when there was one."""
    state = patch_state(folder)
    if not state.interrupted:
        return False
    if state.manifest is not None:  # else it stopped before the manifest: only backups were written
        _put_back(folder, state.manifest, keep_edited=set())
        _check_restored(folder, state.manifest)
    shutil.rmtree(folder / MANIFEST_DIR)
    return True


# --- the three commands ----------------------------------------------------------------------------


def apply_patch(
    model: str = "gutenocr_3b",
    model_path: Path | str | None = None,
    ops: str | tuple[str, ...] | None = None,
    dry_run: bool = False,
) -> ApplyResult:
    started = time.perf_counter()
    spec = load_spec(model)
    folder = resolve_model_folder(model_path, spec)
    chosen = parse_ops(",".join(ops) if isinstance(ops, tuple | list) else ops, spec)
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
            return ApplyResult(
                folder=folder,
                spec=manifest.spec,
                ops=manifest.ops,
                release=manifest.transformers_release,
                source=manifest.source,
                files=tuple((r.path, r.action) for r in manifest.files),
                already_applied=True,
                elapsed_s=time.perf_counter() - started,
            )
        if dry_run:
            raise ModelFolderError(
                f"{folder} holds an interrupted apply", "run `pto-patch restore` (or apply without --dry-run)"
            )
    if not dry_run:
        rolled_back = _recover(folder)
    planned, info = plan_patch(folder, spec, chosen)
    result = ApplyResult(
        folder=folder,
        spec=spec.name,
        ops=chosen,
        release=info["release"],
        source=info["source"],
        files=tuple((item.path, item.action) for item in planned),
    )
    if dry_run:
        diff = _unified_diff(folder, planned)
        return replace(result, dry_run=True, diff=diff, elapsed_s=time.perf_counter() - started)
    try:
        _write_patch(folder, spec, chosen, planned, info)
    except BaseException as exc:
        _roll_back_failed_apply(folder)
        if isinstance(exc, OSError):
            raise PtoPatchError(
                f"writing the patch into {folder} failed ({exc.strerror or exc}); the folder was rolled back",
                "free disk space or fix the folder's permissions, then run apply again",
            ) from exc
        raise
    return replace(result, rolled_back_interrupted=rolled_back, elapsed_s=time.perf_counter() - started)


def restore_model(model: str = "gutenocr_3b", model_path: Path | str | None = None, force: bool = False):
    started = time.perf_counter()
    spec = load_spec(model)
    folder = resolve_model_folder(model_path, spec)
    state = patch_state(folder)
    if state.state == NONE:
        raise ModelFolderError(f"{folder} is not patched (no {MANIFEST_DIR}/ folder)", "nothing to restore")
    if state.manifest is None:
        _recover(folder)
        return RestoreResult(folder, (), (), was_interrupted=True, elapsed_s=time.perf_counter() - started)
    manifest, interrupted, drifted = state.manifest, state.interrupted, list(state.drifted)
    if drifted and not force:
        raise DriftError(
            f"{', '.join(drifted)} in {folder} changed since apply",
            "rerun with --force to restore anyway (the edited copies are kept beside as *.edited)",
        )
    restored, removed, kept = _put_back(folder, manifest, keep_edited=set(drifted))
    _check_restored(folder, manifest)
    shutil.rmtree(folder / MANIFEST_DIR)
    purged = _purge_module_caches(folder, manifest)
    return RestoreResult(
        folder=folder,
        restored=tuple(restored),
        removed=tuple(removed),
        kept_edited=tuple(kept),
        was_interrupted=interrupted,
        purged_module_caches=tuple(purged),
        elapsed_s=time.perf_counter() - started,
    )


def model_status(model: str = "gutenocr_3b", model_path: Path | str | None = None) -> StatusResult:
    from pto_patch.codemods import find_injections

    spec = load_spec(model)
    folder = resolve_model_folder(model_path, spec)
    release_now = installed_transformers_release()
    download = read_download_record(folder)
    state = patch_state(folder)
    if state.manifest is None:
        shown = STATE_IN_PROGRESS if state.interrupted else None
        return StatusResult(
            folder, spec.name, patched=False, state=shown, release_now=release_now, download=download
        )
    manifest = state.manifest
    modeling = folder / spec.modeling_file
    ops_found = find_injections(modeling.read_text(encoding="utf-8")) if modeling.is_file() else {}
    return StatusResult(
        folder=folder,
        spec=manifest.spec,
        patched=state.patched,
        state=manifest.state,
        ops=manifest.ops,
        ops_found=ops_found,
        release_at_apply=manifest.transformers_release,
        release_now=release_now,
        tool_version_at_apply=manifest.tool_version,
        drifted=state.drifted,
        files=tuple((r.path, r.action) for r in manifest.files),
        download=download,
    )
