"""Shared pytest fixtures."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.release_sources import ReleaseUnavailable, release_folder

_RUN_CACHE: list[str] = []


def pytest_configure(config) -> None:
    """No test touches the user's rewrite cache: until a test's own folder is set (below), even
    module- and session-scoped fixtures use one made for this run."""
    _RUN_CACHE.append(tempfile.mkdtemp(prefix="pto-patch-test-cache-"))
    os.environ["PTO_PATCH_CACHE"] = _RUN_CACHE[-1]


def pytest_unconfigure(config) -> None:
    for folder in _RUN_CACHE:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def rewrite_cache_dir(tmp_path_factory, monkeypatch) -> Path:
    """Each test its own empty rewrite cache (what it caches is its own; subprocesses inherit it)."""
    folder = tmp_path_factory.mktemp("rewrite-cache")
    monkeypatch.setenv("PTO_PATCH_CACHE", str(folder))
    return folder


@pytest.fixture(scope="module")
def patched_tiny(tmp_path_factory) -> Path:
    """A make-tiny folder with the patch applied, shared by a module's tests (which must not change it)."""
    from pto_patch.hub.tiny_model import make_tiny
    from pto_patch.patching import engine

    folder = tmp_path_factory.mktemp("tiny") / "GutenOCR-tiny"
    make_tiny(folder)
    engine.apply_patch(model_path=folder)
    return folder


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
