"""`--save-outputs` / `--against-outputs`: a run's answers kept in a file, and read back on another device.

The file names the pages by their digest (pixels and truth), so answers are only ever scored against
the pages they were read from; it also records the device, dtype, versions, --output_length, the
checkpoint's weight files (names and sizes) and a digest of the weights themselves (`weights_digest`),
so a comparison of two devices says what it compares, and answers read from other weights are refused
unless `--other-weights` asks for a comparison of two checkpoints. Every field is checked on read: a
tampered or hand-edited file is refused naming the entry, never scored as given. It is written
atomically: a reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pto_patch.errors import EXIT_USAGE, PtoPatchError
from pto_patch.model import input_files
from pto_patch.patching.weights_digest import weights_digest
from pto_patch.run.ocr.pages import Page, load_json_text
from pto_patch.run.ocr.scoring import TASK_NAMES

KIND = "pto-patch-ocr-answers"
# 3: weights_digest is the full digest of every weight byte (patching.weights_digest); 2 held a sampled one,
# and a version 1 file none: either is read only with --other-weights.
FORMAT_VERSION = 3
READS = (1, 2, 3)
MODES = ("reference", "baseline", "pto")  # reference: the unpatched model, eager, free-running
MAX_ANSWERS_BYTES = 256 * 1024 * 1024  # ~1,000x the answers of the bundled pages


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
        keys = ("device", "dtype", "versions", "output_length", "model_path", "weights", "weights_digest")
        return {"file": str(self.path), "modes": self.modes, **{key: self.header.get(key) for key in keys}}


def weight_files(folder: Path) -> dict[str, int]:
    """The checkpoint's weight files and their sizes: the same checkpoint has the same ones."""
    return {path.name: path.stat().st_size for path in sorted(Path(folder).glob("*.safetensors"))}


def save_answers(path: Path, header: dict[str, Any], pages: list[Page], readings) -> bool:
    """The answers file; False where the write failed and it was kept in the cache (run/kept_results)."""
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
    return write_user_file(Path(path), data, "--save-outputs")


def _bad(
    path: Path, what: str, hint: str = "pass a file that `verify --ocr --save-outputs` wrote"
) -> PtoPatchError:
    return PtoPatchError(f"--against-outputs {path}: {what}", hint, exit_code=EXIT_USAGE)


def _answer(item: Any) -> tuple[tuple[str, str, str], SavedAnswer] | str:
    """One saved answer, or what is wrong with it."""
    if not isinstance(item, dict):
        return f"is a {type(item).__name__}, not an object"
    for key in ("page", "task", "mode", "answer"):
        if not isinstance(item.get(key), str):
            return f"has no {key} string"
    if item["task"] not in TASK_NAMES:
        return f"names a task {item['task']!r} (tasks: {', '.join(TASK_NAMES)})"
    if item["mode"] not in MODES:
        return f"names a mode {item['mode']!r} (modes: {', '.join(MODES)})"
    tokens = item.get("new_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        return f"has new_tokens {tokens!r}, not a count"
    if not isinstance(item.get("truncated"), bool):
        return f"has truncated {item.get('truncated')!r}, not true or false"
    key = (item["page"], item["task"], item["mode"])
    return key, SavedAnswer(item["answer"], tokens, item["truncated"])


def check_weights(saved: SavedRun, folder: Path, other_weights: bool) -> str | None:
    """Refuse answers saved from other weights than `folder`'s unless `other_weights`; then a warning."""
    recorded, here = saved.header.get("weights_digest"), weights_digest(folder)
    sampled = saved.header.get("format_version") == 2
    if recorded == here and recorded is not None and not sampled:
        return None
    if recorded is None:
        why = "it was saved without a weights digest (an older pto-patch)"
    elif sampled:
        why = (
            "its weights digest is a sample of the bytes (an older pto-patch), which other weights can match"
        )
    else:
        why = f"it was read with other weights (digest {str(recorded)[:12]}, here {str(here)[:12]})"
    if not other_weights:
        raise _bad(
            saved.path,
            why,
            "pass the checkpoint it was read with, or --other-weights to compare two checkpoints",
        )
    return f"--against-outputs {saved.path}: {why}; --other-weights: the comparison is of two checkpoints"


def load_answers(path: Path, pages: list[Page]) -> SavedRun:
    """A saved run's answers for exactly `pages`; anything else is a usage error, before any model load."""
    path = Path(path)
    try:
        document = load_json_text(input_files.read_bytes(path, MAX_ANSWERS_BYTES).decode("utf-8-sig"))
    except FileNotFoundError as exc:
        raise _bad(path, "no such file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad(path, f"cannot read it ({getattr(exc, 'strerror', None) or type(exc).__name__})") from exc
    except ValueError as exc:
        raise _bad(path, f"not JSON ({exc})") from exc
    if not isinstance(document, dict) or document.get("kind") != KIND:
        raise _bad(path, "not a file of saved OCR answers")
    if document.get("format_version") not in READS:
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
    listed = document.get("answers")
    if not isinstance(listed, list):
        raise _bad(path, "no list of answers")
    for index, item in enumerate(listed):
        parsed = _answer(item)
        if isinstance(parsed, str):
            raise _bad(path, f"answer {index} {parsed}")
        if parsed[0] in answers:
            raise _bad(
                path, f"answer {index} repeats page {parsed[0][0]}, task {parsed[0][1]}, {parsed[0][2]}"
            )
        answers[parsed[0]] = parsed[1]
    header = {k: v for k, v in document.items() if k not in ("pages", "answers")}
    run = SavedRun(path, header, answers, redrawn)
    if "baseline" not in run.modes:
        raise _bad(path, "it holds no baseline answers")
    for page in pages:
        for task in TASK_NAMES:
            if (page.name, task, "baseline") not in answers:
                raise _bad(path, f"no baseline answer for page {page.name}, task {task}")
    return run
