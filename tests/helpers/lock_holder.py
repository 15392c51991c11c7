"""A process holding a folder's lock, for the lock and download tests."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


# Takes the lock in the mode given, says so, and holds it until stdin closes (or it is killed).
HOLDER = """
import sys
from pto_patch.patching import folder_lock
with folder_lock.locked(sys.argv[1], sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()
"""


class Holder:
    def __init__(self, folder: Path, mode: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(folder), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert self.process.stdout.readline().strip() == "held"

    def release(self) -> None:
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
