"""`pto-patch bench`: baseline against PTO mode per batch size."""

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
def bench(
    model: ModelOpt = "gutenocr_3b",
    model_path: ModelPathOpt = None,
    prompt: PromptOpt = None,
    image: ImageOpt = None,
    simple_prompt: SimplePromptOpt = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "bf16",
    warmup: WarmupOpt = 5,
    iters: ItersOpt = 5,
    batches: Annotated[str, typer.Option("--batches", help="Comma-separated batch sizes.")] = "1,4,8",
    output_length: Annotated[
        int | None,
        typer.Option(
            "--output_length",
            "--output-length",
            help="New tokens per timed run (default 100; with --ocr 2048).",
        ),
    ] = None,
    ops: OpsOpt = None,
    kernel_backend: KernelBackendOpt = None,
    use_compile: UseCompileOpt = False,
    compile_backend: CompileBackendOpt = "inductor",
    compile_mode: CompileModeOpt = None,
    use_acl_graph: AclGraphOpt = False,
    cache: CacheOpt = "auto",
    use_dynamic_config: DynamicConfigOpt = False,
    allow_modified: AllowModifiedOpt = False,
    hub_kernels: HubKernelsOpt = False,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir",
            "--output_dir",
            help="Where bench_baseline.json and bench_pypto.json go. Default: a new folder under "
            "~/.cache/pto-patch/reports/ (never the model folder).",
        ),
    ] = None,
    ocr: Annotated[
        bool,
        typer.Option("--ocr", help="Time pages: vision, prefill, first token, decode, pages per minute."),
    ] = False,
    pages: Annotated[
        Path | None, typer.Option("--pages", help="--ocr: NAME.png + NAME.txt pages (default: bundled).")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="--ocr: a PNG of where each page's time goes.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Baseline vs PTO per batch size: latency, tokens/s, peak memory, and the bandwidth floor."""
    parameters = dict(locals())  # first, so it holds the parameters only
    from pto_patch.cli import render
    from pto_patch.cli.progress_display import phases_shown
    from pto_patch.run.bench import BenchOptions, run_bench
    from pto_patch.run.ocr.options import BENCH_OUTPUT_LENGTH, split_ocr_options

    ocr_options = split_ocr_options(
        parameters, plain_output_length=BenchOptions.output_length, ocr_output_length=BENCH_OUTPUT_LENGTH
    )
    with phases_shown("bench", as_json=as_json):
        if ocr_options.ocr:
            from pto_patch.run.ocr.bench import run_page_bench

            result = run_page_bench(as_options(BenchOptions, parameters), ocr_options)
        else:
            result = run_bench(as_options(BenchOptions, parameters))
    render.show(result, as_json=as_json)
    raise typer.Exit(render.exit_code(result))
