"""Byte-exact file operations: hashing, atomic writes, and writing around symbolic links.

Files are handled as bytes so that line endings survive a round trip. A write never goes
through a symbolic link: in the Hugging Face cache layout a snapshot's files are links to
blobs shared with other snapshots, so the link itself is replaced by a regular file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write_bytes(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write `data` to `path` so that readers see either the old or the new file, never half of one.

    If `path` is a symbolic link, the link is replaced by a regular file (its target is left alone).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".pto-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)  # replaces a link itself, never its target
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def atomic_symlink(path: Path, target: str) -> None:
    """Make `path` a symbolic link to `target`, replacing whatever is there atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.pto-link-tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, path)


def file_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o7777


def remove_path(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
