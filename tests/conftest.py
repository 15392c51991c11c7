"""Shared pytest fixtures, and the lanes the suite runs in.

Every test is in one lane: the first in LANES whose kind it is of, else `fast`. Plain `pytest` (the
README's test command) runs the fast lane: every unit and in-process test, a few minutes on two cores.
`pytest --lane NAME[,NAME...]` runs others (`--lane all`: every test); naming files, folders or tests
on the command line runs all of them, whatever their lane, unless `--lane` is given too. `.ci/run`
runs every lane, so CI drops nothing. A test's kind is found by the module it is in, a fixture it
uses, a mark it carries, or a name its code (or a fixture's, or a helper's in its module) calls, so a
new test lands in its lane without a mark of its own. Each test also carries its lane as a mark
(`-m "not subprocess"` works).
"""

from __future__ import annotations

import fnmatch
import inspect
import os
import shutil
import tempfile
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.release_sources import ReleaseUnavailable, release_folder

_RUN_CACHE: list[str] = []
TESTS = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Kind:
    """What puts a test in a lane: any one of these."""

    what: str
    modules: tuple[str, ...] = ()  # paths under tests/, fnmatch patterns
    tests: tuple[str, ...] = ()  # module::function (parameters left off)
    fixtures: tuple[str, ...] = ()
    marks: tuple[str, ...] = ()
    calls: tuple[str, ...] = ()  # global names the test's code refers to


# In order: a test of two kinds runs in the first one's lane.
LANES: dict[str, Kind] = {
    "vllm": Kind(
        "runs vLLM, in its own environment (.ci/vllm_lane)", modules=("vllm_lane/*",), marks=("vllm",)
    ),
    "stack": Kind(
        "every command on a lane's stack (.ci/stack_lane; skipped elsewhere)",
        modules=("stack_lane/*",),
        marks=("stack_lane",),
    ),
    "wheel": Kind("builds and installs the wheel", modules=("test_wheel.py",)),
    "robustness": Kind(
        "fault campaigns, SIGKILLed and racing pto-patch processes",
        modules=("test_fault_injection.py", "test_folder_lock.py"),
    ),
    "releases": Kind(
        "other transformers releases (their sources or installed beside this one)",
        modules=("test_release_matrix.py", "test_codemods_releases.py", "test_graph_releases.py"),
        fixtures=("transformers_release",),
        calls=("release_env", "release_folder"),
    ),
    "full_width": Kind(
        "models at the checkpoints' full widths",
        modules=("test_specs_end_to_end.py", "kernels/test_kernels_pypto_full_width.py"),
    ),
    "pypto": Kind(
        "PyPTO kernels through the CPU verify interpreter",
        modules=("kernels/test_kernels_pypto*.py",),
        marks=("pypto",),
    ),
    "compile": Kind(
        "torch.compile, graph capture and graph decode",
        modules=("test_compiled.py", "test_graph_decode.py"),
    ),
    "subprocess": Kind(
        "pto-patch (or Python) run as a process of its own",
        calls=("run_process", "subprocess"),
    ),
    "slow": Kind("in process but more than a few seconds", marks=("slow",)),
}
FAST = "fast"


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)  # nested functions and lambdas
    return names


def _calls(function, depth: int = 2) -> set[str]:
    """Global names `function` refers to, and those of the functions of its own module it refers to."""
    function = inspect.unwrap(function)
    code = getattr(function, "__code__", None)
    if code is None:
        return set()
    names = _names(code)
    if depth:
        scope = getattr(function, "__globals__", {})
        for name in list(names):
            helper = scope.get(name)
            if isinstance(helper, types.FunctionType) and helper.__module__ == function.__module__:
                names |= _calls(helper, depth - 1)
    return names


def lane_of(item: pytest.Item) -> str:
    module = Path(str(item.path)).resolve().relative_to(TESTS).as_posix()
    test = f"{module}::{getattr(item, 'originalname', item.name)}"
    fixtures = set(getattr(item, "fixturenames", ()))
    marks = {mark.name for mark in item.iter_markers()}
    calls = _calls(getattr(item, "function", None))
    for name in fixtures:
        for definition in item._fixtureinfo.name2fixturedefs.get(name, ()):
            if Path(inspect.getfile(definition.func)).resolve().is_relative_to(TESTS):
                calls |= _calls(definition.func)
    for lane, kind in LANES.items():
        if (
            any(fnmatch.fnmatch(module, pattern) for pattern in kind.modules)
            or test in kind.tests
            or fixtures & set(kind.fixtures)
            or marks & set(kind.marks)
            or calls & set(kind.calls)
        ):
            return lane
    return FAST


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--lane",
        default=None,
        help=f"lanes to run, comma-separated: {FAST}, {', '.join(LANES)}, or all. Default: {FAST} for a plain "
        "`pytest`, all for named files or tests.",
    )


def _chosen_lanes(config) -> set[str] | None:
    """The lanes to run; None for every test."""
    asked = config.getoption("--lane")
    if asked is None:
        named = config.args_source is not pytest.Config.ArgsSource.TESTPATHS
        return None if named else {FAST}
    lanes = {lane.strip() for lane in asked.split(",") if lane.strip()}
    if "all" in lanes:
        return None
    unknown = lanes - {FAST, *LANES}
    if unknown:
        raise pytest.UsageError(
            f"--lane: no lane {', '.join(sorted(unknown))} (lanes: {FAST}, {', '.join(LANES)}, all)"
        )
    return lanes


def pytest_collection_modifyitems(config, items) -> None:
    chosen = _chosen_lanes(config)
    kept, dropped = [], []
    for item in items:
        lane = lane_of(item)
        if lane != FAST:
            item.add_marker(lane)
        (kept if chosen is None or lane in chosen else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_configure(config) -> None:
    """No test touches the user's rewrite cache: until a test's own folder is set (below), even
    module- and session-scoped fixtures use one made for this run."""
    for lane, kind in LANES.items():
        config.addinivalue_line("markers", f"{lane}: the {lane} lane: {kind.what}")
    _RUN_CACHE.append(tempfile.mkdtemp(prefix="pto-patch-test-cache-"))
    os.environ["PTO_PATCH_CACHE"] = _RUN_CACHE[-1]


def pytest_unconfigure(config) -> None:
    for folder in _RUN_CACHE:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def kernel_package_restored():
    """For a test that loads a model folder in process: that loads the folder's `pto_kernels` as
    `pto_kernels` (and its folder on sys.path); after the test the package the process had before (the
    repository's, where a test module imported it) is put back, so later tests' guards read their own."""
    import sys

    def ours() -> dict:
        return {n: m for n, m in sys.modules.items() if n == "pto_kernels" or n.startswith("pto_kernels.")}

    saved, path = ours(), list(sys.path)
    yield
    now = ours()
    if now.keys() != saved.keys() or any(now[n] is not m for n, m in saved.items()):
        for name in now:
            del sys.modules[name]
        sys.modules.update(saved)
        sys.path[:] = path


@pytest.fixture
def rewrite_cache_dir(tmp_path_factory, monkeypatch) -> Path:
    """An empty rewrite cache of the test's own (subprocesses inherit it), for a test that needs one: what
    it counts or expects rewritten cold. Every other test shares the run's cache (made above, never the
    user's), so an apply the suite has seen is not rewritten again."""
    folder = tmp_path_factory.mktemp("rewrite-cache")
    monkeypatch.setenv("PTO_PATCH_CACHE", str(folder))
    return folder


@pytest.fixture()
def model_folder(tmp_path: Path) -> Path:
    """A folder of GutenOCR-3B's config.json and an empty tokenizer: what apply reads, no weights."""
    from tests.helpers.folders import HUB_CONFIG, write_config

    folder = tmp_path / "GutenOCR-3B"
    folder.mkdir()
    write_config(folder, HUB_CONFIG)
    (folder / "tokenizer.json").write_text("{}")
    return folder


@pytest.fixture(scope="module")
def patched_tiny(tmp_path_factory) -> Path:
    """A make-tiny folder with the patch applied, shared by a module's tests (which must not change it)."""
    from pto_patch.patching import engine
    from pto_patch.tiny.model import make_tiny

    folder = tmp_path_factory.mktemp("tiny") / "GutenOCR-tiny"
    make_tiny(folder)
    engine.apply_patch(model_path=folder)
    return folder


@pytest.fixture
def patched_copy(patched_tiny: Path, tmp_path: Path) -> Path:
    """A private copy of `patched_tiny`, for tests that change it."""
    copy = tmp_path / "GutenOCR-tiny-copy"
    shutil.copytree(patched_tiny, copy, symlinks=True)
    return copy


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
