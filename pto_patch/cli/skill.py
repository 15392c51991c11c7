"""The pto-patch agent skill: copy the bundled `skills/pto-patch/` folder where coding agents look.

A copy is compared with the bundled one by content hashes, never by modification time: an
identical copy is left alone, a changed one is only replaced with `force`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pto_patch.errors import PtoPatchError
from pto_patch.patching.folder_hashes import folder_hashes, tree_hash
from pto_patch.resources import skills_dir

SKILL_NAME = "pto-patch"
SKILL_FILE = "SKILL.md"
# Where agents look for project skills, relative to the current folder.
DEFAULT_DESTINATION = Path(".agents") / "skills" / SKILL_NAME
# Build and editor leftovers that are not part of the skill.
IGNORED_NAMES = ("__pycache__", "*.pyc", ".DS_Store")

INSTALLED = "installed"
REPLACED = "replaced"
UNCHANGED = "unchanged"


@dataclass(frozen=True)
class SkillInstallResult:
    destination: Path
    source: Path
    action: str  # installed, replaced or unchanged
    files: tuple[str, ...]
    sha256: str  # over sorted (path, content sha256) pairs
    differed: tuple[str, ...] = ()  # files of the replaced copy that differed from the bundled ones

    def to_json(self) -> dict[str, Any]:
        return {
            "destination": str(self.destination),
            "source": str(self.source),
            "action": self.action,
            "files": list(self.files),
            "sha256": self.sha256,
            "differed": list(self.differed),
        }


def bundled_skill_dir() -> Path:
    folder = skills_dir() / SKILL_NAME
    if not (folder / SKILL_FILE).is_file():
        raise PtoPatchError(
            f"the bundled skill {folder / SKILL_FILE} is missing", "reinstall pto-patch (the wheel ships it)"
        )
    return folder


def _ignored(path: Path) -> bool:
    return (
        any(part == "__pycache__" for part in path.parts) or path.suffix == ".pyc" or path.name == ".DS_Store"
    )


def file_hashes(folder: Path) -> dict[str, str]:
    """Relative '/'-separated path -> sha256 of its bytes, for every file of the skill under `folder`."""
    return folder_hashes(folder, ignore=_ignored)


def _differences(wanted: dict[str, str], found: dict[str, str]) -> tuple[str, ...]:
    return tuple(sorted(path for path in wanted.keys() | found.keys() if wanted.get(path) != found.get(path)))


def install_skill(dest: Path | None = None, force: bool = False) -> SkillInstallResult:
    """Copy the bundled skill folder to `dest` (default `.agents/skills/pto-patch/` under the cwd)."""
    source = bundled_skill_dir()
    destination = Path(dest) if dest is not None else Path.cwd() / DEFAULT_DESTINATION
    destination = destination.absolute()
    wanted = file_hashes(source)
    digest = tree_hash(wanted)
    files = tuple(sorted(wanted))

    differed: tuple[str, ...] = ()
    if destination.exists() or destination.is_symlink():
        if not destination.is_dir():
            raise PtoPatchError(
                f"{destination} exists and is not a folder", "pick another folder for the skill"
            )
        found = file_hashes(destination)
        if found == wanted:
            return SkillInstallResult(destination, source, UNCHANGED, files, digest)
        if found and not (destination / SKILL_FILE).is_file():
            raise PtoPatchError(
                f"{destination} holds files but no {SKILL_FILE}, so it is not a skill folder",
                "pick an empty or new folder for the skill",
            )
        differed = _differences(wanted, found) if found else ()
        if differed and not force:
            shown = ", ".join(differed[:5]) + (", ..." if len(differed) > 5 else "")
            raise PtoPatchError(
                f"{destination} holds a changed copy of the pto-patch skill ({len(differed)} file(s) differ: {shown})",
                "pass --force to replace it with the bundled copy, or install into another folder",
            )
    _replace_folder(source, destination)
    copied = file_hashes(destination)
    if copied != wanted:
        raise PtoPatchError(
            f"the skill copied into {destination} does not match the bundled one",
            "check the folder is writable and has space, then install again",
        )
    return SkillInstallResult(
        destination, source, REPLACED if differed else INSTALLED, files, digest, differed
    )


def _replace_folder(source: Path, destination: Path) -> None:
    """Copy `source` beside `destination` first, then swap it in, so a failed copy leaves the old one."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(
        tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".pto-tmp", dir=destination.parent)
    )
    try:
        shutil.copytree(source, staging / "skill", ignore=shutil.ignore_patterns(*IGNORED_NAMES))
        if destination.is_symlink() or destination.is_file():
            destination.unlink()
        elif destination.is_dir():
            shutil.rmtree(destination)
        os.replace(staging / "skill", destination)
    except OSError as exc:
        raise PtoPatchError(
            f"cannot write the skill into {destination}: {exc.strerror}", "pick a writable folder"
        ) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def show_skill() -> str:
    """The bundled SKILL.md, as text."""
    return (bundled_skill_dir() / SKILL_FILE).read_text(encoding="utf-8")
