"""`pto-patch tune`: measure which ops pay off on this device, per batch size."""

from __future__ import annotations

from typing import Annotated

import typer

from pto_patch.cli.options import (
    AclGraphOpt,
    AllowModifiedOpt,
    CacheOpt,
    CompileBackendOpt,
    CompileModeOpt,
    DeviceOpt,
    DtypeOpt,
    ImageOpt,
    JsonOpt,
    ModelOpt,
    ModelPathOpt,
    OpsOpt,
    OutputLengthOpt,
    PromptOpt,
    SimplePromptOpt,
    UseCompileOpt,
    app,
    as_options,
)


@app.command()
def tune(
    model: ModelOpt = "gutenocr_3b",
    model_path: ModelPathOpt = None,
    prompt: PromptOpt = None,
    image: ImageOpt = None,
    simple_prompt: SimplePromptOpt = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "bf16",
    batches: Annotated[
        str, typer.Option("--batches", help="Comma-separated batch sizes to tune.")
    ] = "1,4,8,16",
    output_length: OutputLengthOpt = 32,
    warmup: Annotated[
        int, typer.Option("--warmup", help="Unmeasured runs per candidate and batch size.")
    ] = 1,
    iters: Annotated[
        int,
        typer.Option("--iters", help="At most this many measured rounds per candidate and batch size."),
    ] = 15,
    ops: OpsOpt = None,
    kernel_backend: Annotated[
        str | None,
        typer.Option(
            "--kernel-backend",
            "--kernel_backend",
            help="Try only this backend (default: every one that runs on the device).",
        ),
    ] = None,
    budget_s: Annotated[
        float, typer.Option("--budget-s", "--budget_s", help="Seconds the whole tune may take.")
    ] = 600.0,
    min_gain: Annotated[
        float,
        typer.Option("--min-gain", "--min_gain", help="Smallest gain worth switching on, e.g. 0.01 for 1 %."),
    ] = 0.0,
    use_compile: UseCompileOpt = False,
    compile_backend: CompileBackendOpt = "inductor",
    compile_mode: CompileModeOpt = None,
    use_acl_graph: AclGraphOpt = False,
    cache: CacheOpt = "auto",
    allow_modified: AllowModifiedOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Measure which ops make the model faster on this device, per batch size; write .pto_patch/tuning.json."""
    parameters = dict(locals())  # first, so it holds the parameters only
    from pto_patch.cli import render, tune_render
    from pto_patch.tune.tuning import TuneOptions, run_tune

    options = as_options(TuneOptions, parameters)
    with tune_render.progress(options.budget_s) as on_run:
        result = run_tune(options, on_run=on_run)
    render.show(result, as_json=as_json)
    raise typer.Exit(render.exit_code(result))
