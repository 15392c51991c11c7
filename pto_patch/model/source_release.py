"""Which transformers release a modeling file comes from, for apply's summary and the written banner.

The installed release's own file belongs to that release. A file the model folder ships belongs to the
release that wrote the folder, which its config.json names (`transformers_version`, written by
`save_pretrained`); that can differ from the installed one, and the label then says both. Bytes equal
to the installed file's are said to be so: two releases can ship the same file (5.24.0 and 5.25.0 do).
Reads files only: no torch, no transformers.
"""

from __future__ import annotations

import json
from pathlib import Path


def _config_release(folder: Path) -> str | None:
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    version = data.get("transformers_version") if isinstance(data, dict) else None
    return version if isinstance(version, str) and version.strip() else None


def _same_bytes(one: Path, other: Path) -> bool:
    try:
        return one.read_bytes() == other.read_bytes()
    except OSError:
        return False


def folder_source_release(folder: Path, own_modeling: Path, installed_modeling: Path, installed: str) -> str:
    """The label of the release a folder's own modeling file comes from (`installed` is the installed one)."""
    written_by = _config_release(folder)
    same = _same_bytes(own_modeling, installed_modeling)
    if written_by is None:
        if same:
            return f"{installed} (the folder's own file, identical to the installed one)"
        return f"unknown (the folder's own file; config.json names no release; installed: {installed})"
    if written_by == installed:
        if same:
            return installed
        return f"{installed} per config.json (the folder's own file differs from the installed one)"
    if same:
        return (
            f"{written_by} per config.json (the folder's own file, identical to the installed {installed}'s)"
        )
    return f"{written_by} per config.json (the folder's own file; installed: {installed})"
