"""GutenOCR's reading tasks, and an answer scored against a page's truth.

CER and WER come from jiwer (rapidfuzz's edit distance underneath), on normalised text:
- TEXT: every run of whitespace is one space (the task asks for one linearised string, so where
  the lines break is not the model's error);
- TEXT2D: each row keeps its leading spaces (the layout is the point) and loses its trailing ones;
  blank rows at the ends go;
- LINES: the answer must parse as JSON lines with boxes; the lines' texts, sorted top to bottom
  then left to right as GutenOCR's evaluation sorts them, are joined by spaces and scored as TEXT
  against the truth's lines sorted the same way. Boxes match one to one, greedily by IoU, where the
  IoU is at least `IOU_THRESHOLD`; precision, recall and F1 count the matches.

An answer that does not parse scores as no lines at all: CER 1, F1 0.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from pto_patch.run.inputs import OCR_PROMPT
from pto_patch.run.ocr.pages import Line, Page, finite_box, load_json_text

IOU_THRESHOLD = 0.5  # the usual detection threshold, and GutenOCR's first one


@dataclass(frozen=True)
class Task:
    name: str
    prompt: str


# GutenOCR's prompts (its README and tasks.csv), with {image} as "the image".
TASKS = (
    Task("TEXT", OCR_PROMPT),
    Task("TEXT2D", "Return a layout-sensitive TEXT2D representation of the image."),
    Task(
        "LINES",
        "Extract coherent LINES from the image; respond with JSON objects containing 'text' and their "
        "[x1,y1,x2,y2] boxes.",
    ),
)
TASK_NAMES = tuple(task.name for task in TASKS)

_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n(.*?)\n?```\s*$", re.S)


@dataclass
class Score:
    """One answer against the truth; the box figures are None where the page has no truth boxes."""

    cer: float
    wer: float
    truth_chars: int
    answer_chars: int
    parsed: bool | None = None  # LINES only
    lines_found: int | None = None
    lines_truth: int | None = None
    box_precision: float | None = None
    box_recall: float | None = None
    box_f1: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {key: (round(v, 5) if isinstance(v, float) else v) for key, v in asdict(self).items()}


def normalise_text(text: str) -> str:
    return " ".join(text.split())


def normalise_text2d(text: str) -> str:
    rows = [row.rstrip() for row in text.replace("\r\n", "\n").split("\n")]
    while rows and not rows[0]:
        rows.pop(0)
    while rows and not rows[-1]:
        rows.pop()
    return "\n".join(rows)


def error_rates(truth: str, answer: str) -> tuple[float, float]:
    """(CER, WER) of `answer` against a non-empty `truth`; an empty answer is all deletions."""
    import jiwer

    if not answer.strip():
        return 1.0, 1.0
    return float(jiwer.cer(truth, answer)), float(jiwer.wer(truth, answer))


def _reading_order(lines: list[Line]) -> str:
    return " ".join(line.text for line in sorted(lines, key=lambda ln: (ln.bbox[1], ln.bbox[0])))


MAX_COORDINATE = 1e6  # pixels: past this no box lies on any page, and products of two overflow nothing


def _answer_items(text: str) -> Any:
    """The JSON in a LINES answer: one document, or one per row; None where it is none of these
    (including nesting too deep for the parser and integers too long to convert)."""
    try:
        return load_json_text(text)
    except ValueError:
        pass
    try:
        return [load_json_text(row) for row in text.splitlines() if row.strip()]
    except ValueError:
        return None


def parse_lines(answer: str) -> list[Line] | None:
    """The lines of a LINES answer, or None where it is not JSON lines with boxes.

    Takes a JSON list, one JSON object per row, or either inside a ``` fence; each line needs a
    `text` string and a `bbox` (or `box`) of four finite numbers within MAX_COORDINATE. Any other
    input, however deep, long or strange, gives None: it never raises.
    """
    text = answer.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    items = _answer_items(text)
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list) or not items:
        return None
    lines = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            return None
        box = finite_box(item.get("bbox", item.get("box")))
        if box is None or any(abs(v) > MAX_COORDINATE for v in box):
            return None
        x1, y1, x2, y2 = box
        lines.append(Line(item["text"], (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))))
    return lines


def iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    if width <= 0 or height <= 0:
        return 0.0
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def match_boxes(found: list[Line], truth: list[Line], threshold: float = IOU_THRESHOLD) -> int:
    """How many found boxes match a truth box one to one (greedy by IoU, at least `threshold`). Only the
    pairs that overlap enough are kept: a page of many boxes costs their count, never a list of every pair."""
    overlaps = ((iou(f.bbox, t.bbox), i, j) for i, f in enumerate(found) for j, t in enumerate(truth))
    pairs = sorted((pair for pair in overlaps if pair[0] >= threshold), reverse=True)
    used_found, used_truth, matched = set(), set(), 0
    for overlap, i, j in pairs:
        if overlap < threshold:
            break
        if i not in used_found and j not in used_truth:
            used_found.add(i)
            used_truth.add(j)
            matched += 1
    return matched


def score_answer(task: str, answer: str, page: Page) -> Score:
    if task == "TEXT":
        truth, hypothesis = normalise_text(page.text), normalise_text(answer)
    elif task == "TEXT2D":
        truth, hypothesis = normalise_text2d(page.text2d), normalise_text2d(answer)
    elif task == "LINES":
        return _score_lines(answer, page)
    else:
        raise ValueError(f"unknown OCR task {task}")
    cer, wer = error_rates(truth, hypothesis)
    return Score(cer=cer, wer=wer, truth_chars=len(truth), answer_chars=len(hypothesis))


def _score_lines(answer: str, page: Page) -> Score:
    found = parse_lines(answer)
    truth = normalise_text(_reading_order(page.lines)) if page.lines else normalise_text(page.text)
    hypothesis = normalise_text(_reading_order(found)) if found else ""
    cer, wer = error_rates(truth, hypothesis)
    score = Score(
        cer=cer,
        wer=wer,
        truth_chars=len(truth),
        answer_chars=len(hypothesis),
        parsed=found is not None,
        lines_found=len(found or []),
        lines_truth=len(page.lines) if page.lines else None,
    )
    if page.lines:
        matched = match_boxes(found or [], page.lines)
        precision = matched / len(found) if found else 0.0
        recall = matched / len(page.lines)
        score.box_precision, score.box_recall = precision, recall
        score.box_f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return score
