"""Nothing a run measured is lost to a place that cannot take it: room checked before, results kept after.

Before the run, every place a run will write (a report, saved answers, a plot, bench's report folder, the
tuning file's folder) is checked for room as well as permission (`room_problem`): the file system must
have `ROOM_MARGIN_BYTES` free (statvfs), and a probe of `PROBE_BYTES` real bytes must be written and
synced there (an empty file passes on a full disk; real bytes do not). A place that fails is a usage
error (exit 2) before anything loads.

After the work a write can still fail (the disk filled meanwhile, `ulimit -f`, a quota): the user's
target is never left half-written (every write goes through a temporary file and one rename), and the
bytes that could not go there are kept (`keep`) in pto-patch's own cache (`kept/` under
`rewrite_cache.cache_dir()`), each failure recorded for the process. The command still prints its
verdict and every measurement; the CLI then names each kept file (its path, the target it was meant for,
why), under --json in the document's `kept` list, and exits 1 where the verdict alone would have been 0.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

# What a place must have free before a run writes there: far above any report, answers file or tuning
# file pto-patch writes (kilobytes to a few megabytes), far below a disk's working space.
ROOM_MARGIN_BYTES = 16 << 20
PROBE_BYTES = 64 << 10  # written and synced for real: a full disk or a quota refuses it
KEPT = "kept"

T = TypeVar("T")


def _megabytes(count: int) -> str:
    return f"{count / (1 << 20):.1f} MB"


def room_problem(folder: Path) -> str | None:
    """Why `folder` cannot take a run's files (no permission, too little room), or None where it can."""
    folder = Path(folder)
    try:
        stats = os.statvfs(folder)
    except OSError as exc:
        return f"cannot write in {folder} ({exc.strerror or exc})"
    free = stats.f_bavail * stats.f_frsize
    if free < ROOM_MARGIN_BYTES:
        return (
            f"{folder} has {_megabytes(free)} free, under the {_megabytes(ROOM_MARGIN_BYTES)} a run needs "
            "before it writes there"
        )
    try:
        fd, name = tempfile.mkstemp(prefix=".pto-patch-probe-", dir=folder)
    except OSError as exc:
        return f"cannot write in {folder} ({exc.strerror or exc})"
    try:
        block = b"\0" * PROBE_BYTES
        written = 0
        while written < PROBE_BYTES:
            written += os.write(fd, block[written:])
        os.fsync(fd)
    except OSError as exc:
        return f"cannot write in {folder} ({exc.strerror or exc})"
    finally:
        os.close(fd)
        Path(name).unlink(missing_ok=True)
    return None


@dataclass(frozen=True)
class KeptWrite:
    """One write that failed after the work: what it was for, why, and where its bytes are now."""

    flag: str  # the option or file it was for (--report-file, --output-dir, the tuning file)
    target: str
    reason: str
    kept: str | None  # where the bytes are; None where the cache could not take them either
    kept_reason: str | None = None

    def line(self) -> str:
        where = (
            f"kept at {self.kept}"
            if self.kept
            else f"and could not be kept in pto-patch's cache either ({self.kept_reason})"
        )
        return f"cannot write {self.flag} {self.target}: {self.reason}; {where}"

    def hint(self) -> str:
        if self.kept:
            return f"copy {self.kept} where you want it, or free room there and run again"
        return "the document on stdout (--json) holds the measurements; free room and run again"

    def to_json(self) -> dict[str, str | None]:
        return asdict(self)


_kept: list[KeptWrite] = []


def kept_writes() -> list[KeptWrite]:
    """The writes this process had to keep, in order."""
    return list(_kept)


def forget_kept() -> None:
    """Start a new record (the in-process CLI runs several commands in one process)."""
    _kept.clear()


def kept_dir() -> Path:
    from pto_patch.patching.rewrite_cache import cache_dir

    return cache_dir() / KEPT


def keep(flag: str, target: Path, data: bytes, error: OSError) -> KeptWrite:
    """`data`, which could not be written to `target`, as a new file in the cache; the failure recorded."""
    from pto_patch.patching.fileio import create_new_bytes

    target = Path(target)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    reason = error.strerror or str(error)
    try:
        kept = create_new_bytes(kept_dir() / f"{stamp}-{target.name or 'output'}", data, mode=0o644)
        record = KeptWrite(
            flag, str(target), reason, str(kept) if kept else None, None if kept else "no name left"
        )
    except OSError as exc:
        record = KeptWrite(flag, str(target), reason, None, exc.strerror or str(exc))
    _kept.append(record)
    return record


def keep_folder(flag: str, target: Path, error: OSError) -> Path | None:
    """A new folder in the cache for the files meant for `target`, which could not be made; the failure
    recorded. None where the cache cannot take it either (each file's write then fails and is recorded)."""
    target = Path(target)
    reason = error.strerror or str(error)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for number in range(1, 1000):
        folder = kept_dir() / f"{stamp}-{target.name}{'' if number == 1 else f'-{number}'}"
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            continue
        except OSError as exc:
            _kept.append(KeptWrite(flag, str(target), reason, None, exc.strerror or str(exc)))
            return None
        _kept.append(KeptWrite(flag, str(target), reason, str(folder)))
        return folder
    _kept.append(KeptWrite(flag, str(target), reason, None, "no name left"))
    return None


def written_or_kept(flag: str, target: Path, data: bytes, write: Callable[[], T]) -> T | KeptWrite:
    """`write()`'s result, or, where it fails with an OSError, `data` kept (`keep`) and the record."""
    try:
        return write()
    except OSError as exc:
        return keep(flag, target, data, exc)
