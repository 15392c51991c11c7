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
    ImageOpt,
    ItersOpt,
    JsonOpt,
    KernelBackendOpt,
    ModelOpt,
    ModelPathOpt,
    OpsOpt,
    OutputLengthOpt,
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
    output_length: OutputLengthOpt = 100,
    ops: OpsOpt = None,
    kernel_backend: KernelBackendOpt = None,
    use_compile: UseCompileOpt = False,
    compile_backend: CompileBackendOpt = "inductor",
    compile_mode: CompileModeOpt = None,
    use_acl_graph: AclGraphOpt = False,
    cache: CacheOpt = "auto",
    use_dynamic_config: DynamicConfigOpt = False,
    allow_modified: AllowModifiedOpt = False,
    output_dir: Annotated[
        Path,
        typer.Option(
            "--output-dir", "--output_dir", help="Where bench_baseline.json and bench_pypto.json go."
        ),
    ] = Path("."),
    as_json: JsonOpt = False,
) -> None:
    """Baseline vs PTO per batch size: latency, tokens/s, peak memory, and the bandwidth floor."""
    parameters = dict(locals())  # first, so it holds the parameters only
    from pto_patch.cli import render
    from pto_patch.run.bench import BenchOptions, run_bench

    result = run_bench(as_options(BenchOptions, parameters))
    render.show(result, as_json=as_json)
    raise typer.Exit(result.exit_code)
