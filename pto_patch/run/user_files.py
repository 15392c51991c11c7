"""One way to write a file the user named (`--report-file`, `--save-outputs`, `--plot`), for every command.

Checked before anything loads, each a usage error (exit 2) in one line:
- the target exists and is not a regular file: a folder, a character device (`/dev/null`), a FIFO, a socket
  (a rename would replace the node; a write would go through it);
- the target is also one of the run's inputs (`--save-outputs F --against-outputs F` would read the trusted
  answers, then replace them with this run's);
- the target is inside a Hugging Face cache (other snapshots and users share it);
- the target lies in the model folder the run reads (`outside_model_folder`: every file there is an input
  of the run, a weight shard as much as a config; pto-patch's own state there is written by its own code,
  never through an option);
- the first folder that exists on the way to it cannot be written in, or has too little room
  (run/kept_results.room_problem: real bytes written, a free-space margin).
Written at the end through a temporary file in the same folder and one rename, so a killed or failed run
leaves the old file or the new one, never half of one; the node check is made again just before. A write
that still fails there keeps its bytes in pto-patch's cache (run/kept_results), never drops them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pto_patch.errors import PtoPatchError, UsageError
from pto_patch.run.kept_results import KeptWrite, room_problem, written_or_kept


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


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (through links and `..`)."""
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def outside_model_folder(path: Path, flag: str, model_folder: Path | None) -> None:
    """Refuse a write target (a file or a folder) that is, or lies in, the model folder a run reads; links
    and `..` are followed, so no name of the folder gets through."""
    if model_folder is None:
        return
    try:
        target, folder = Path(path).resolve(), Path(model_folder).resolve()
    except (OSError, RuntimeError):
        return
    if target == folder or target.is_relative_to(folder):
        raise UsageError(
            f"{flag} {path} lies in the model folder {folder}, whose files this run reads",
            f"write {flag} outside the model folder",
        )


def check_target(
    path: Path, flag: str, inputs: dict[str, Path | None] | None = None, model_folder: Path | None = None
) -> None:
    """Refuse, before the run, a file the user named that the run could not or must not write."""
    path = Path(path)
    outside_model_folder(path, flag, model_folder)
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
    check_room(path, flag)


def check_room(path: Path, flag: str) -> None:
    """Refuse a file whose place (the first folder that exists on the way to it) cannot be written in or
    has too little room (run/kept_results.room_problem), before the run."""
    parent = Path(path).parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent  # the first folder that exists: the missing ones are created in it
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: cannot write in {parent}", f"pick a writable path for {flag}")
    problem = room_problem(parent)
    if problem is not None:
        raise UsageError(f"{flag} {path}: {problem}", f"pick a path with room for {flag}")


def write_user_file(path: Path, data: bytes, flag: str) -> bool:
    """`data` to `path` in one rename (see the module docstring): True. Where the write fails (a full disk,
    `ulimit -f`), `path` is left as it was and the bytes are kept in pto-patch's cache (run/kept_results,
    named by the CLI after the verdict): False."""
    from pto_patch.patching.fileio import atomic_write_bytes

    path = Path(path)
    kind = _node_kind(path)  # again: the node may have appeared while the run ran
    if kind is not None:
        raise PtoPatchError(
            f"{flag} {path} became {kind} during the run; nothing written", f"pass another {flag}"
        )

    def write() -> bool:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data, mode=0o644)
        return True

    return written_or_kept(flag, path, data, write) is True


def write_new_user_file(path: Path, data: bytes, flag: str) -> Path:
    """`data` as a new file at `path`, or at `NAME-2.json`, `NAME-3.json`... where another run took the
    name meanwhile (patching.fileio.create_new_bytes: never replaces a file). Returns where it went: where
    the write fails, the file in pto-patch's cache that keeps the bytes (run/kept_results), or `path`
    itself where even that failed (the record says so)."""
    from pto_patch.patching.fileio import create_new_bytes

    path = Path(path)
    chosen = written_or_kept(flag, path, data, lambda: create_new_bytes(path, data, mode=0o644))
    if isinstance(chosen, KeptWrite):
        return Path(chosen.kept) if chosen.kept else path
    if chosen is None:
        raise PtoPatchError(f"{flag}: every name like {path.name} is taken", f"pass another {flag}")
    return chosen
