"""The `pto-patch` command line: one module per command under `pto_patch.cli.commands`, each parsing
options, calling one engine function and rendering its result; `main` is the one place that turns errors
into messages.

No logic lives here. Heavy modules (torch, transformers) are imported inside the commands that need them,
and `main` calls the app through lazy_commands, which builds only the command a call runs, so `--help`,
`apply`, `restore` and `status` start fast.
"""

from __future__ import annotations

import sys

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


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    as_json = "--json" in args
    command = command_of(args)
    try:
        code = lazy_app(app)(args=args, prog_name="pto-patch", standalone_mode=False)
        if code == EXIT_INTERRUPTED:  # typer returns Ctrl-C as 130, having said nothing
            code = report_interrupted(command, as_json=as_json)
    except typer.Exit as exc:
        code = exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        code = report_interrupted(command, as_json=as_json)
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
    sys.exit(code if isinstance(code, int) else 0)
