"""The CLI in a fresh process with a stand-in torchair on the path (tests/counting_torchair by default; the
skewing one, tests/skewing_torchair, whose graphs favour one token from their third call on, with
`stand_in=SKEWING_TORCHAIR`), and the graphs it was handed, read from its log."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.spec_pipeline import run_in_fresh_process

COUNTING_TORCHAIR = Path(__file__).resolve().parent / "counting_torchair"
SKEWING_TORCHAIR = Path(__file__).resolve().parent / "skewing_torchair"
REPO = Path(__file__).resolve().parents[1]


def run_with_torchair(
    args: list[str], home: Path, *, torchair: bool = True, stand_in: Path = COUNTING_TORCHAIR
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """(the finished process, one dict per graph the stand-in was handed); `torchair=False` leaves it off the
    path (the log then stays empty); `stand_in` is the stand-in's folder put on the path."""
    log = home / "torchair.jsonl"
    log.unlink(missing_ok=True)
    saved = {key: os.environ.get(key) for key in ("PYTHONPATH", "COUNTING_TORCHAIR_LOG")}
    paths = [str(REPO)] + ([str(stand_in)] if torchair else [])
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [saved["PYTHONPATH"]] if p])
    os.environ["COUNTING_TORCHAIR_LOG"] = str(log)
    try:
        done = run_in_fresh_process(args, home)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    graphs = (
        [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []
    )
    return done, graphs
