"""`pto-patch demo`: the whole workflow offline on the embedded tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pto_patch.cli.options import JsonOpt, app


@app.command()
def demo(
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Work here instead of a temporary folder.")
    ] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the tiny model, image and caches.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Offline, in under a minute: make-tiny, apply, status, verify --use_pto on an image, restore."""
    from pto_patch.cli import render
    from pto_patch.run.demo import run_demo

    result = run_demo(
        directory,
        keep=keep,
        on_step=lambda step, outcome, seconds: render.demo_progress(outcome, step, seconds, as_json=as_json),
    )
    render.show(result, as_json=as_json)
    raise typer.Exit(result.exit_code)
