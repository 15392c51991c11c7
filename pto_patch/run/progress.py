"""What a long run is doing now: the engine names each phase as it starts (the reference's load, each
judged run, each page, the timed runs), and whoever listens shows it. The command line listens only on a
terminal and never under --json (`cli/progress_display.py`); with no listener a phase costs a call."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

_listeners: list[Callable[[str], None]] = []


def phase(what: str) -> None:
    """Say that `what` starts now ("loading the patched model", "reference: page p1, TEXT")."""
    for listener in list(_listeners):
        listener(what)


@contextmanager
def listening(listener: Callable[[str], None]) -> Iterator[None]:
    """Call `listener` with every phase started inside the block."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)
