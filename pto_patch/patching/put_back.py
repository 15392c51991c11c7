"""Putting a model folder back as it stood before apply: restore, and the rollback of a failed apply.

Every step is safe to repeat: a path that already holds its original is left alone, so a restore or
rollback that stops (a full disk, a kill) is finished by the next command. Backups are renamed into
place, which needs no free space. What a failed rollback leaves behind is said in words.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pto_patch.errors import PtoPatchError
from pto_patch.patching.fileio import (
    atomic_symlink,
    atomic_write_bytes,
    file_mode,
    move_into_place,
    remove_empty_dir,
    remove_path,
    remove_tree,
    sha256_file,
    stray_temporaries,
)
from pto_patch.patching.folder_contents import kept_copy_path
from pto_patch.patching.manifest import MANIFEST_DIR, STATE_IN_PROGRESS, FileRecord, Manifest
from pto_patch.patching.overlay_record import record_of
from pto_patch.patching.patch_state import patch_state


def remove_added_dirs(folder: Path, added_dirs: tuple[str, ...]) -> None:
    for relative in added_dirs:
        root = folder / relative
        if not root.is_dir() or root.is_symlink():
            continue
        for cache in sorted(root.rglob("__pycache__"), reverse=True):  # written by `import pto_kernels`
            remove_tree(cache)
        for directory in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
            if not any(directory.iterdir()):
                remove_empty_dir(directory)
        if not any(root.iterdir()):
            remove_empty_dir(root)


def is_original(folder: Path, record: FileRecord) -> bool:
    """Whether the record's path already holds what stood there before apply."""
    path = folder / record.path
    if record.action == "added":
        return not (path.exists() or path.is_symlink())
    if record.symlink_target is not None:
        return path.is_symlink() and os.readlink(path) == record.symlink_target
    return (
        path.is_file()
        and not path.is_symlink()
        and sha256_file(path) == record.sha256_before
        and (record.mode is None or file_mode(path) == record.mode)
    )


def not_original(folder: Path, manifest: Manifest) -> list[str]:
    """The manifest's paths that do not hold their original bytes (or link, or absence) yet."""
    return [record.path for record in manifest.files if not is_original(folder, record)]


def keep_edited_copies(folder: Path, drifted: list[str]) -> list[str]:
    kept = []
    for relative in drifted:
        path = folder / relative
        if path.is_file():
            edited = kept_copy_path(path)  # never over an earlier kept copy
            atomic_write_bytes(edited, path.read_bytes(), mode=file_mode(path))
            kept.append(edited.relative_to(folder).as_posix())
    return kept


def check_backups(folder: Path, manifest: Manifest) -> None:
    """Every backup still needed is there, with its original hash, before anything is touched."""
    for record in manifest.files:
        if record.action == "added" or is_original(folder, record):
            continue
        backup = folder / record.backup if record.backup else None
        if backup is None or not backup.is_file() or sha256_file(backup) != record.sha256_before:
            raise PtoPatchError(
                f"the backup of {record.path} in {folder / MANIFEST_DIR} is missing or damaged",
                "the original file cannot be restored from this folder; download the model again",
            )


def put_back(folder: Path, manifest: Manifest) -> tuple[list[str], list[str]]:
    """Put every original back; a path already original is left alone, so a second run finishes the first.

    Backups are renamed into place rather than copied: that needs no free space, so a rollback
    works on the full disk that made an apply fail.
    """
    restored, removed = [], []
    check_backups(folder, manifest)
    for record in manifest.files:
        path = folder / record.path
        for stray in stray_temporaries(path):  # from an apply or restore killed mid-write
            remove_path(stray)
        if record.action == "added":
            if path.is_symlink() or path.exists():
                remove_path(path)
            removed.append(record.path)
            continue
        restored.append(record.path)
        if is_original(folder, record):
            continue
        backup = folder / record.backup
        if record.symlink_target is not None:
            atomic_symlink(path, record.symlink_target)
        else:
            move_into_place(backup, path, mode=record.mode)
    remove_added_dirs(folder, manifest.added_dirs)
    return restored, removed


def check_restored(folder: Path, manifest: Manifest) -> None:
    wrong = not_original(folder, manifest)
    if wrong:
        raise PtoPatchError(
            f"after restore, {', '.join(wrong)} in {folder} still differ from the original bytes",
            f"the backups are kept in {folder / MANIFEST_DIR}; copy them back by hand",
        )


def original_paths(folder: Path, manifest: Manifest) -> set[str]:
    return {record.path for record in manifest.files if is_original(folder, record)}


def mark_restoring(folder: Path, manifest: Manifest) -> None:
    """Mark the manifest in progress, so a restore that stops is finished by the next command.

    On a full disk the mark cannot be written; restore goes on without it (a rerun still finishes
    the job, since paths already back are skipped and are not taken for edits).
    """
    try:
        manifest.with_state(STATE_IN_PROGRESS).save(folder)
    except OSError:
        pass


def drop_manifest_dir(folder: Path) -> None:
    """Remove .pto_patch/, the manifest first: leftover backups alone are cleared by the next command."""
    if Manifest.exists_in(folder):
        remove_path(Manifest.path_in(folder))
    if (folder / MANIFEST_DIR).exists():
        remove_tree(folder / MANIFEST_DIR)


def _sanitized(name: str) -> str:
    name = name.replace(".", "_dot_").replace("-", "_hyphen_")
    return f"_{name}" if name[:1].isdigit() else name


def purge_module_caches(folder: Path, manifest: Manifest) -> list[str]:
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


def roll_back_failed_apply(folder: Path) -> BaseException | None:
    """Undo a failed apply at once; returns why that failed too (the manifest then stays in progress)."""
    try:
        recover(folder)
    except Exception as exc:  # the next command rolls back from the manifest
        return exc
    return None


def what_is_left(folder: Path) -> str:
    """What a rollback or restore that stopped left in the folder, in words."""
    if not Manifest.exists_in(folder):  # before apply wrote its manifest, or after restore removed it
        return f"the original files, and leftovers in {MANIFEST_DIR}/ to clear"
    try:
        left = not_original(folder, Manifest.load(folder))
    except PtoPatchError:
        return f"a damaged {MANIFEST_DIR}/manifest.json"
    if not left:
        return f"the original files, and leftovers in {MANIFEST_DIR}/ to clear"
    return f"{len(left)} file(s) not yet back to the original ({', '.join(left[:3])}{', ...' if len(left) > 3 else ''})"


def failed_apply_error(folder: Path, exc: OSError) -> PtoPatchError:
    """The message for an apply whose writing failed: rolled back, or what is left and how to recover."""
    why = exc.strerror or str(exc)
    rollback_error = roll_back_failed_apply(folder)
    if rollback_error is None:
        return PtoPatchError(
            f"writing the patch into {folder} failed ({why}); the folder was rolled back to its original bytes",
            "free disk space or fix the folder's permissions, then run apply again",
        )
    rollback_why = getattr(rollback_error, "strerror", None) or str(rollback_error)
    return PtoPatchError(
        f"writing the patch into {folder} failed ({why}) and rolling it back failed too ({rollback_why}); "
        f"left: {what_is_left(folder)}",
        f"free disk space or fix the folder's permissions, then run `pto-patch restore --model-path {folder}`: "
        f"it puts the originals back from {MANIFEST_DIR}/backup/ (every pto-patch command on the folder does so first)",
    )


def finish_restore(folder: Path, manifest: Manifest) -> tuple[list[str], list[str]]:
    """Put back, check every byte, and clear .pto_patch/; returns (restored, removed)."""
    restored, removed = put_back(folder, manifest)
    check_restored(folder, manifest)
    removed += remove_links(folder, manifest)  # an overlay's links into its source (none in place)
    drop_manifest_dir(folder)
    return restored, removed


def stopped_restore_error(folder: Path, exc: OSError) -> PtoPatchError:
    return PtoPatchError(
        f"restoring {folder} stopped ({exc.strerror or exc}); left: {what_is_left(folder)}",
        "fix the cause (free disk space, permissions), then run `pto-patch restore` again: "
        "it finishes where this one stopped",
    )


def recover(folder: Path) -> bool:
    """Roll back an interrupted apply (or restore). Returns True when there was one."""
    state = patch_state(folder)
    if not state.interrupted:
        return False
    if state.manifest is None:  # stopped before the manifest (or after it): only backups are left
        remove_tree(folder / MANIFEST_DIR)
        return True
    finish_restore(folder, state.manifest)
    return True


def remove_links(folder: Path, manifest: Manifest) -> list[str]:
    """Remove the links apply made in OUT (only while they still lead where apply pointed them) and its folders."""
    record = record_of(folder, manifest)
    if record is None:
        return []
    removed = []
    for relative in record.links:
        link = folder / relative
        if link.is_symlink() and os.readlink(link) == record.link_target(relative):
            remove_path(link)
            removed.append(relative)
    for relative in sorted(record.dirs, key=lambda d: -d.count("/")):
        directory = folder / relative
        if directory.is_dir() and not directory.is_symlink() and not any(directory.iterdir()):
            remove_empty_dir(directory)
    return removed
