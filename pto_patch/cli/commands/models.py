"""`pto-patch models`: the model specs and where their values come from."""

from __future__ import annotations

from typing import Annotated

import typer

from pto_patch.cli.options import JsonOpt, app


@app.command()
def models(
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="Show only this spec (a name, or the path of a spec .json file, checked)."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the model specs: hub repo, folder variable, widths, and where each value comes from."""
    from pto_patch.cli import render
    from pto_patch.model.catalog import list_models

    render.show(list_models(model), as_json=as_json)
