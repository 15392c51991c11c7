"""A run's phases as one line on stderr that rewrites itself (rich's status spinner), with the seconds
since the run began: shown only when stderr is a terminal and the output is text, so --json documents,
pipes and logs stay as they are."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pto_patch.run import progress


def wanted(as_json: bool, stream=None) -> bool:
    stream = sys.stderr if stream is None else stream
    return not as_json and bool(getattr(stream, "isatty", lambda: False)())


@contextmanager
def phases_shown(command: str, *, as_json: bool) -> Iterator[None]:
    """Show the engine's phases while the block runs (nothing when not `wanted`)."""
    if not wanted(as_json):
        yield
        return
    from pto_patch.cli.console import err, escape

    began = time.monotonic()
    with err.rich_console.status(f"{command}: starting", spinner="dots") as status:

        def show(what: str) -> None:
            status.update(f"{command}: {escape(what)} [dim]({time.monotonic() - began:.0f} s)[/]")

        with progress.listening(show):
            yield
