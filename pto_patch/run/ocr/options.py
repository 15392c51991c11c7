"""The --ocr options of verify and bench, taken out of a command's parameters and checked up front.

With --ocr a run reads pages (bundled or `--pages DIR`) with GutenOCR's tasks instead of one
prompt, so the options that pick a prompt or an image do not apply, and an answer needs room: the
default `--output_length` is a page's, not a chat reply's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pto_patch.errors import EXIT_USAGE, PtoPatchError, UsageError

# A bundled page's longest answer (LINES, JSON with a box per line) is about 1,000 tokens.
VERIFY_OUTPUT_LENGTH = 1024
# GutenOCR's evaluation gives a page 2,048 to 16,384 new tokens; bench times the shortest of those.
BENCH_OUTPUT_LENGTH = 2048


@dataclass(frozen=True)
class OcrOptions:
    ocr: bool = False
    pages: Path | None = None
    save_outputs: Path | None = None
    against_outputs: Path | None = None
    plot: Path | None = None
    other_weights: bool = False  # --against-outputs from other weights: a comparison of two checkpoints


def _usage(message: str, hint: str) -> PtoPatchError:
    return PtoPatchError(message, hint, exit_code=EXIT_USAGE)


def outside_pages(path: Path, flag: str, pages: Path) -> None:
    """The pages folder holds the run's pages and their truths: nothing is written there."""
    from pto_patch.run.user_files import outside_model_folder

    try:
        outside_model_folder(path, flag, pages)
    except UsageError as exc:
        raise UsageError(
            f"{flag} {path} lies in the --pages folder {Path(pages).resolve()}, whose files this run reads",
            f"write {flag} outside the pages folder",
        ) from exc


def _model_folder(parameters: dict[str, Any]) -> Path | None:
    """The model folder the run will read, where it can be named yet; else None (plan_run says why)."""
    from pto_patch.model.folder import resolve_model_folder
    from pto_patch.model.spec import load_spec

    try:
        return resolve_model_folder(
            parameters.get("model_path"), load_spec(parameters.get("model") or "gutenocr_3b")
        )
    except PtoPatchError:
        return None


def check_written_files(
    report_file: Path | None, options: OcrOptions, model_folder: Path | None = None
) -> None:
    """Every file a verify will write (--report-file, --save-outputs, --plot), checked with what it reads
    (run/user_files.check_target: the model folder, the saved answers, the pages), before anything loads."""
    from pto_patch.run.user_files import check_target, same_file

    inputs = {"--against-outputs": options.against_outputs}
    written = (
        ("--report-file", report_file),
        ("--save-outputs", options.save_outputs),
        ("--plot", options.plot),
    )
    for flag, path in written:
        if path is not None:
            if options.pages is not None:
                outside_pages(Path(path), flag, Path(options.pages))
            check_target(Path(path), flag, inputs, model_folder=model_folder)
    given = [(flag, Path(path)) for flag, path in written if path is not None]
    for index, (flag, path) in enumerate(given):
        for other_flag, other in given[index + 1 :]:
            if same_file(path, other):
                raise UsageError(
                    f"{flag} and {other_flag} name the same file {path}", f"write {other_flag} elsewhere"
                )


def split_ocr_options(
    parameters: dict[str, Any], *, plain_output_length: int, ocr_output_length: int
) -> OcrOptions:
    """Pop the --ocr options out of `parameters` (a command's locals) and fill in `output_length`.

    Rejects an --ocr option without --ocr, and under --ocr the options that choose another input.
    """
    names = [
        name
        for name in ("ocr", "pages", "save_outputs", "against_outputs", "plot", "other_weights")
        if name in parameters
    ]
    options = OcrOptions(**{name: parameters.pop(name) for name in names})
    flags = {"pages": "--pages", "save_outputs": "--save-outputs", "against_outputs": "--against-outputs"}
    flags["plot"] = "--plot"
    if options.other_weights and options.against_outputs is None:
        raise _usage("--other-weights only applies with --against-outputs", "drop --other-weights")
    if not options.ocr:
        given = [flag for name, flag in flags.items() if getattr(options, name) is not None]
        if given:
            raise _usage(f"{given[0]} only applies to a run over pages", f"add --ocr, or drop {given[0]}")
    else:
        conflicting = [
            flag
            for name, flag in (
                ("prompt", "--prompt"),
                ("image", "--image"),
                ("simple_prompt", "--simple_prompt"),
            )
            if parameters.get(name)
        ]
        if conflicting:
            raise _usage(
                f"--ocr reads pages with GutenOCR's own prompts; {conflicting[0]} does not apply",
                "pass your own pages with --pages DIR (NAME.png with NAME.txt)",
            )
        if options.plot is not None and Path(options.plot).suffix.lower() != ".png":
            raise _usage(f"--plot {options.plot} is not a .png file name", "pass a path ending in .png")
        if parameters.get("batch", 1) != 1:
            raise _usage(
                "verify --ocr reads one page at a time", "drop --batch (bench --ocr takes --batches)"
            )
        if parameters.get("engine", "transformers") != "transformers":
            raise _usage("--ocr runs on the transformers engine only", "drop --engine")
    # every file the run will write, for every verify path and bench --ocr, before anything loads
    check_written_files(parameters.get("report_file"), options, _model_folder(parameters))
    if parameters.get("output_length") is None:
        parameters["output_length"] = ocr_output_length if options.ocr else plain_output_length
    return options
