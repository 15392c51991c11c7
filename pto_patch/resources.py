"""Where the bundled `templates/`, `kernels/` and `skills/` folders are.

In a built wheel they live in `pto_patch/_bundled/`; in a source checkout (editable install)
they are the repository's top-level folders.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _bundled(name: str) -> Path:
    for candidate in (_PACKAGE_DIR / "_bundled" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"pto-patch's bundled '{name}' folder is missing (looked beside {_PACKAGE_DIR})")


def templates_dir() -> Path:
    return _bundled("templates")


def kernels_dir() -> Path:
    """The folder holding the `pto_kernels` package."""
    return _bundled("kernels")


def kernel_package_dir() -> Path:
    return kernels_dir() / "pto_kernels"


def skills_dir() -> Path:
    """The folder holding the agent skill `pto-patch/` (SKILL.md, references/, scripts/)."""
    return _bundled("skills")
