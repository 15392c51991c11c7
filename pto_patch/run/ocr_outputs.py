"""`--save-outputs` / `--against-outputs`: a run's answers kept in a file, and read back on another device.

The file names the pages by their digest (pixels and truth), so answers are only ever scored against
the pages they were read from; it also records the device, dtype, versions, --output_length and the
checkpoint's weight files (names and sizes), so a comparison of two devices says what it compares.
It is written atomically: a reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pto_patch.errors import EXIT_USAGE, PtoPatchError
from pto_patch.run.ocr_pages import Page
from pto_patch.run.ocr_scoring import TASK_NAMES

KIND = "pto-patch-ocr-answers"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class SavedAnswer:
    answer: str
    new_tokens: int
    truncated: bool


@dataclass
class SavedRun:
    """A trusted run's answers: (page, task, mode) -> answer, and what the run was."""

    path: Path
    header: dict[str, Any]
    answers: dict[tuple[str, str, str], SavedAnswer]
    redrawn: list[str]  # pages with the same truth whose pixels differ (another Pillow drew them)

    @property
    def modes(self) -> list[str]:
        return list(dict.fromkeys(mode for _, _, mode in self.answers))

    def describe(self) -> dict[str, Any]:
        keys = ("device", "dtype", "versions", "output_length", "model_path", "weights")
        return {"file": str(self.path), "modes": self.modes, **{key: self.header.get(key) for key in keys}}


def weight_files(folder: Path) -> dict[str, int]:
    """The checkpoint's weight files and their sizes: the same checkpoint has the same ones."""
    return {path.name: path.stat().st_size for path in sorted(Path(folder).glob("*.safetensors"))}


def save_answers(path: Path, header: dict[str, Any], pages: list[Page], readings) -> None:
    from pto_patch.run.user_files import write_user_file

    document = {
        "kind": KIND,
        "format_version": FORMAT_VERSION,
        **header,
        "pages": {page.name: {"digest": page.digest, "truth_digest": page.truth_digest} for page in pages},
        "answers": [
            {
                "page": r.page,
                "task": r.task,
                "mode": r.mode,
                "answer": r.answer,
                "new_tokens": r.new_tokens,
                "truncated": r.truncated,
            }
            for r in readings
        ],
    }
    data = (json.dumps(document, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
    write_user_file(Path(path), data, "--save-outputs")


def _bad(
    path: Path, what: str, hint: str = "pass a file that `verify --ocr --save-outputs` wrote"
) -> PtoPatchError:
    return PtoPatchError(f"--against-outputs {path}: {what}", hint, exit_code=EXIT_USAGE)


def load_answers(path: Path, pages: list[Page]) -> SavedRun:
    """A saved run's answers for exactly `pages`; anything else is a usage error, before any model load."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise _bad(path, "no such file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad(path, f"cannot read it ({getattr(exc, 'strerror', None) or type(exc).__name__})") from exc
    except json.JSONDecodeError as exc:
        raise _bad(path, f"not JSON ({exc.msg}, line {exc.lineno})") from exc
    if not isinstance(document, dict) or document.get("kind") != KIND:
        raise _bad(path, "not a file of saved OCR answers")
    if document.get("format_version") != FORMAT_VERSION:
        raise _bad(
            path, f"format version {document.get('format_version')!r}, this pto-patch reads {FORMAT_VERSION}"
        )
    saved_pages = document.get("pages")
    if not isinstance(saved_pages, dict):
        raise _bad(path, "no pages recorded")
    pages_hint = "pass the same --pages (or none, for the bundled pages) as the run that saved it"
    redrawn = []
    for page in pages:
        recorded = saved_pages.get(page.name)
        if not isinstance(recorded, dict):
            raise _bad(path, f"no answers for page {page.name}", pages_hint)
        if recorded.get("truth_digest") != page.truth_digest:
            raise _bad(
                path,
                f"page {page.name} has another truth than the one its answers were scored on",
                pages_hint,
            )
        if recorded.get("digest") != page.digest:
            redrawn.append(page.name)
    answers: dict[tuple[str, str, str], SavedAnswer] = {}
    for index, item in enumerate(document.get("answers") or []):
        try:
            key = (str(item["page"]), str(item["task"]), str(item["mode"]))
            answers[key] = SavedAnswer(str(item["answer"]), int(item["new_tokens"]), bool(item["truncated"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise _bad(path, f"answer {index} is malformed ({type(exc).__name__}: {exc})") from exc
    header = {k: v for k, v in document.items() if k not in ("pages", "answers")}
    run = SavedRun(path, header, answers, redrawn)
    if "baseline" not in run.modes:
        raise _bad(path, "it holds no baseline answers")
    for page in pages:
        for task in TASK_NAMES:
            if (page.name, task, "baseline") not in answers:
                raise _bad(path, f"no baseline answer for page {page.name}, task {task}")
    return run
