"""Where the Hugging Face cache is, and what of it a path is: a repo folder, one of its snapshots, or
anything else inside it.

huggingface_hub keeps a repo as `<cache>/models--<owner>--<name>/` with `blobs/`, `refs/` and
`snapshots/<commit>/` (the files, as links to blobs shared by every snapshot). A model folder there
is a snapshot; the repo folder itself is not a model folder; nothing of a run belongs in either.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_PREFIX = "models--"


def hub_cache_roots() -> list[Path]:
    """The hub cache folders this environment names (huggingface_hub's variables, then its default)."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    named = [
        os.environ.get("HF_HUB_CACHE"),
        os.environ.get("HUGGINGFACE_HUB_CACHE"),
        os.path.join(home, "hub"),
    ]
    return list(dict.fromkeys(Path(path).expanduser().resolve() for path in named if path))


def is_cache_repo(folder: Path) -> bool:
    """A `models--owner--name` folder as huggingface_hub lays it out (snapshots/ or blobs/ inside)."""
    folder = Path(folder)
    return folder.name.startswith(REPO_PREFIX) and (
        (folder / "snapshots").is_dir() or (folder / "blobs").is_dir()
    )


def snapshots_of(repo: Path) -> list[Path]:
    """The repo folder's snapshots, newest first."""
    found = [path for path in (Path(repo) / "snapshots").glob("*") if path.is_dir()]
    return sorted(found, key=lambda path: path.stat().st_mtime, reverse=True)


def is_snapshot(folder: Path) -> bool:
    folder = Path(folder)
    return folder.parent.name == "snapshots" and is_cache_repo(folder.parent.parent)


def cache_holding(path: Path) -> Path | None:
    """The hub cache repo folder or cache root `path` lies in (itself included), or None."""
    path = Path(path).expanduser().resolve()
    for candidate in (path, *path.parents):
        if is_cache_repo(candidate):
            return candidate
    roots = hub_cache_roots()
    return next((root for root in roots if path == root or root in path.parents), None)
