"""`pto-patch download`: fetch a checkpoint from the hub and check the folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pto_patch.cli.options import JsonOpt, ModelOpt, app


@app.command()
def download(
    model: ModelOpt = "gutenocr_3b",
    model_id: Annotated[
        str | None, typer.Option("--model-id", help="Hub repository id. Default: the spec's (GutenOCR-3B).")
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir", help="Folder to download into. Default: the spec's $GUTENOCR_MODEL_PATH."
        ),
    ] = None,
    revision: Annotated[
        str | None, typer.Option("--revision", help="Branch, tag or commit (default: main).")
    ] = None,
    token: Annotated[
        str | None, typer.Option("--token", help="Hub token. Default: $HF_TOKEN, else the saved login.")
    ] = None,
    include: Annotated[
        list[str] | None, typer.Option("--include", help="Only files matching this glob (repeatable).")
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="Skip files matching this glob (repeatable).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fetch the model from the Hugging Face hub (resumable) and check the folder is complete."""
    from pto_patch.cli import render
    from pto_patch.hub import download as download_engine

    result = download_engine.download_model(
        model=model,
        model_id=model_id,
        output_dir=output_dir,
        revision=revision,
        token=token,
        include=tuple(include or ()),
        exclude=tuple(exclude or ()),
    )
    render.show(result, as_json=as_json)
