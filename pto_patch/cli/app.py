"""The `pto-patch` command line: one module per command under `pto_patch.cli.commands`, each parsing
options, calling one engine function and rendering its result; `main` is the one place that turns errors
into messages.

No logic lives here. Heavy modules (torch, transformers) are imported inside the commands that need them,
and `main` calls the app through lazy_commands, which builds only the command a call runs, so `--help`,
`apply`, `restore` and `status` start fast.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import typer

from pto_patch.cli.commands.bench import bench
from pto_patch.cli.commands.tune import tune
from pto_patch.cli.commands.verify import verify
from pto_patch.cli.console import print_json, report_error, report_hint, report_interrupted
from pto_patch.cli.lazy_commands import lazy_app
from pto_patch.cli.options import app
from pto_patch.cli.usage_hints import command_of, usage_hint
from pto_patch.errors import EXIT_INTERRUPTED

try:  # recent typer releases vendor click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_exceptions

__all__ = ["app", "bench", "main", "tune", "verify"]


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so the run unwinds as on Ctrl-C (apply and restore roll back)
    and --json still prints its one document."""


_signals_seen: list[str] = []


def _on_sigterm(signum, frame) -> None:
    _signals_seen.append("SIGTERM")
    raise _Terminated()


def _catch_sigterm() -> Callable[[], None]:
    """Turn SIGTERM into `_Terminated` for the command; returns what puts the former handler back."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():  # signal.signal works there only
        return lambda: None
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _interrupted(command: str | None, as_json: bool) -> int:
    name = _signals_seen[-1] if _signals_seen else "SIGINT"
    return report_interrupted(command, as_json=as_json, signal_name=name)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    as_json = "--json" in args
    command = command_of(args)
    _signals_seen.clear()
    put_back = _catch_sigterm()
    try:
        code = _run(args, as_json, command)
    finally:
        put_back()
    sys.exit(code if isinstance(code, int) else 0)


def _run(args: list[str], as_json: bool, command: str | None) -> int | None:
    kept = sys.modules.get("pto_patch.run.kept_results")
    if kept is not None:
        kept.forget_kept()  # an earlier command in this process (tests) kept its own
    try:
        code = lazy_app(app)(args=args, prog_name="pto-patch", standalone_mode=False)
        if code == EXIT_INTERRUPTED:  # typer returns Ctrl-C as 130, having said nothing
            code = _interrupted(command, as_json)
    except typer.Exit as exc:
        code = exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        code = _interrupted(command, as_json)
    except click_exceptions.ClickException as exc:
        hint = usage_hint(exc, args)
        if as_json:
            print_json(
                {
                    "error": exc.format_message(),
                    "hint": hint or "see pto-patch --help",
                    "exit_code": exc.exit_code,
                    "command": command,
                }
            )
        else:
            exc.show()
            if hint:
                report_hint(hint)
        code = exc.exit_code
    except Exception as exc:  # the one place that turns errors into messages
        code = report_error(exc, as_json=as_json, command=command)
    return code
