"""`pto-patch restore`: put every byte of the folder back."""

from __future__ import annotations

from typing import Annotated

import typer

from pto_patch.cli.options import JsonOpt, ModelOpt, ModelPathOpt, app


@app.command()
def restore(
    model: ModelOpt = "gutenocr_3b",
    model_path: ModelPathOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="Restore even over edited files (kept beside, as .edited).")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Put every byte of the model folder back as it was before apply."""
    from pto_patch.cli import render
    from pto_patch.patching.restore import restore_model

    result = restore_model(model=model, model_path=model_path, force=force)
    render.show(result, as_json=as_json)
