"""The one way tests run the `pto-patch` command line: in this process, or in a fresh one.

In process (`run_cli`) is `main` itself, what the console script calls: its output is the test's
capsys. A fresh process (`run_process`) is for what one process cannot show twice: transformers caches
remote code per process (`transformers_modules`) and a patched folder's `pto_kernels` stays in
`sys.modules`. Each such process gets its own HF_HOME and HF_MODULES_CACHE, runs offline, and takes no
kernel backend or model folder from the environment. tests/conftest.py puts every test that calls
`run_process` in the `subprocess` lane.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pto_patch.cli.app import main

# `python -c AFTER_LOAD CHANGE ARGS...`: the CLI with CHANGE (Python) run on each model it loads, with
# `loaded` (run.loading's result) and `model` (its model) bound.
AFTER_LOAD = """
import sys
from pto_patch.cli import app as cli
from pto_patch.run import loading

_change, _load_model = sys.argv.pop(1), loading.load_model


def load_model(*args, **kwargs):
    loaded = _load_model(*args, **kwargs)
    exec(_change, {"loaded": loaded, "model": loaded.model})
    return loaded


loading.load_model = load_model
cli.main(sys.argv[1:])
"""


def run_cli(*args: str) -> int:
    """`pto-patch ARGS` in this process: its exit code (what it printed is in capsys)."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code


def run_process(
    args: list[str], tmp_path: Path, cwd: Path | None = None, after_load: str | None = None
) -> subprocess.CompletedProcess:
    """`pto-patch ARGS` in a fresh process (in `cwd`, default `tmp_path`); `after_load`: Python run on the
    model once loaded (AFTER_LOAD)."""
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_MODULES_CACHE": str(tmp_path / "hf-modules"),
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("PTO_KERNELS_BACKEND", None)
    env.pop("GUTENOCR_MODEL_PATH", None)
    launcher = ["-m", "pto_patch"] if after_load is None else ["-c", AFTER_LOAD, after_load]
    return subprocess.run(
        [sys.executable, *launcher, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd or tmp_path,
        timeout=600,
    )


def json_out(done: subprocess.CompletedProcess) -> dict:
    """The one JSON document a run printed (raises on anything else)."""
    return json.loads(done.stdout)
