"""Stand-in tests for tests/test_lanes.py: what tests/conftest.py's lane_of reads in a test's code."""

from __future__ import annotations

import subprocess


def _runs_a_process():
    return subprocess.run(["true"], check=False)


def _in_process():
    return 1 + 1


def test_in_process():
    assert _in_process() == 2


def test_through_a_helper_that_runs_a_process():
    assert _runs_a_process().returncode == 0
