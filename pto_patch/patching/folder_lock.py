"""One pto-patch at a time on a model folder: an advisory lock on the folder itself.

Commands that change a folder (apply, restore, download, tune) hold it exclusive; commands that
only read it (verify, bench) hold it shared while they check and load. A second command that
cannot have the lock fails at once, naming the holder. The lock is `flock` on the folder's own
directory handle, so nothing is written into the folder (restore stays byte for byte, a read-only
folder can still be locked) and the kernel drops the lock when its holder dies, even by SIGKILL.

Within one thread the lock is re-entrant, so a command that holds it may call another that takes
it (tune calling apply). Different threads, like different processes, exclude each other.

    with folder_lock.exclusive(folder):
        ...
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from pto_patch.errors import FolderBusyError

SHARED = "shared"
EXCLUSIVE = "exclusive"

_held = threading.local()  # (st_dev, st_ino) -> _Held, per thread


@dataclass
class _Held:
    fd: int
    mode: str
    depth: int


@dataclass(frozen=True)
class Holder:
    pid: int | None
    command: str


def _table() -> dict[tuple[int, int], _Held]:
    if not hasattr(_held, "table"):
        _held.table = {}
    return _held.table


def _command_of(pid: int) -> str:
    """The holder's command line, shortened to `pto-patch <subcommand>` where it is one."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "command unknown"
    words = [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]
    for index, word in enumerate(words):
        if word.endswith(("pto-patch", "pto_patch")) and index + 1 < len(words):
            return f"pto-patch {words[index + 1]}"
    return " ".join(words)[:120] or "command unknown"


def find_holder(folder: Path) -> Holder:
    """Who holds a lock on `folder`, from the kernel's lock table (Linux); pid None where unknown."""
    info = os.stat(folder)
    key = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; waiters carry a "->" field and are skipped
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key and fields[4].isdigit():
            pid = int(fields[4])
            if pid != os.getpid():
                return Holder(pid, _command_of(pid))
    return Holder(None, "command unknown")


def _busy(folder: Path) -> FolderBusyError:
    holder = find_holder(folder)
    who = f"pid {holder.pid}, {holder.command}" if holder.pid is not None else "pid unknown"
    return FolderBusyError(
        f"another pto-patch ({who}) is working on {folder}",
        "wait for it to finish and run the command again; a killed pto-patch never holds the lock",
    )


@contextmanager
def locked(folder: Path | str, mode: str) -> Iterator[None]:
    """Hold the folder's lock (`SHARED` or `EXCLUSIVE`) for the block; FolderBusyError if taken."""
    folder = Path(folder).resolve()
    info = os.stat(folder)
    key = (info.st_dev, info.st_ino)
    table = _table()
    held = table.get(key)
    if held is not None:
        upgraded = held.mode == SHARED and mode == EXCLUSIVE
        if upgraded:
            try:
                fcntl.flock(held.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _busy(folder) from None
            held.mode = EXCLUSIVE
        held.depth += 1
        try:
            yield
        finally:
            held.depth -= 1
            if upgraded:
                fcntl.flock(held.fd, fcntl.LOCK_SH)
                held.mode = SHARED
        return

    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # not inherited by child processes
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if mode == EXCLUSIVE else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _busy(folder) from None
    except BaseException:
        os.close(fd)
        raise
    table[key] = _Held(fd, mode, 1)
    try:
        yield
    finally:
        del table[key]
        os.close(fd)  # closing the last handle releases the lock


def exclusive(folder: Path | str) -> AbstractContextManager[None]:
    """The lock for a command that changes the folder (apply, restore, download, tune)."""
    return locked(folder, EXCLUSIVE)


def shared(folder: Path | str) -> AbstractContextManager[None]:
    """The lock for a command that only reads the folder (verify, bench) while it checks and loads."""
    return locked(folder, SHARED)
