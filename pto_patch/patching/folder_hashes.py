"""A folder's content as hashes: one picture used by `skill install`, `demo` and the tests.

Files are compared by content hash, never by modification time. A symbolic link is recorded by
its target and never followed (in the Hugging Face cache, snapshot files are links to blobs).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from pto_patch.patching.fileio import sha256_bytes, sha256_file

LINK_PREFIX = "link:"
FOLDER_ENTRY = "dir"


def folder_hashes(
    folder: Path,
    *,
    ignore: Callable[[Path], bool] | None = None,
    modes: bool = False,
    folders: bool = False,
) -> dict[str, str]:
    """'/'-separated relative path -> the file's sha256 (with `modes`: and its permission bits),
    `link:<target>` for a symbolic link, and `dir` for a folder when `folders` is set.

    `ignore(relative_path)` leaves a file or folder out (a folder with everything under it).
    """
    folder = Path(folder)
    found: dict[str, str] = {}
    for root, dirs, files in os.walk(folder, followlinks=False):
        base = Path(root)
        for name in sorted(dirs + files):
            path = base / name
            relative = path.relative_to(folder)
            if ignore is not None and ignore(relative):
                if name in dirs:
                    dirs.remove(name)
                continue
            key = relative.as_posix()
            if path.is_symlink():
                found[key] = LINK_PREFIX + os.readlink(path)
            elif path.is_dir():
                if folders:
                    found[key] = FOLDER_ENTRY
            else:
                digest = sha256_file(path)
                found[key] = f"{digest} {os.stat(path).st_mode & 0o777:o}" if modes else digest
    return dict(sorted(found.items()))


def tree_hash(hashes: dict[str, str]) -> str:
    """One sha256 over sorted (path, hash) pairs: the folder's identity."""
    return sha256_bytes("".join(f"{path}\0{digest}\n" for path, digest in sorted(hashes.items())).encode())
