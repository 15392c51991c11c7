"""Byte-exact file operations: hashing, atomic writes, and writing around symbolic links.

Files are handled as bytes so that line endings survive a round trip. A write never goes
through a symbolic link: in the Hugging Face cache layout a snapshot's files are links to
blobs shared with other snapshots, so the link itself is replaced by a regular file.

Every change apply and restore make to a folder goes through the functions here, and each of them
passes one checkpoint per write, rename, link or remove (`_checkpoint`). Tests arm a `FaultPlan`
there to fail the Nth operation with an errno (or to SIGKILL the process), which is how the
fault-injection suite reaches every step of an apply and of a restore. Unarmed, it costs nothing.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import os
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

WRITE, RENAME, LINK, REMOVE = "write", "rename", "link", "remove"
OPERATIONS = (WRITE, RENAME, LINK, REMOVE)


# --- the test-only fault hook ---------------------------------------------------------------------


@dataclass
class FaultPlan:
    """Fail the `nth` operation (1-based) of the given kinds with `error`, or SIGKILL the process there.

    `persistent` fails every later operation of those kinds too: kinds=(WRITE,) is a full disk, all
    kinds a process that can no longer touch the folder at all.
    `operations` records each (kind, path) seen, so a test can check where writes went.
    """

    nth: int
    error: int = errno.ENOSPC
    kinds: tuple[str, ...] = OPERATIONS
    persistent: bool = False
    kill: bool = False
    seen: int = 0
    injected: int = 0
    operations: list[tuple[str, str]] = field(default_factory=list)

    def check(self, kind: str, path: Path) -> None:
        self.operations.append((kind, str(path)))
        if kind not in self.kinds:
            return
        self.seen += 1
        due = self.seen == self.nth or (self.persistent and self.seen > self.nth)
        if not due:
            return
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        self.injected += 1
        raise OSError(self.error, f"{os.strerror(self.error)} (injected)", str(path))


_armed: FaultPlan | None = None


@contextmanager
def injected_faults(plan: FaultPlan) -> Iterator[FaultPlan]:
    """Arm `plan` for the block (tests only)."""
    global _armed
    previous, _armed = _armed, plan
    try:
        yield plan
    finally:
        _armed = previous


def arm(plan: FaultPlan | None) -> None:
    """Arm `plan` for the rest of the process (tests only, e.g. a subprocess that kills itself)."""
    global _armed
    _armed = plan


def _checkpoint(kind: str, path: Path) -> None:
    if _armed is not None:
        _armed.check(kind, path)


# --- reading --------------------------------------------------------------------------------------


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o7777


# --- writing --------------------------------------------------------------------------------------


def make_dirs(path: Path) -> None:
    """Create `path` and any missing parents (each one a write)."""
    path = Path(path)
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        _checkpoint(WRITE, directory)
        directory.mkdir(exist_ok=True)


def _written_beside(path: Path, data: bytes, mode: int | None) -> str:
    """`data` in full, synced, in a temporary file beside `path` (its folder made first): its name."""
    make_dirs(path.parent)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".pto-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            _checkpoint(WRITE, path)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp_name, mode)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return tmp_name


def atomic_write_bytes(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write `data` to `path` so that readers see either the old or the new file, never half of one.

    If `path` is a symbolic link, the link is replaced by a regular file (its target is left alone).
    """
    path = Path(path)
    tmp_name = _written_beside(path, data, mode)
    try:
        _checkpoint(RENAME, path)
        os.replace(tmp_name, path)  # replaces a link itself, never its target
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def create_new_bytes(path: Path, data: bytes, *, mode: int | None = None, tries: int = 999) -> Path | None:
    """`data` as a new file at `path`, or at `NAME-2.ext`, `NAME-3.ext`... where the name is taken: written
    in full beside it, then linked in place, which never replaces a file. The path it took; None when
    every one of `tries` names is taken."""
    path = Path(path)
    tmp_name = _written_beside(path, data, mode)
    try:
        for number in range(1, tries + 1):
            chosen = path if number == 1 else path.with_name(f"{path.stem}-{number}{path.suffix}")
            try:
                os.link(tmp_name, chosen)
            except FileExistsError:
                continue
            return chosen
        return None
    finally:
        Path(tmp_name).unlink(missing_ok=True)


def atomic_symlink(path: Path, target: str) -> None:
    """Make `path` a symbolic link to `target`, replacing whatever is there atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.pto-link-tmp")
    tmp.unlink(missing_ok=True)
    _checkpoint(LINK, path)
    os.symlink(target, tmp)
    try:
        _checkpoint(RENAME, path)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def move_into_place(source: Path, path: Path, *, mode: int | None = None) -> None:
    """Rename `source` over `path` (atomic; needs no free space, unlike a copy)."""
    if mode is not None:
        os.chmod(source, mode)
    _checkpoint(RENAME, path)
    os.replace(source, path)


def stray_temporaries(path: Path) -> list[Path]:
    """Temporary files a killed atomic write or link left beside `path`."""
    path = Path(path)
    found = sorted(path.parent.glob(f".{glob.escape(path.name)}.*.pto-tmp"))
    link = path.with_name(f".{path.name}.pto-link-tmp")
    return found + ([link] if link.is_symlink() or link.exists() else [])


def remove_path(path: Path) -> None:
    """Remove a file, a link (never its target) or a whole folder."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        remove_tree(path)
    elif path.is_symlink() or path.exists():
        _checkpoint(REMOVE, path)
        path.unlink()


def remove_tree(root: Path) -> None:
    """Remove a folder and everything in it, deepest first; links are removed, never followed."""
    root = Path(root)
    for directory, dirs, files in os.walk(root, topdown=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(directory, d))]:
            _checkpoint(REMOVE, Path(directory) / name)
            os.unlink(os.path.join(directory, name))
        for name in dirs:
            if not os.path.islink(os.path.join(directory, name)):
                _checkpoint(REMOVE, Path(directory) / name)
                os.rmdir(os.path.join(directory, name))
    _checkpoint(REMOVE, root)
    os.rmdir(root)


def remove_empty_dir(path: Path) -> None:
    _checkpoint(REMOVE, path)
    os.rmdir(path)
