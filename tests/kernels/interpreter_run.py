"""One run of a PyPTO runner script in a process of its own (pypto exits the process on a g++ failure),
in SIM mode, its traces in the test's folder; what it saved, with its stderr."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


def run_interpreter(runner: Path, tmp: Path, *args: str) -> dict:
    env = dict(os.environ, TILE_FWK_OUTPUT_DIR=str(tmp / "traces"))
    env.pop("ASCEND_HOME_PATH", None)  # CANN absent: pypto must stay in SIM mode
    proc = subprocess.run(
        [sys.executable, str(runner), *args, str(tmp / "out.pt")],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if proc.returncode != 0:
        pytest.fail(f"pypto runner exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {**torch.load(tmp / "out.pt", weights_only=False), "stderr": proc.stderr}
