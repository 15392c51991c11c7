"""`pto-patch make-tiny`: a random-weight model of a spec's architecture, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pto_patch.cli.options import JsonOpt, ModelOpt, app


@app.command("make-tiny")
def make_tiny(
    directory: Annotated[Path, typer.Argument(help="Folder to write the tiny model into.")],
    model: ModelOpt = "gutenocr_3b",
    full_width: Annotated[
        bool, typer.Option("--full-width", help="Use the real model's widths (hidden 2048, ...).")
    ] = False,
    layers: Annotated[int | None, typer.Option("--layers", help="Decoder layers.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed for the weights.")] = 0,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite a folder that already holds files.")
    ] = False,
    hidden_size: Annotated[
        int | None, typer.Option("--hidden-size", help="Text hidden size (default: the spec's).")
    ] = None,
    heads: Annotated[
        int | None, typer.Option("--heads", help="Text attention heads (default: the spec's).")
    ] = None,
    kv_heads: Annotated[
        int | None, typer.Option("--kv-heads", help="Text key/value heads (default: the spec's).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a random-weight model of the spec's architecture, offline (for tests and the demo).

    The MRoPE section is scaled with --hidden-size / --heads; keep head_dim (hidden / heads) at 32 or more:
    vLLM's CPU attention and the PyPTO rotary kernels need it (the default is 128 / 4)."""
    from pto_patch.cli import render
    from pto_patch.tiny import model as tiny_model

    result = tiny_model.make_tiny(
        directory,
        model=model,
        full_width=full_width,
        layers=layers,
        seed=seed,
        force=force,
        widths=tiny_model.TextWidths(hidden_size, heads, kv_heads),
    )
    render.show(result, as_json=as_json)
