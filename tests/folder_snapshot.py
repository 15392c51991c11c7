"""A byte-exact picture of a folder: every file's bytes hash and mode, every link's target, every folder."""

from __future__ import annotations

from pathlib import Path

from pto_patch.patching.folder_hashes import folder_hashes


def snapshot(folder: Path) -> dict[str, str]:
    return folder_hashes(folder, modes=True, folders=True)
