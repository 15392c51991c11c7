"""The `pto-patch` command line: parse options, call one engine function, render its result.

No logic lives here. Heavy modules (torch, transformers) are imported inside the commands that
need them, and `main` calls the app through lazy_commands, which builds only the command a call
runs, so `--help`, `apply`, `restore` and `status` start fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from pto_patch import __version__
from pto_patch.cli.console import print_json, report_error, warn
from pto_patch.cli.lazy_commands import lazy_app
from pto_patch.cli.values import PlainValuesGroup

try:  # recent typer releases vendor click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_exceptions

app = typer.Typer(
    cls=PlainValuesGroup,
    name="pto-patch",
    help="Patch Qwen2.5-VL models (GutenOCR-3B) so RMSNorm, MRoPE and the SwiGLU MLP dispatch to "
    "fused PyPTO kernels; verify it, and restore every byte.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Shared option types, declared once.
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model", help="Model spec: a name from `pto-patch models`, or the path of a spec .json file."
    ),
]
ModelPathOpt = Annotated[
    Path | None,
    typer.Option(
        "--model-path",
        "--model_path",
        help="Model folder. Default: $GUTENOCR_MODEL_PATH (the spec's variable), else the current folder.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")]
OpsOpt = Annotated[
    str | None,
    typer.Option(
        "--ops",
        help="Comma-separated ops: rms_norm, mrope, swiglu_mlp, and the decoder-layer blocks "
        "residual_rms_norm, mlp_block, attention_prologue; or all. Default: apply patches in all; "
        "runs switch on the patched ones of the first three (the reference's flags).",
    ),
]


def _version_callback(value: bool) -> None:
    if value:
        print(f"pto-patch {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """pto-patch command line."""


# --- patch engine -------------------------------------------------------------------------------


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

    The MRoPE section is scaled with --hidden-size / --heads (vLLM's CPU attention needs head_dim >= 32:
    --hidden-size 256 --heads 4 --kv-heads 2)."""
    from pto_patch.cli import render
    from pto_patch.hub import tiny_model

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


@app.command()
def models(
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="Show only this spec (a name, or the path of a spec .json file, checked)."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the model specs: hub repo, folder variable, widths, and where each value comes from."""
    from pto_patch.cli import render
    from pto_patch.model.catalog import list_models

    render.show(list_models(model), as_json=as_json)


# --- download ---------------------------------------------------------------------------------------


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


# --- verify, bench, demo -----------------------------------------------------------------------------
# Spellings mirror the reference run script (--use_pto, --output_length, ...); dashed forms work too.
# verify and bench name their parameters as the fields of VerifyOptions / BenchOptions (shared ones
# in run.options.RunOptions), so `_options` hands them over without a list to keep in step.

PromptOpt = Annotated[
    str | None,
    typer.Option("--prompt", help="Prompt (default 你好; with --image GutenOCR's read-all-text prompt)."),
]
ImageOpt = Annotated[
    Path | None, typer.Option("--image", help="An image to OCR, through the model's processor.")
]
SimplePromptOpt = Annotated[
    bool,
    typer.Option(
        "--simple_prompt", "--simple-prompt", help="Send the prompt as is, without the chat template."
    ),
]
DeviceOpt = Annotated[
    str | None,
    typer.Option(
        "--device",
        help="cpu, cuda[:N], npu[:N] or a bare NPU card number. Default: NPU, else CUDA, else CPU.",
    ),
]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")]
OutputLengthOpt = Annotated[
    int, typer.Option("--output_length", "--output-length", help="New tokens per timed run.")
]
WarmupOpt = Annotated[int, typer.Option("--warmup", help="Warm-up runs (10 new tokens each) per mode.")]
ItersOpt = Annotated[int, typer.Option("--iters", help="Timed runs per mode (averaged).")]
KernelBackendOpt = Annotated[
    str | None,
    typer.Option(
        "--kernel-backend",
        "--kernel_backend",
        help="pto_kernels backend: auto, pypto, npu, fused, torch (default $PTO_KERNELS_BACKEND or auto).",
    ),
]
UseCompileOpt = Annotated[
    bool, typer.Option("--use_compile", "--use-compile", help="torch.compile the model.")
]
CompileBackendOpt = Annotated[str, typer.Option("--backend", help="torch.compile backend.")]
CompileModeOpt = Annotated[str | None, typer.Option("--mode", help="torch.compile mode.")]
AclGraphOpt = Annotated[
    bool,
    typer.Option(
        "--use_acl_graph", "--use-acl-graph", help="ACL graph via torchair where present, else torch.compile."
    ),
]
DynamicConfigOpt = Annotated[
    bool,
    typer.Option(
        "--use_dynamic_config",
        "--use-dynamic-config",
        help="Switch ops on per batch size (SwiGLU always, MRoPE at batch <= 4, RMSNorm off).",
    ),
]
AllowModifiedOpt = Annotated[
    bool,
    typer.Option(
        "--allow-modified", "--allow_modified", help="Run patched files that differ from what apply wrote."
    ),
]


def _options(options_class: type, parameters: dict[str, Any]):
    """The options dataclass from a command's parameters, which bear its field names (all but --json)."""
    return options_class(**{name: value for name, value in parameters.items() if name != "as_json"})


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
    output_length: OutputLengthOpt = 50,
    use_pto: Annotated[
        bool, typer.Option("--use_pto", "--use-pto", help="Also run with the kernels on and compare.")
    ] = False,
    ops: OpsOpt = None,
    kernel_backend: KernelBackendOpt = None,
    use_compile: UseCompileOpt = False,
    compile_backend: CompileBackendOpt = "inductor",
    compile_mode: CompileModeOpt = None,
    use_acl_graph: AclGraphOpt = False,
    use_dynamic_config: DynamicConfigOpt = False,
    atol: Annotated[
        float | None, typer.Option("--atol", help="Logit tolerance, absolute (per-dtype default).")
    ] = None,
    rtol: Annotated[
        float | None, typer.Option("--rtol", help="Logit tolerance, times max |logit| (per-dtype default).")
    ] = None,
    strict: Annotated[bool, typer.Option("--strict", help="A kernel fallback fails verification.")] = False,
    allow_modified: AllowModifiedOpt = False,
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
    as_json: JsonOpt = False,
) -> None:
    """Run the patched model with the kernels off, then on; check it computes the same, and time it."""
    parameters = dict(locals())  # first, so it holds the parameters only
    from pto_patch.cli import render
    from pto_patch.run.verify import VerifyOptions, run_verify
    from pto_patch.serving.vllm_verify import check_engine, run_vllm_verify

    check_engine(parameters.pop("engine"), multiprocessing)
    if engine == "vllm":
        report = run_vllm_verify(parameters)
    else:
        parameters.pop("multiprocessing")
        report = run_verify(_options(VerifyOptions, parameters))
    render.show(report, as_json=as_json)
    raise typer.Exit(report.exit_code)


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

    result = run_bench(_options(BenchOptions, parameters))
    render.show(result, as_json=as_json)
    raise typer.Exit(result.exit_code)


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
    allow_modified: AllowModifiedOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Measure which ops make the model faster on this device, per batch size; write .pto_patch/tuning.json."""
    parameters = dict(locals())  # first, so it holds the parameters only
    from pto_patch.cli import render, tune_render
    from pto_patch.tune.tuning import TuneOptions, run_tune

    options = _options(TuneOptions, parameters)
    with tune_render.progress(options.budget_s) as on_run:
        result = run_tune(options, on_run=on_run)
    render.show(result, as_json=as_json)
    raise typer.Exit(result.exit_code)


# --- skill ------------------------------------------------------------------------------------------

skill_app = typer.Typer(
    cls=PlainValuesGroup,
    help="The pto-patch agent skill (SKILL.md, references/, scripts/) for coding agents.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(skill_app, name="skill")


@skill_app.command("install")
def skill_install(
    directory: Annotated[
        Path | None,
        typer.Argument(
            help="The skill's folder. Default: .agents/skills/pto-patch/ under the current folder."
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a copy that differs from the bundled one.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Copy the skill folder where agents look for skills; an identical copy is left alone."""
    from pto_patch.cli import render, skill

    result = skill.install_skill(directory, force=force)
    render.show(result, as_json=as_json)


@skill_app.command("show")
def skill_show() -> None:
    """Print the bundled SKILL.md."""
    from pto_patch.cli import skill

    sys.stdout.write(skill.show_skill())


# --- entry point --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    as_json = "--json" in args
    try:
        code = lazy_app(app)(args=args, prog_name="pto-patch", standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        code = 130
    except click_exceptions.ClickException as exc:
        if as_json:
            print_json(
                {"error": exc.format_message(), "hint": "see pto-patch --help", "exit_code": exc.exit_code}
            )
        else:
            exc.show()
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:  # the one place that turns errors into messages
        code = report_error(exc, as_json=as_json)
    sys.exit(code if isinstance(code, int) else 0)
