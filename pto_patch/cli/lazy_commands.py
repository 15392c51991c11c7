"""The CLI's commands, built as a call needs them: typer builds every command's options on each call
(about a quarter of a `pto-patch --help`), and a call runs at most one.

`pto_patch.cli.app.main` calls `lazy_app(app)`: a copy of the app whose group builds a command when it is
looked up to run, and lists the commands (`--help`) from their help text alone. Options, help text,
messages and exit codes are typer's own (tests/test_quick_commands.py compares them with the whole
app's).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

import typer
import typer.core
import typer.main

from pto_patch.cli.values import PlainValuesGroup, listing_help


def _command_name(info: Any) -> str:
    return info.name or typer.main.get_command_name(info.callback.__name__)


class LazyCommands(Mapping):
    """A Typer app's commands and sub-groups by name, in typer's order, each built on first lookup."""

    def __init__(self, app: typer.Typer):
        self.app = app
        self.infos: dict[str, tuple[str, Any]] = {
            **{_command_name(info): ("command", info) for info in app.registered_commands},
            **{info.name: ("group", info) for info in app.registered_groups},
        }
        self.built: dict[str, Any] = {}

    def __getitem__(self, name: str):
        if name not in self.built:
            kind, info = self.infos[name]
            settings = {
                "pretty_exceptions_short": self.app.pretty_exceptions_short,
                "rich_markup_mode": self.app.rich_markup_mode,
            }
            if kind == "command":
                self.built[name] = typer.main.get_command_from_info(info, **settings)
            else:
                settings["suggest_commands"] = self.app.suggest_commands
                self.built[name] = typer.main.get_group_from_info(info, **settings)
        return self.built[name]

    def listed(self, name: str):
        """What the command list shows of `name`: a command without its options (built as typer would
        build its help), or the sub-group itself."""
        kind, info = self.infos[name]
        if kind == "group":
            return self[name]
        text = inspect.getdoc(info.callback) if info.help is None else inspect.cleandoc(info.help)
        return typer.core.TyperCommand(
            name=name, help=text, short_help=info.short_help, hidden=info.hidden, deprecated=info.deprecated
        )

    def __contains__(self, name: object) -> bool:
        return name in self.infos  # Mapping's own looks the command up, which builds it

    def __iter__(self) -> Iterator[str]:
        return iter(self.infos)

    def __len__(self) -> int:
        return len(self.infos)


class LazyGroup(PlainValuesGroup):
    """The app's group, its commands a LazyCommands (`commands_of` names the app)."""

    commands_of: typer.Typer
    _listing = False

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(self.commands_of)

    def list_commands(self, ctx) -> list[str]:
        return list(self.commands)  # typer's reads each command too

    def format_commands(self, ctx, formatter) -> None:
        self._listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False

    def get_command(self, ctx, cmd_name: str):
        if self._listing and cmd_name in self.commands:
            return listing_help(self.commands.listed(cmd_name))
        return super().get_command(ctx, cmd_name)


def lazy_app(app: typer.Typer) -> typer.Typer:
    """A copy of `app` whose group builds each command when it is looked up (`app` is left as it is)."""
    lean = copy.copy(app)
    lean.registered_commands, lean.registered_groups = [], []
    lean.info = copy.copy(app.info)
    lean.info.cls = type("LazyAppGroup", (LazyGroup,), {"commands_of": app})
    return lean
