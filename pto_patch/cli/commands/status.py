"""`pto-patch status`: whether the folder is patched, which ops, what drifted."""

from __future__ import annotations

from pto_patch.cli.options import JsonOpt, ModelOpt, ModelPathOpt, app


@app.command()
def status(
    model: ModelOpt = "gutenocr_3b",
    model_path: ModelPathOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show whether the folder is patched, which ops, and which files drifted."""
    from pto_patch.cli import render
    from pto_patch.patching.folder_status import model_status

    result = model_status(model=model, model_path=model_path)
    render.show(result, as_json=as_json)
