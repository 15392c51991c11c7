"""`pto-patch skill install|show`: the agent skill folder."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from pto_patch.cli.options import JsonOpt, app
from pto_patch.cli.values import PlainValuesGroup

skill_app = typer.Typer(
    cls=PlainValuesGroup,
    help="The pto-patch agent skill (SKILL.md, references/, scripts/) for coding agents.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(skill_app, name="skill")


@skill_app.command("install")
def skill_install(
    directory: Annotated[
        Path | None,
        typer.Argument(
            help="The skill's folder. Default: .agents/skills/pto-patch/ under the current folder."
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a copy that differs from the bundled one.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Copy the skill folder where agents look for skills; an identical copy is left alone."""
    from pto_patch.cli import render, skill

    result = skill.install_skill(directory, force=force)
    render.show(result, as_json=as_json)


@skill_app.command("show")
def skill_show() -> None:
    """Print the bundled SKILL.md."""
    from pto_patch.cli import skill

    sys.stdout.write(skill.show_skill())
