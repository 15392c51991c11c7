"""The lanes tests/conftest.py sorts the suite into, and .ci/run running every one of them."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import FAST, LANES, TESTS, _chosen_lanes, lane_of
from tests.helpers import lane_examples

REPO = TESTS.parent
OWN_SCRIPTS = {"stack": ".ci/stack_lane", "vllm": ".ci/vllm_lane"}  # lanes run in environments of their own


def test_every_module_pattern_names_test_files_that_exist():
    files = [path.relative_to(TESTS).as_posix() for path in TESTS.rglob("test_*.py")]
    for lane, kind in LANES.items():
        for pattern in kind.modules:
            assert fnmatch.filter(files, pattern), f"lane {lane}: {pattern} names no test module"


def test_ci_runs_every_lane():
    text = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    text += (REPO / ".ci" / "lanes.sh").read_text(encoding="utf-8")
    ran = {
        name
        for line in re.findall(r"^\s*together (.+)$", text, re.M)
        for name in line.replace('"', " ").split()
    }
    assert ran - {"stack-seed", "stack-top", "vllm"} == set(LANES) - set(OWN_SCRIPTS) - {FAST}, ran
    assert {"stack-seed", "stack-top", "vllm"} <= ran
    assert 'step fast bash -c "$cmd"' in text  # the README's test command: the fast lane
    for script in OWN_SCRIPTS.values():
        assert f"bash {script}" in text


def _run_together(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    """.ci/lanes.sh's together with stand-in jobs (job NAME: sleep, then exit with the digit in NAME)."""
    program = f"""
set -uo pipefail
cd {shlex.quote(str(tmp_path))}
mkdir -p .ci-logs
failed=()
source {shlex.quote(str(REPO / ".ci" / "lanes.sh"))}
job() {{ sleep 0.2; echo "ran $1"; return "${{1//[^0-9]/}}"; }}
{script}
echo "failed: ${{failed[*]:-}}"
"""
    return subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60)


def test_together_waits_for_its_own_tracks_only_and_notes_each_failure(tmp_path):
    # a slow background job beside it (as .ci/run's environments install): together must neither wait for
    # it nor reap it, so the caller's own wait still reads its status
    done = _run_together(
        tmp_path,
        """
( sleep 5; exit 7 ) &
other=$!
started=$(date +%s)
together "ok0 bad3" ok0b
echo "together took $(( $(date +%s) - started ))"
wait "$other"; echo "other: $?"
""",
    )
    assert done.returncode == 0, done.stderr
    took = int(re.search(r"together took (\d+)", done.stdout).group(1))
    assert took < 4, done.stdout  # returned before the other job ended
    assert "other: 7" in done.stdout, done.stdout + done.stderr  # still the caller's to wait for
    assert "lane bad3: " in done.stdout and "FAILED (exit 3)" in done.stdout
    assert "failed: bad3" in done.stdout


def item(function, *, module: str = "test_x.py", fixtures=(), marks=()):
    """A stand-in of a collected test, with what lane_of reads."""
    return SimpleNamespace(
        path=TESTS / module,
        name=function.__name__,
        originalname=function.__name__,
        fixturenames=list(fixtures),
        _fixtureinfo=SimpleNamespace(name2fixturedefs={}),
        iter_markers=lambda: [SimpleNamespace(name=mark) for mark in marks],
        function=function,
    )


def test_a_test_is_in_the_lane_of_what_it_calls_uses_or_is_marked():
    in_process, via_helper = (
        lane_examples.test_in_process,
        lane_examples.test_through_a_helper_that_runs_a_process,
    )
    assert lane_of(item(in_process)) == FAST
    assert lane_of(item(via_helper)) == "subprocess"  # the process is started by a helper of its module
    assert lane_of(item(in_process, fixtures=["transformers_release"])) == "releases"
    assert lane_of(item(in_process, marks=["pypto"])) == "pypto"
    assert lane_of(item(in_process, module="kernels/test_kernels_pypto_blocks.py")) == "pypto"
    # the first kind wins: a process in the robustness suites is theirs
    assert lane_of(item(via_helper, module="test_folder_lock.py")) == "robustness"


def _config(lane: str | None, named: bool):
    source = pytest.Config.ArgsSource.ARGS if named else pytest.Config.ArgsSource.TESTPATHS
    return SimpleNamespace(getoption=lambda name: lane, args_source=source)


def test_plain_pytest_runs_the_fast_lane_and_named_tests_run_whatever_their_lane():
    assert _chosen_lanes(_config(None, named=False)) == {FAST}
    assert _chosen_lanes(_config(None, named=True)) is None
    assert _chosen_lanes(_config("compile, pypto", named=True)) == {"compile", "pypto"}
    assert _chosen_lanes(_config("all", named=False)) is None
    with pytest.raises(pytest.UsageError, match="no lane quick"):
        _chosen_lanes(_config("fast,quick", named=False))


def test_this_module_is_in_the_fast_lane(request):
    assert lane_of(request.node) == FAST
    assert Path(__file__).name == "test_lanes.py"
