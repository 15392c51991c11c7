"""What identifies a checkpoint's weights: the sha256 of every byte of each safetensors file.

A sample of the bytes can be fooled (a checkpoint with most of its bytes changed, or two tensors of one
shape swapped, matches on every sample); the full digest cannot. Hashing gigabytes each run would cost
seconds, so each file's digest is kept in pto-patch's cache (`rewrite_cache.cache_dir()/weights/`) under
its path, device, inode, size and mtime_ns: a second run over unchanged files reads none of their bytes,
and a file rewritten in place (a new mtime, a new size or a new inode) is hashed again. A cache that
cannot be read or written only costs the hashing. Special files (a FIFO or a device named like a shard)
are refused before they are opened, never read.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pto_patch.model import input_files
from pto_patch.patching.rewrite_cache import cache_dir

CHUNK = 1 << 20
VERSION = 1  # of the cached entries' form


def _cache_file(path: Path, info: os.stat_result) -> Path:
    key = f"{VERSION}\0{path.resolve()}\0{info.st_dev}\0{info.st_ino}\0{info.st_size}\0{info.st_mtime_ns}"
    return cache_dir() / "weights" / (hashlib.sha256(key.encode()).hexdigest() + ".json")


def _cached(entry: Path) -> str | None:
    try:
        value = input_files.load_json(entry, max_bytes=4096).get("sha256")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and len(value) == 64 else None


def _remember(entry: Path, digest: str) -> None:
    from pto_patch.patching.fileio import atomic_write_bytes

    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(entry, json.dumps({"sha256": digest}).encode(), mode=0o644)
    except OSError:
        pass  # no cache: the next run hashes again


def file_digest(path: Path) -> str:
    """The sha256 of every byte of `path`, from the cache when the file is unchanged. A special file is
    an UnreadableInput; an OSError passes through."""
    problem = input_files.special_file_problem(path)
    if problem:
        raise input_files.UnreadableInput(problem)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if input_files.node_kind(info) is not None:
            raise input_files.UnreadableInput(f"{path} is not a regular file")
        entry = _cache_file(Path(path), info)
        cached = _cached(entry)
        if cached is not None:
            return cached
        digest = hashlib.sha256()
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    if os.stat(path).st_mtime_ns == info.st_mtime_ns:  # not changed while it was read
        _remember(entry, digest.hexdigest())
    return digest.hexdigest()


def weights_digest(folder: Path) -> str | None:
    """sha256 over each `*.safetensors` file's name and full digest; None when the folder has none."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}\0{file_digest(path)}\0".encode())
    return digest.hexdigest()
