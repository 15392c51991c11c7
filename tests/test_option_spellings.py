"""Each option of several spellings is listed in `--help` by its first; every spelling still parses."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
import typer.main

import pto_patch.cli.app  # noqa: F401 - registers every command on the app
from pto_patch.cli.lazy_commands import lazy_app
from pto_patch.cli.options import app
from pto_patch.cli.spellings import list_first_spelling


def _commands() -> list[tuple[str, click.Command]]:
    group = typer.main.get_command(lazy_app(app))
    ctx = click.Context(group)
    found = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            sub = click.Context(command, parent=ctx)
            found += [(f"{name} {n}", command.get_command(sub, n)) for n in command.list_commands(sub)]
        else:
            found.append((name, command))
    return found


COMMANDS = _commands()
SPELLED_TWICE = [
    (name, command, param) for name, command in COMMANDS for param in command.params if len(param.opts) > 1
]
VALUE = {int: "3", float: "0.5"}  # any other type takes a path


def test_the_commands_have_options_of_several_spellings():
    assert len(SPELLED_TWICE) >= 30  # the reference's underscores beside the dashed forms


def _help(command: click.Command, name: str) -> str:
    with click.Context(command, info_name=name) as ctx:
        return command.get_help(ctx)


@pytest.mark.parametrize("name", sorted({name for name, _, _ in SPELLED_TWICE}))
def test_help_lists_each_option_by_its_first_spelling(name: str):
    command = dict(COMMANDS)[name]
    text = _help(command, name)
    for param in command.params:
        if len(param.opts) > 1:
            listed = [
                spelling for spelling in param.opts if f"{spelling} " in text or f"{spelling}\n" in text
            ]
            assert listed == param.opts[:1], (name, param.opts, listed)


def test_the_first_spelling_listing_is_what_hides_the_others():
    """A command built without the group's listing shows every spelling; with it, only the first."""
    command = typer.main.get_command_from_info(
        next(info for info in app.registered_commands if info.callback.__name__ == "status"),
        pretty_exceptions_short=True,
        rich_markup_mode=None,
    )
    assert "--model-path, --model_path" in _help(command, "status")
    list_first_spelling(list_first_spelling(command))  # twice wraps once
    text = _help(command, "status")
    assert "--model-path" in text and "--model_path" not in text


@pytest.mark.parametrize(
    ("name", "param"),
    [(name, param) for name, _, param in SPELLED_TWICE],
    ids=[f"{name}:{param.name}" for name, _, param in SPELLED_TWICE],
)
def test_every_spelling_parses_to_the_same_value(name: str, param: click.Option, tmp_path: Path):
    command = dict(COMMANDS)[name]
    value = [] if param.is_flag else [VALUE.get(param.type_descriptor.annotation, str(tmp_path))]
    parsed = []
    for spelling in param.opts:
        with command.make_context(name, [spelling, *value]) as ctx:
            parsed.append(ctx.params[param.name])
    assert len(set(map(str, parsed))) == 1 and parsed[0] not in (None, False, param.default), (
        param.opts,
        parsed,
    )
