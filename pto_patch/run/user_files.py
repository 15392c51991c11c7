"""One way to write a file the user named (`--report-file`, `--save-outputs`, `--plot`), for every command.

Checked before anything loads, each a usage error (exit 2) in one line:
- the target exists and is not a regular file: a folder, a character device (`/dev/null`), a FIFO, a socket
  (a rename would replace the node; a write would go through it);
- the target is also one of the run's inputs (`--save-outputs F --against-outputs F` would read the trusted
  answers, then replace them with this run's);
- the target is inside a Hugging Face cache (other snapshots and users share it);
- the first folder that exists on the way to it cannot be written in.
Written at the end through a temporary file in the same folder and one rename, so a killed or failed run
leaves the old file or the new one, never half of one; the node check is made again just before.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pto_patch.errors import PtoPatchError, UsageError


def _node_kind(path: Path) -> str | None:
    """What `path` is when it exists and is not a regular file (a link is judged by what it points at)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError:
        return None  # unreadable: the write itself will say
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def can_write_in(folder: Path) -> bool:
    """Whether a file can be made in `folder` now: tried, not guessed from the mode bits (root passes
    those, a read-only mount or a full quota does not)."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".pto-patch-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    Path(name).unlink(missing_ok=True)
    return True


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (through links and `..`)."""
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def check_target(path: Path, flag: str, inputs: dict[str, Path | None] | None = None) -> None:
    """Refuse, before the run, a file the user named that the run could not or must not write."""
    path = Path(path)
    kind = _node_kind(path)
    if kind is not None:
        raise UsageError(
            f"{flag} {path} is {kind}, not a file pto-patch may write", f"pass a file path for {flag}"
        )
    for input_flag, source in (inputs or {}).items():
        if source is not None and same_file(path, Path(source)):
            raise UsageError(
                f"{flag} {path} is also {input_flag}: the run would replace what it reads",
                f"write {flag} to another file",
            )
    from pto_patch.model.hub_cache import cache_holding

    holder = cache_holding(path)
    if holder is not None:
        raise UsageError(
            f"{flag} {path} is inside the Hugging Face cache ({holder})",
            f"pass {flag} with a path outside it",
        )
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent  # the first folder that exists: the missing ones are created in it
    if not parent.is_dir() or not can_write_in(parent):
        raise UsageError(f"{flag} {path}: cannot write in {parent}", f"pick a writable path for {flag}")


def write_user_file(path: Path, data: bytes, flag: str) -> None:
    """`data` to `path` in one rename (see the module docstring); an OSError is one line naming `flag`."""
    from pto_patch.patching.fileio import atomic_write_bytes

    path = Path(path)
    kind = _node_kind(path)  # again: the node may have appeared while the run ran
    if kind is not None:
        raise PtoPatchError(
            f"{flag} {path} became {kind} during the run; nothing written", f"pass another {flag}"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data, mode=0o644)
    except OSError as exc:
        raise PtoPatchError(
            f"cannot write {flag} {path}: {exc.strerror or exc}", f"pick a writable path for {flag}"
        ) from exc


def write_new_user_file(path: Path, data: bytes, flag: str) -> Path:
    """`data` as a new file at `path`, or at `NAME-2.json`, `NAME-3.json`... where another run took the
    name meanwhile (patching.fileio.create_new_bytes: never replaces a file). Returns where it went; an
    OSError is one line naming `flag`."""
    from pto_patch.patching.fileio import create_new_bytes

    path = Path(path)
    try:
        chosen = create_new_bytes(path, data, mode=0o644)
    except OSError as exc:
        raise PtoPatchError(
            f"cannot write {flag} {path}: {exc.strerror or exc}", f"pick a writable path for {flag}"
        ) from exc
    if chosen is None:
        raise PtoPatchError(f"{flag}: every name like {path.name} is taken", f"pass another {flag}")
    return chosen
