"""A byte-exact picture of a folder: every file's bytes hash, mode, and every link's target."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def snapshot(folder: Path) -> dict[str, tuple]:
    picture = {}
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(root) / name
            relative = path.relative_to(folder).as_posix()
            if path.is_symlink():
                picture[relative] = ("link", os.readlink(path))
            elif path.is_dir():
                picture[relative] = ("dir",)
            else:
                data = path.read_bytes()
                picture[relative] = ("file", hashlib.sha256(data).hexdigest(), os.stat(path).st_mode & 0o777)
    return picture
