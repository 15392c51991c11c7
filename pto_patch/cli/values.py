"""Option values of str, Path and bool options, coerced as typer does, without importing pydantic.

Recent typer releases coerce every option value through a pydantic TypeAdapter built on first use
(even for a flag left unset): importing pydantic is about half of a `pto-patch status`. For the
types the quick commands take (apply, restore, status, models), typer's result needs no pydantic: a
str is itself, a bool is itself, and a Path is typer's own path check (`coerce_cli_path`: existence,
file or folder, permissions) of `Path(value)`, which is what pydantic makes of a str. `PlainValuesGroup`
gives such options that coercion before a command parses its arguments; every other type and value
goes through typer as before, and so does everything on a typer without these internals (older
releases coerce with click types, without pydantic). tests/test_cli_values.py checks the results
equal typer's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer.core

from pto_patch.cli.spellings import list_first_spelling

try:  # typer releases that coerce through pydantic
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_path
except ImportError:  # pragma: no cover - older typer: click types, no pydantic to avoid
    RuntimeParam = None


def plain_type(param: Any) -> type | None:
    """str, bool or Path where typer would coerce `param` through pydantic and the result is known without;
    None for everything else (another type, a parser, a path type of its own, another typer)."""
    if RuntimeParam is None or getattr(param, "_runtime_param", "absent") is not None:
        return None
    descriptor = getattr(param, "type_descriptor", None)
    info = getattr(descriptor, "parameter_info", None)
    if descriptor is None or info is None or info.parser is not None or descriptor.file_annotation:
        return None
    if descriptor.annotation in (str, bool):
        return descriptor.annotation
    if descriptor.annotation is Path and info.path_type is None:
        return Path
    return None


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class PlainRuntimeParam(RuntimeParam):
        """typer's coercion of a str, bool or Path option for a value of the expected kind (a str for a
        Path); any other value goes to typer's own."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if self.annotation is Path and isinstance(value, str):
                return coerce_cli_path(Path(value), self.parameter_info, path_type=Path, param=param, ctx=ctx)
            if self.annotation is not Path and type(value) is self.annotation:
                return value
            return build_runtime_param(param.type_descriptor)._coerce_value(value, param=param, ctx=ctx)


def use_plain_values(command: Any, ctx: Any) -> None:
    """Give `command`'s str, bool and Path options (its help option too) the plain coercion, once; a
    no-op on other typers."""
    for param in command.get_params(ctx):
        if plain_type(param) is not None:
            param._runtime_param = PlainRuntimeParam(
                parameter_info=param.type_descriptor.parameter_info,
                annotation=param.type_descriptor.annotation,
            )


def listing_help(command: Any) -> Any:
    """`command` with its help's whole first paragraph as the line `--help` lists it by (click cuts a
    description at 45 characters or so, mid-sentence, unless a command has a short help of its own)."""
    if command is not None and not command.short_help and command.help:
        command.short_help = " ".join(command.help.split("\n\n")[0].split())
    return command


class PlainValuesGroup(typer.core.TyperGroup):
    """A command group that, with its commands, coerces str, bool and Path options without pydantic,
    lists each command by its whole first sentence and each option by its first spelling."""

    def parse_args(self, ctx, args):
        use_plain_values(self, ctx)
        return super().parse_args(ctx, args)

    def get_command(self, ctx, cmd_name: str):
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            use_plain_values(command, ctx)
            list_first_spelling(command)
        return listing_help(command)
