"""The `pto-patch` app and the option types its commands share, declared once.

Each command lives in a module of its own under `pto_patch.cli.commands`, registered on `app` here;
`pto_patch.cli.app` imports them all and runs the app.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from pto_patch import __version__
from pto_patch.cli.values import PlainValuesGroup

app = typer.Typer(
    cls=PlainValuesGroup,
    name="pto-patch",
    help="Patch Qwen2.5-VL and Qwen3-VL models (GutenOCR-3B, Chandra) so RMSNorm, MRoPE and the SwiGLU MLP dispatch to "
    "fused PyPTO kernels; verify it, and restore every byte.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command's context inherits it
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
        "residual_rms_norm, mlp_block, attention_prologue, attention_core; or all. Default: apply patches in all; "
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


# Spellings mirror the reference run script (--use_pto, --output_length, ...); dashed forms work too.
# `--help` lists an option by its first spelling (cli/spellings.py), so the first is the one to document.
# verify, bench and tune name their parameters as the fields of their options dataclass (shared ones in
# run.options.RunOptions), so `as_options` hands them over without a list to keep in step.

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
WarmupOpt = Annotated[
    int,
    typer.Option("--warmup", help="Untimed warm-up runs (10 new tokens each) per mode; at least one runs."),
]
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
CacheOpt = Annotated[
    str,
    typer.Option(
        "--cache",
        help="KV cache of a compiled run: static (decode captured once per batch size), dynamic, or auto "
        "(static with --use_acl_graph or a capturing --mode).",
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

HubKernelsOpt = Annotated[
    bool,
    typer.Option(
        "--hub-kernels",
        "--hub_kernels",
        help="Load with Hugging Face hub kernels (use_kernels=True); off by default, so only the patch decides.",
    ),
]


def as_options(options_class: type, parameters: dict[str, Any]):
    """The options dataclass from a command's parameters, which bear its field names (all but --json)."""
    return options_class(**{name: value for name, value in parameters.items() if name != "as_json"})
