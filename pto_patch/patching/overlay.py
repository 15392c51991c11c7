"""`apply --overlay OUT`: a patched model folder built beside the source folder, which is never written.

For model stores that must not be written (the Hugging Face cache that every tool on the host
shares, a read-only NFS or container mount), OUT holds:

- a symbolic link to every file of the source folder that apply does not change (to the source's
  own entry, so an HF-cache snapshot link still leads to its blob);
- real files for the ones apply writes (the modeling and configuration code, config.json) and the
  kernel package `pto_kernels/`;
- `.pto_patch/manifest.json`, whose `extra.overlay` records the source folder, the links and
  folders apply made, and the sha256 of every source file.

The source is only ever opened for reading (and its directory handle for a shared lock).
`status` and `verify` compare the source with the record, so a new download under an overlay is
reported; `restore` removes what apply created in OUT (OUT itself too, if apply created it).

Comparing the source: files up to `ALWAYS_HASHED` bytes are hashed every time; a larger one (a
weight shard) is hashed again only when its size, inode or modification time changed, as git's
index does, since hashing 15 GB of weights on every `status` would make it unusable.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pto_patch.errors import EXIT_USAGE, DriftError, ModelFolderError, PtoPatchError
from pto_patch.model import input_files
from pto_patch.model.spec import ModelSpec
from pto_patch.patching import folder_lock, put_back
from pto_patch.patching.fileio import (
    atomic_symlink,
    atomic_write_bytes,
    make_dirs,
    remove_empty_dir,
    sha256_bytes,
)
from pto_patch.patching.folder_kernels import KERNEL_PACKAGE
from pto_patch.patching.manifest import (
    MANIFEST_DIR,
    STATE_COMPLETE,
    FileRecord,
    Manifest,
    drifted_files,
)
from pto_patch.patching.overlay_record import (  # noqa: F401 - the overlay's record, read by status and restore
    OVERLAY_KEY,
    OverlayRecord,
    SourceEntry,
    _damaged,
    _path_problem,
    record_of,
)
from pto_patch.patching.put_back import remove_links  # noqa: F401 - restore's half, named here too

ALWAYS_HASHED = 64 * 1024 * 1024
OVERLAY_HINT = "apply --overlay OUT writes the patched files into OUT and links the rest; the model folder is never written"


def _stat_of(path: Path) -> tuple[int, int, int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _hash_file(path: Path) -> str | None:
    import hashlib

    try:
        digest = hashlib.sha256()
        if input_files.special_file_problem(path):
            return None  # a FIFO or a device is never opened: it would block or never end
        with open(path, "rb") as handle:  # read only: the source is never opened for writing
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()
    except FileNotFoundError:
        return None


def scan_source(source: Path) -> tuple[list[SourceEntry], list[str]]:
    """Every file (or link) of the source folder with its hash, and every sub-folder; .pto_patch/ left out."""
    entries, dirs = [], []
    for root, subdirs, files in os.walk(source, followlinks=False):
        here = Path(root)
        if here == source and MANIFEST_DIR in subdirs:
            subdirs.remove(MANIFEST_DIR)
        names = sorted(files) + sorted(d for d in subdirs if (here / d).is_symlink())
        subdirs[:] = sorted(d for d in subdirs if not (here / d).is_symlink())
        dirs += [(here / d).relative_to(source).as_posix() for d in subdirs]
        for name in names:
            path = here / name
            link = os.readlink(path) if path.is_symlink() else None
            hashed = None if path.is_dir() else _hash_file(path)
            entries.append(SourceEntry(path.relative_to(source).as_posix(), hashed, link, _stat_of(path)))
    return sorted(entries, key=lambda e: e.path), sorted(dirs)


def _changed(source: Path, entry: SourceEntry) -> bool:
    path = source / entry.path
    if entry.link_target is not None:
        if not path.is_symlink() or os.readlink(path) != entry.link_target:
            return True
    elif path.is_symlink() or not path.exists():
        return True
    if entry.sha256 is None:  # a dangling link (or a linked folder): its target is all there is
        return not (entry.link_target is not None and _stat_of(path) == entry.stat)
    stat = _stat_of(path)
    if stat is None:
        return True
    if stat == entry.stat and stat[2] > ALWAYS_HASHED:
        return False
    return _hash_file(path) != entry.sha256


def source_changes(folder: Path, manifest: Manifest) -> list[str]:
    """Source files changed, removed or added since apply, and links in OUT no longer leading to them."""
    record = record_of(folder, manifest)
    if record is None:
        return []
    source = Path(record.source)
    if not source.is_dir():
        return [f"{record.source} (the source folder is gone)"]
    changed = [entry.path for entry in record.entries if _changed(source, entry)]
    known = {entry.path for entry in record.entries}
    now, _ = _listing(source)
    changed += [f"{path} (new in the source)" for path in sorted(now - known)]
    for relative in record.links:
        link = folder / relative
        if not link.is_symlink() or os.readlink(link) != record.link_target(relative):
            changed.append(f"{relative} (the overlay's link was changed)")
    return changed


def _listing(source: Path) -> tuple[set[str], set[str]]:
    files, dirs = set(), set()
    for root, subdirs, names in os.walk(source, followlinks=False):
        here = Path(root)
        if here == source and MANIFEST_DIR in subdirs:
            subdirs.remove(MANIFEST_DIR)
        linked = [d for d in subdirs if (here / d).is_symlink()]
        subdirs[:] = [d for d in subdirs if d not in linked]
        files |= {(here / n).relative_to(source).as_posix() for n in [*names, *linked]}
        dirs |= {(here / d).relative_to(source).as_posix() for d in subdirs}
    return files, dirs


def status_of(folder: Path, manifest: Manifest) -> dict[str, Any] | None:
    record = record_of(folder, manifest)
    if record is None:
        return None
    return {
        "source": record.source,
        "links": len(record.links),
        "source_changed": source_changes(folder, manifest),
    }


# --- apply --------------------------------------------------------------------------------------------


def _check_folders(source: Path, out: Path) -> None:
    if out == source or out.is_relative_to(source):
        raise ModelFolderError(
            f"--overlay {out} lies inside the model folder {source}, which an overlay must never write",
            "pick an --overlay folder outside the model folder",
        )
    if source.is_relative_to(out):
        raise ModelFolderError(
            f"the model folder {source} lies inside --overlay {out}", "pick an --overlay folder beside it"
        )
    if (source / MANIFEST_DIR).exists():
        raise ModelFolderError(
            f"{source} holds a pto-patch patch (or an interrupted one); an overlay is made from an unpatched folder",
            f"run `pto-patch restore --model-path {source}` where it may be written, or overlay a clean copy",
        )
    if out.exists() and not out.is_dir():
        raise ModelFolderError(f"--overlay {out} exists and is not a folder", "pick a new or empty folder")


def _existing_overlay(out: Path, source: Path, ops: tuple[str, ...]) -> Manifest | None:
    """The complete overlay of `source` with `ops` already in OUT, or None when OUT is to be (re)built."""
    if not out.is_dir():
        return None
    if not Manifest.exists_in(out):
        if (out / MANIFEST_DIR).exists():
            return None  # an overlay apply that stopped before its manifest: the rollback clears it
        if any(out.iterdir()):
            raise ModelFolderError(
                f"--overlay {out} is not empty and holds no pto-patch overlay",
                "pick a new or empty folder for --overlay",
            )
        return None
    manifest = Manifest.load(out)
    record = record_of(out, manifest)
    if record is None:
        raise ModelFolderError(
            f"--overlay {out} holds an in-place pto-patch patch, not an overlay",
            "pick a new or empty folder for --overlay",
        )
    if Path(record.source) != source:
        raise ModelFolderError(
            f"--overlay {out} is an overlay of {record.source}, not of {source}",
            f"run `pto-patch restore --model-path {out}` first, or pick another --overlay folder",
        )
    if manifest.state != STATE_COMPLETE:
        return None
    if set(manifest.ops) != set(ops):
        raise ModelFolderError(
            f"{out} is already patched with ops {', '.join(manifest.ops)}",
            "run `pto-patch restore` first, then apply with the new --ops",
        )
    drifted = drifted_files(out, manifest) + source_changes(out, manifest)
    if drifted:
        raise DriftError(
            f"{out} is an overlay, but {', '.join(drifted)} changed since apply",
            f"run `pto-patch restore --model-path {out}` (add --force to keep edits as *.edited), "
            "then apply --overlay again",
        )
    return manifest


def apply_overlay(
    spec: ModelSpec,
    source: Path,
    out: Path | str,
    chosen: tuple[str, ...],
    dry_run: bool,
    started: float,
    cache=None,
):
    # the plan (and so the rewrite) only to apply: status and restore read an overlay without it
    from pto_patch.patching.plan import ApplyResult, plan_patch, unified_diff

    out = Path(out).expanduser().resolve()
    _check_folders(source, out)
    _check_source_files(source)
    with folder_lock.shared(source):
        existing = _existing_overlay(out, source, chosen)
        if existing is not None:
            return ApplyResult.already_applied_from(out, existing, started, overlay_of=source)
        planned, info = plan_patch(source, spec, chosen, cache, save_to_cache=not dry_run)
        written = {item.path for item in planned}
        result = ApplyResult(
            folder=out,
            spec=spec.name,
            ops=chosen,
            release=info["release"],
            source=info["source"],
            source_release=info["source_release"],
            files=tuple((item.path, "added") for item in planned),
            config_changes=info["config_changes"],
            overlay_of=source,
        )
        if dry_run:
            diff = unified_diff(planned)
            return replace(result, dry_run=True, diff=diff, elapsed_s=time.perf_counter() - started)
        created = _created_before(out)
        try:
            make_dirs(out)
        except OSError as exc:
            raise ModelFolderError(
                f"cannot create --overlay {out}: {exc.strerror or exc}",
                "pick a folder you can write to (and free disk space), then run apply --overlay again",
            ) from exc
        with folder_lock.exclusive(out):
            rolled_back = put_back.recover(out)
            entries, source_dirs = scan_source(source)
            links = tuple(e.path for e in entries if e.path not in written)
            kernel_dir = KERNEL_PACKAGE
            dirs = tuple(d for d in source_dirs if d != kernel_dir and not d.startswith(kernel_dir + "/"))
            record = OverlayRecord(str(source), created, links, dirs, tuple(entries))
            try:
                _write_overlay(out, spec, chosen, planned, info, record)
            except OSError as exc:
                error = put_back.failed_apply_error(out, exc)
                _remove_if_empty(out, record)
                raise error from exc
            except BaseException:
                if put_back.roll_back_failed_apply(out) is None:
                    _remove_if_empty(out, record)
                raise
    return replace(result, rolled_back_interrupted=rolled_back, elapsed_s=time.perf_counter() - started)


def _check_source_files(source: Path) -> None:
    """Every file of the source a regular file (or a link to one, or a folder): hashing a FIFO would wait
    for a writer forever, and a device never ends."""
    for root, subdirs, files in os.walk(source, followlinks=False):
        here = Path(root)
        if here == source and MANIFEST_DIR in subdirs:
            subdirs.remove(MANIFEST_DIR)
        for name in sorted(files):
            problem = input_files.special_file_problem(here / name)
            if problem:
                raise ModelFolderError(
                    f"the model folder holds {problem}",
                    "remove it from the model folder (an overlay links or copies only regular files)",
                    exit_code=EXIT_USAGE,
                )


def _created_before(out: Path) -> bool:
    """Whether OUT is (or was, by an apply that stopped) created by apply itself."""
    if not out.exists():
        return True
    if Manifest.exists_in(out):
        try:
            record = record_of(out, Manifest.load(out))
        except PtoPatchError:
            return False
        return bool(record and record.created_folder)
    # An apply that stopped before its manifest leaves only .pto_patch/: taken as its own folder.
    return [p.name for p in out.iterdir()] == [MANIFEST_DIR]


def _remove_if_empty(out: Path, record: OverlayRecord) -> None:
    try:
        remove_created_folder(out, record)
    except OSError:
        pass  # an empty folder left behind is harmless; the error already says what failed


def _write_overlay(out: Path, spec: ModelSpec, ops, planned, info: dict, record: OverlayRecord) -> None:
    from pto_patch.patching.plan import manifest_in_progress

    records = tuple(
        FileRecord(
            path=item.path,
            action="added",
            sha256_before=None,
            sha256_after=sha256_bytes(item.new_bytes),
        )
        for item in planned
    )
    manifest = manifest_in_progress(
        spec, ops, info, records, (KERNEL_PACKAGE,), extra={OVERLAY_KEY: record.to_json()}
    )
    make_dirs(out / MANIFEST_DIR)
    manifest.save(out)
    for relative in record.dirs:
        make_dirs(out / relative)
    for relative in record.links:
        make_dirs((out / relative).parent)
        atomic_symlink(out / relative, record.link_target(relative))
    for item in planned:
        mode = item.mode if item.mode is not None else 0o644
        atomic_write_bytes(out / item.path, item.new_bytes, mode=mode | 0o200)  # OUT is the user's own
    manifest.with_state(STATE_COMPLETE).save(out)


# --- restore ------------------------------------------------------------------------------------------


def remove_created_folder(folder: Path, record: OverlayRecord | None) -> bool:
    """Remove OUT itself when apply created it and nothing else is left in it."""
    if record is None or not record.created_folder or not folder.is_dir() or any(folder.iterdir()):
        return False
    remove_empty_dir(folder)
    return True


def read_only_error(folder: Path) -> PtoPatchError | None:
    """The error for a plain apply on a folder it may not (or should not) write, naming --overlay."""
    mode = os.stat(folder).st_mode
    if os.access(folder, os.W_OK) and mode & 0o222:
        return None
    return ModelFolderError(f"{folder} is read-only; apply would have to write into it", OVERLAY_HINT)
