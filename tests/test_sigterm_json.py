"""SIGTERM under --json still prints one valid JSON document (issue 51, item 6; cli/app.py): the run unwinds
as on Ctrl-C, says which signal stopped it, and exits 128 + 15."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.spec_pipeline import run_in_process

QUICK = ["--warmup", "0", "--iters", "1", "--output_length", "2"]


def test_sigterm_during_verify_prints_one_json_document(patched_tiny: Path, monkeypatch, capsys):
    from pto_patch.run import verify

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # what `kill PID` or a scheduler's time-out sends
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(verify, "measure_modes", terminated)
    before = signal.getsignal(signal.SIGTERM)
    code = run_in_process("verify", "--model-path", str(patched_tiny), *QUICK, "--json")
    document = json.loads(capsys.readouterr().out)
    assert code == 128 + signal.SIGTERM == document["exit_code"]
    assert document["error"] == "interrupted (SIGTERM)" and document["command"] == "verify"
    assert signal.getsignal(signal.SIGTERM) is before  # the handler was the command's only


def test_sigterm_in_text_mode_is_one_line(patched_tiny: Path, monkeypatch, capsys):
    from pto_patch.run import verify

    monkeypatch.setattr(verify, "measure_modes", lambda *a, **k: os.kill(os.getpid(), signal.SIGTERM))
    code = run_in_process("verify", "--model-path", str(patched_tiny), *QUICK)
    captured = capsys.readouterr()
    assert code == 143 and captured.err.strip().splitlines()[-1] == "interrupted (SIGTERM)"
    assert "PASSED" not in captured.out
