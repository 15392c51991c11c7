"""One console for the whole tool, and the one place that turns errors into messages.

Results go to stdout; diagnostics (progress, warnings, errors) go to stderr.
Set PTO_PATCH_DEBUG=1 to see the full traceback of any error.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import traceback
from functools import cached_property
from typing import Any

from pto_patch.errors import EXIT_ERROR, PtoPatchError

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
        return _literal_on_bad_markup(Console)(
            stderr=self._stderr, highlight=False, soft_wrap=True, width=PIPED_WIDTH if piped else None
        )

    def print(self, *objects: Any, **options: Any) -> None:
        """rich's print; a line rich would print unchanged goes straight out while rich is not yet
        loaded (importing it is a third of a `restore`). Text is text: a string printed without
        `markup=True` is printed as it is, so a folder or a spec holding `[/]` or `[red]` shows as written."""
        if all(type(item) is str for item in objects):
            options.setdefault("markup", False)
        if (
            options == {"markup": False}
            and len(objects) == 1
            and is_plain(objects[0])
            and ("rich_console" not in vars(self))
        ):
            stream = sys.stderr if self._stderr else sys.stdout
            stream.write(objects[0] + "\n")
            stream.flush()
        else:
            self.rich_console.print(*objects, **options)

    def __getattr__(self, name: str):
        return getattr(self.rich_console, name)


def _literal_on_bad_markup(console_class):
    """rich's Console, where a string whose markup does not parse (a table cell holding a path like
    `mk[/]`) is shown as written instead of ending the command in a MarkupError."""
    from rich.errors import MarkupError
    from rich.text import Text

    class LiteralOnBadMarkup(console_class):
        def render_str(self, text: str, **options: Any):
            try:
                return super().render_str(text, **options)
            except MarkupError:
                return Text(text, style=options.get("style") or "")

    return LiteralOnBadMarkup


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


def finite(value: Any) -> Any:
    """`value` with every NaN or infinite float as null: JSON has no such numbers (json.dumps would write
    a bare NaN, which no strict reader takes)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def print_json(document: Any) -> None:
    """Print exactly one JSON document on stdout, valid JSON whatever it holds (`finite`)."""
    text = json.dumps(finite(document), indent=2, ensure_ascii=False, default=str, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def warn(message: str) -> None:
    """One warning line on stderr (a diagnostic: stdout keeps its one result)."""
    err.print(f"[yellow]warning:[/] {escape(message)}", markup=True, highlight=False)


def report_hint(hint: str) -> None:
    err.print(f"[bold]hint:[/] {escape(hint)}", markup=True, highlight=False)


INTERRUPTED_HINT = "run it again; `pto-patch status` shows the folder's state (apply and restore roll back)"


def report_interrupted(command: str | None, *, as_json: bool = False, signal_name: str = "SIGINT") -> int:
    """An interrupted run (Ctrl-C, or SIGTERM: `signal_name`): one line, and under --json still one
    document; the exit code is 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM)."""
    import signal

    code = 128 + int(getattr(signal, signal_name))
    what = "interrupted" if signal_name == "SIGINT" else f"interrupted ({signal_name})"
    if as_json:
        print_json(
            {
                "error": what,
                "hint": INTERRUPTED_HINT,
                "exit_code": code,
                "command": command,
            }
        )
    else:
        err.print(f"[bold red]{escape(what)}[/]", markup=True, highlight=False)
    return code


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
