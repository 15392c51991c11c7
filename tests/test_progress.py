"""A run names its phases as they start; the command line shows them on a terminal only, never under
--json or into a pipe."""

from __future__ import annotations

import io

import pytest

from pto_patch.cli.progress_display import wanted
from pto_patch.run import progress
from pto_patch.run.verify import VerifyOptions, verify_model

pytestmark = pytest.mark.usefixtures("kernel_package_restored")  # verify runs in process


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_verify_names_each_phase_in_the_order_it_runs(patched_tiny, monkeypatch):
    monkeypatch.setenv("PTO_PATCH_REFERENCE_CACHE", "0")  # the reference loads and runs
    seen: list[str] = []
    options = VerifyOptions(model_path=patched_tiny, simple_prompt=True, output_length=4, warmup=0, iters=1)
    with progress.listening(seen.append):
        report = verify_model(options)
    assert report.passed, report.failures
    order = [
        "the reference generates",
        "loading the unpatched model (the reference)",
        "loading the patched model",
        "baseline (eager, kernels off): judged",
        "pto (eager, kernels on): judged",
    ]
    assert seen[: len(order)] == order
    assert seen[-1].startswith("timed runs")
    progress.phase("after the block")  # no listener is left behind
    assert seen[-1] != "after the block"


def test_the_display_is_for_a_terminal_and_text_output_only():
    assert wanted(as_json=False, stream=Terminal())
    assert not wanted(as_json=True, stream=Terminal())  # --json: the document alone
    assert not wanted(as_json=False, stream=io.StringIO())  # a pipe or a log
