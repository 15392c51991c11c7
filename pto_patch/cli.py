"""The `pto-patch` command line: parse options, call one engine function, render its result.

No logic lives here. Heavy modules (torch, transformers) are imported inside the commands that
need them, so `--help`, `apply`, `restore` and `status` start fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from pto_patch import __version__
from pto_patch.console import print_json, report_error

try:  # recent typer releases vendor click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_exceptions

app = typer.Typer(
    name="pto-patch",
    help="Patch Qwen2.5-VL models (GutenOCR-3B) so RMSNorm, MRoPE and the SwiGLU MLP dispatch to "
    "fused PyPTO kernels; verify it, and restore every byte.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Shared option types, declared once.
ModelOpt = Annotated[str, typer.Option("--model", help="Model spec name (see templates/specs/).")]
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
    typer.Option("--ops", help="Comma-separated subset of rms_norm,mrope,swiglu_mlp (default: all)."),
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
    as_json: JsonOpt = False,
) -> None:
    """Rewrite the model folder's code so the chosen ops dispatch to pto_kernels."""
    from pto_patch import engine, render

    result = engine.apply_patch(model=model, model_path=model_path, ops=ops, dry_run=dry_run)
    render.apply_result(result, as_json=as_json)


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
    from pto_patch import engine, render

    result = engine.restore_model(model=model, model_path=model_path, force=force)
    render.restore_result(result, as_json=as_json)


@app.command()
def status(
    model: ModelOpt = "gutenocr_3b",
    model_path: ModelPathOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show whether the folder is patched, which ops, and which files drifted."""
    from pto_patch import engine, render

    result = engine.model_status(model=model, model_path=model_path)
    render.status_result(result, as_json=as_json)


@app.command("make-tiny")
def make_tiny(
    directory: Annotated[Path, typer.Argument(help="Folder to write the tiny model into.")],
    model: ModelOpt = "gutenocr_3b",
    full_width: Annotated[
        bool, typer.Option("--full-width", help="Use the real model's widths (hidden 2048, ...).")
    ] = False,
    layers: Annotated[int | None, typer.Option("--layers", help="Decoder layers.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed for the weights.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Write a random-weight model of the spec's architecture, offline (for tests and the demo)."""
    from pto_patch import render, tiny_model

    result = tiny_model.make_tiny(
        directory, model=model, full_width=full_width, layers=layers, seed=seed
    )
    render.make_tiny_result(result, as_json=as_json)


# --- download (owner: download work) -----------------------------------------------------------


# --- verify, bench, demo (owner: verify work) ----------------------------------------------------


# --- skill (owner: skill work) -------------------------------------------------------------------


# --- entry point --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    as_json = "--json" in args
    try:
        code = app(args=args, prog_name="pto-patch", standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        code = 130
    except click_exceptions.ClickException as exc:
        if as_json:
            print_json({"error": exc.format_message(), "hint": "see pto-patch --help", "exit_code": exc.exit_code})
        else:
            exc.show()
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:  # the one place that turns errors into messages
        code = report_error(exc, as_json=as_json)
    sys.exit(code if isinstance(code, int) else 0)
