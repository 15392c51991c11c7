"""`pto-patch apply`: rewrite the folder's code so the chosen ops dispatch to pto_kernels."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pto_patch.cli.console import warn
from pto_patch.cli.options import JsonOpt, ModelOpt, ModelPathOpt, OpsOpt, app


@app.command()
def apply(
    model: ModelOpt = "gutenocr_3b",
    model_path: ModelPathOpt = None,
    ops: OpsOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print a unified diff; write nothing.")] = False,
    overlay: Annotated[
        Path | None,
        typer.Option(
            "--overlay",
            help="Leave the model folder untouched: write the patched files here, with links to the rest.",
        ),
    ] = None,
    no_cache: Annotated[
        bool,
        typer.Option("--no-cache", help="Rewrite the code afresh: neither read nor write the rewrite cache."),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Rewrite the model folder's code so the chosen ops dispatch to pto_kernels."""
    from pto_patch.cli import render
    from pto_patch.patching import engine

    result = engine.apply_patch(
        model=model,
        model_path=model_path,
        ops=ops,
        dry_run=dry_run,
        overlay=overlay,
        use_cache=not no_cache,
        warn=warn,
    )
    render.show(result, as_json=as_json)
