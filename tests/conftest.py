"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.release_sources import ReleaseUnavailable, release_folder


@pytest.fixture(scope="session")
def transformers_release() -> Callable[[str], Path]:
    """`get(version)` -> folder with that release's Qwen2.5-VL sources; skips when unavailable.

    A failed fetch is remembered, so an unreachable PyPI costs one attempt per session.
    """
    failures: dict[str, str] = {}

    def get(version: str) -> Path:
        if "pypi" in failures:
            pytest.skip(failures["pypi"])
        try:
            return release_folder(version)
        except ReleaseUnavailable as exc:
            failures["pypi"] = str(exc)
            pytest.skip(str(exc))

    return get


def pytest_terminal_summary(terminalreporter) -> None:
    """The robustness suites' counts (faults, kills, races, bad inputs), when they ran."""
    from tests.robustness_counts import summary

    for line in summary():
        terminalreporter.write_line(line)
