"""`pto-patch verify`: the patched model against itself with the kernels off, on both engines."""

from __future__ import annotations

from pathlib import Path
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
    DynamicConfigOpt,
    HubKernelsOpt,
    ImageOpt,
    ItersOpt,
    JsonOpt,
    KernelBackendOpt,
    ModelOpt,
    ModelPathOpt,
    OpsOpt,
    PromptOpt,
    SimplePromptOpt,
    UseCompileOpt,
    WarmupOpt,
    app,
    as_options,
)


@app.command()
def verify(
    model: ModelOpt = "gutenocr_3b",
    model_path: ModelPathOpt = None,
    prompt: PromptOpt = None,
    image: ImageOpt = None,
    simple_prompt: SimplePromptOpt = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "bf16",
    warmup: WarmupOpt = 5,
    iters: ItersOpt = 5,
    batch: Annotated[int, typer.Option("--batch", help="Batch size (the same input repeated).")] = 1,
    output_length: Annotated[
        int | None,
        typer.Option(
            "--output_length", "--output-length", help="New tokens per run (default 50; with --ocr 1024)."
        ),
    ] = None,
    use_pto: Annotated[
        bool,
        typer.Option(
            "--use_pto",
            "--use-pto",
            help="The reference script's flag, accepted and changing nothing: verify compares the kernels "
            "on with off unless --baseline-only (with which it is a usage error).",
        ),
    ] = False,
    baseline_only: Annotated[
        bool,
        typer.Option(
            "--baseline-only",
            "--baseline_only",
            help="Run the kernels off only: compares nothing, no PASSED.",
        ),
    ] = False,
    ops: OpsOpt = None,
    kernel_backend: KernelBackendOpt = None,
    use_compile: UseCompileOpt = False,
    compile_backend: CompileBackendOpt = "inductor",
    compile_mode: CompileModeOpt = None,
    use_acl_graph: AclGraphOpt = False,
    cache: CacheOpt = "auto",
    use_dynamic_config: DynamicConfigOpt = False,
    atol: Annotated[
        float | None, typer.Option("--atol", help="Logit tolerance, absolute (per-dtype default).")
    ] = None,
    rtol: Annotated[
        float | None, typer.Option("--rtol", help="Logit tolerance, times max |logit| (per-dtype default).")
    ] = None,
    strict: Annotated[bool, typer.Option("--strict", help="A kernel fallback fails verification.")] = False,
    allow_modified: AllowModifiedOpt = False,
    hub_kernels: HubKernelsOpt = False,
    report_file: Annotated[
        Path | None, typer.Option("--report-file", "--report_file", help="Write the JSON report here.")
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="transformers (the patched folder), or vllm (the original folder through vLLM and the pto_kernels plugin).",
        ),
    ] = "transformers",
    multiprocessing: Annotated[
        bool,
        typer.Option(
            "--multiprocessing", help="--engine vllm: vLLM's multi-process engine (default: in-process)."
        ),
    ] = False,
    ocr: Annotated[
        bool,
        typer.Option("--ocr", help="Read pages with GutenOCR's TEXT, TEXT2D and LINES; score both modes."),
    ] = False,
    pages: Annotated[
        Path | None, typer.Option("--pages", help="--ocr: NAME.png + NAME.txt pages (default: bundled).")
    ] = None,
    save_outputs: Annotated[
        Path | None, typer.Option("--save-outputs", "--save_outputs", help="--ocr: keep the answers here.")
    ] = None,
    against_outputs: Annotated[
        Path | None,
        typer.Option(
            "--against-outputs",
            "--against_outputs",
            help="--ocr: compare with a trusted run's saved answers.",
        ),
    ] = None,
    other_weights: Annotated[
        bool,
        typer.Option(
            "--other-weights",
            help="--against-outputs: accept answers read from other weights (two checkpoints compared).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run the patched model with the kernels off, then on; check it computes the same, and time it."""
    parameters = dict(locals())  # first, so it holds the parameters only
    from pto_patch.cli import render
    from pto_patch.cli.progress_display import phases_shown
    from pto_patch.run.ocr.options import VERIFY_OUTPUT_LENGTH, split_ocr_options
    from pto_patch.run.verify import VerifyOptions, run_verify
    from pto_patch.serving.vllm_verify import check_engine, run_vllm_verify

    ocr_options = split_ocr_options(
        parameters, plain_output_length=VerifyOptions.output_length, ocr_output_length=VERIFY_OUTPUT_LENGTH
    )
    check_engine(parameters.pop("engine"), multiprocessing)
    with phases_shown("verify", as_json=as_json):
        if ocr_options.ocr:
            from pto_patch.run.ocr.verify import run_ocr_verify

            parameters.pop("multiprocessing")
            report = run_ocr_verify(as_options(VerifyOptions, parameters), ocr_options)
        elif engine == "vllm":
            report = run_vllm_verify(parameters)
        else:
            parameters.pop("multiprocessing")
            report = run_verify(as_options(VerifyOptions, parameters))
    render.show(report, as_json=as_json)
    raise typer.Exit(render.exit_code(report))
