"""One console for the whole tool, and the one place that turns errors into messages.

Results go to stdout; diagnostics (progress, warnings, errors) go to stderr.
Set PTO_PATCH_DEBUG=1 to see the full traceback of any error.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from functools import cached_property
from typing import Any

from pto_patch.errors import EXIT_ERROR, EXIT_INTERRUPTED, PtoPatchError

DEBUG_ENV = "PTO_PATCH_DEBUG"
PIPED_WIDTH = 200  # columns of text output that goes to a pipe or a file


class _Console:
    """The rich console for stdout or stderr, made on first use: `--help` and `--json` output never
    import rich."""

    def __init__(self, stderr: bool):
        self._stderr = stderr

    @cached_property
    def rich_console(self):
        from rich.console import Console

        # Piped or logged, rich would assume 80 columns and cut table cells ("rel err 3.43e-…"); a terminal's
        # own width, or $COLUMNS, is kept.
        stream = sys.stderr if self._stderr else sys.stdout
        piped = not (getattr(stream, "isatty", lambda: False)() or os.environ.get("COLUMNS"))
        return Console(
            stderr=self._stderr, highlight=False, soft_wrap=True, width=PIPED_WIDTH if piped else None
        )

    def print(self, *objects: Any, **options: Any) -> None:
        """rich's print; a line rich would print unchanged goes straight out while rich is not yet
        loaded (importing it is a third of a `restore`)."""
        if not options and len(objects) == 1 and is_plain(objects[0]) and "rich_console" not in vars(self):
            stream = sys.stderr if self._stderr else sys.stdout
            stream.write(objects[0] + "\n")
            stream.flush()
        else:
            self.rich_console.print(*objects, **options)

    def __getattr__(self, name: str):
        return getattr(self.rich_console, name)


# rich's emoji codes (`:name:`, nothing blank inside); `[` opens markup; other characters rich changes
# (tabs, control codes) are not printable.
EMOJI_CODE = re.compile(r":\S*:")


def is_plain(text: Any) -> bool:
    """Whether rich, without highlighting, would print `text` as it is: no markup, emoji code or control."""
    return type(text) is str and text.isprintable() and "[" not in text and not EMOJI_CODE.search(text)


out = _Console(stderr=False)
err = _Console(stderr=True)


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0", "false", "False")


def print_json(document: Any) -> None:
    """Print exactly one JSON document on stdout."""
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def warn(message: str) -> None:
    """One warning line on stderr (a diagnostic: stdout keeps its one result)."""
    err.print(f"[yellow]warning:[/] {escape(message)}", markup=True, highlight=False)


def report_hint(hint: str) -> None:
    err.print(f"[bold]hint:[/] {escape(hint)}", markup=True, highlight=False)


INTERRUPTED_HINT = "run it again; `pto-patch status` shows the folder's state (apply and restore roll back)"


def report_interrupted(command: str | None, *, as_json: bool = False) -> int:
    """An interrupted run (Ctrl-C): one line, and under --json still one document."""
    if as_json:
        print_json(
            {
                "error": "interrupted",
                "hint": INTERRUPTED_HINT,
                "exit_code": EXIT_INTERRUPTED,
                "command": command,
            }
        )
    else:
        err.print("[bold red]interrupted[/]", markup=True, highlight=False)
    return EXIT_INTERRUPTED


def report_error(exc: BaseException, *, as_json: bool = False, command: str | None = None) -> int:
    """Render `exc` as one line plus a hint; return the exit code to use."""
    if isinstance(exc, PtoPatchError):
        message, hint, code = exc.message, exc.hint, exc.exit_code
    else:
        first_line = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        message = f"unexpected error: {type(exc).__name__}: {first_line}"
        hint = f"rerun with {DEBUG_ENV}=1 for the full traceback, and report it"
        code = EXIT_ERROR
    if debug_enabled():
        traceback.print_exception(exc, file=sys.stderr)
    if as_json:
        print_json({"error": message, "hint": hint, "exit_code": code, "command": command})
    else:
        err.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)
        if hint:
            report_hint(hint)
    return code


def folding_table(*headers: str, **options: Any):
    """A rich Table whose cells wrap, and whose words longer than their column fold onto the next line
    instead of ending in "…": a narrow terminal never cuts a number. Text output only: --json never
    imports rich."""
    from rich.table import Table

    class _FoldingTable(Table):
        def add_column(self, *args: Any, **column: Any) -> None:
            column.setdefault("overflow", "fold")
            super().add_column(*args, **column)

    made = _FoldingTable(**options)
    for header in headers:
        made.add_column(header)
    return made
