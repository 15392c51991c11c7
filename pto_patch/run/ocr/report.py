"""The results of `verify --ocr` and `bench --ocr`: data only (no torch), each its own JSON document."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from pto_patch.run.ocr.scoring import Score
from pto_patch.run.report import SCHEMA_VERSION, LoadInfo, OpReport, Verdict

RANDOM_WEIGHTS_NOTE = (
    "this model's weights are random (a make-tiny model): its scores against the truth mean nothing; "
    "only the mechanics and the step judgement against the unpatched model do"
)
TRUTH_NOTE = "scores against the truth mean something only for a trained checkpoint (GutenOCR-3B, ...)"


def _round(value: float | None, digits: int = 5) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class Reading:
    """One answer: a page read with one task in one mode (`trusted`: from --against-outputs)."""

    page: str
    task: str
    mode: str
    answer: str
    new_tokens: int
    truncated: bool  # it stopped at --output_length, not at the end of its answer
    score: Score
    seconds: float | None = None
    judged: Any = None  # run.judging.RunJudgement: this reading's steps against the reference's

    def to_json(self) -> dict[str, Any]:
        return {
            "page": self.page,
            "task": self.task,
            "mode": self.mode,
            **self.score.to_json(),
            "new_tokens": self.new_tokens,
            "truncated": self.truncated,
            "seconds": _round(self.seconds, 3),
            "answer": self.answer,
            "judged": None if self.judged is None else self.judged.to_json(),
        }


@dataclass
class Comparison:
    """One (page, task): a reading against a reference reading of it (PTO against the baseline, or
    this run against a trusted device's)."""

    page: str
    task: str
    reference: str  # the reference's mode, e.g. baseline or trusted baseline
    candidate: str
    reference_cer: float
    candidate_cer: float
    agreement_cer: float  # the candidate's answer scored against the reference's answer
    reference_f1: float | None = None
    candidate_f1: float | None = None

    @property
    def cer_rise(self) -> float:
        return self.candidate_cer - self.reference_cer

    def to_json(self) -> dict[str, Any]:
        return {
            "page": self.page,
            "task": self.task,
            "reference": self.reference,
            "candidate": self.candidate,
            "reference_cer": _round(self.reference_cer),
            "candidate_cer": _round(self.candidate_cer),
            "cer_rise": _round(self.cer_rise),
            "agreement_cer": _round(self.agreement_cer),
            "reference_box_f1": _round(self.reference_f1),
            "candidate_box_f1": _round(self.candidate_f1),
        }


def mode_summary(readings: list[Reading]) -> dict[str, Any]:
    """Means over a mode's readings: CER and WER per task and overall, LINES parsed, box F1."""
    by_task: dict[str, list[Reading]] = {}
    for reading in readings:
        by_task.setdefault(reading.task, []).append(reading)
    lines = by_task.get("LINES", [])
    f1s = [r.score.box_f1 for r in lines if r.score.box_f1 is not None]
    return {
        "readings": len(readings),
        "mean_cer": _round(statistics.fmean(r.score.cer for r in readings)) if readings else None,
        "mean_wer": _round(statistics.fmean(r.score.wer for r in readings)) if readings else None,
        "cer_by_task": {
            task: _round(statistics.fmean(r.score.cer for r in rows)) for task, rows in by_task.items()
        },
        "lines_parsed": sum(1 for r in lines if r.score.parsed),
        "lines_answers": len(lines),
        "mean_box_f1": _round(statistics.fmean(f1s)) if f1s else None,
        "truncated": sum(1 for r in readings if r.truncated),
    }


@dataclass
class OcrVerifyReport(Verdict):
    model_path: str
    device: str
    device_reason: str
    dtype: str
    versions: dict[str, str]
    load_info: LoadInfo
    pages: list[dict[str, Any]]
    tasks: dict[str, str]
    output_length: int
    margins: dict[str, Any]
    readings: list[Reading] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    random_weights: bool = False
    switched_on: list[str] = field(default_factory=list)
    kernel_backend: str | None = None
    ops: dict[str, OpReport] = field(default_factory=dict)
    saved_outputs: str | None = None
    against_outputs: dict[str, Any] | None = None  # the trusted run's device, dtype, versions, file
    options: dict[str, Any] = field(default_factory=dict)
    compared: bool = False  # baseline and PTO both read the pages and were compared (not --baseline-only)
    mode: str | None = (
        None  # what the two judged runs share: eager, torch.compile (X), graph decode, ACL graph
    )
    rule: str | None = None  # the step rule in words
    reference: dict[str, Any] | None = None  # what the reference was, its load and generation seconds
    compilation: dict[str, Any] | None = None

    def modes(self) -> list[str]:
        return list(dict.fromkeys(reading.mode for reading in self.readings))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "command": "verify",
            "ocr": True,
            "passed": self.stated_verdict,
            "compared": self.compared,
            "mode": self.mode,
            "rule": self.rule,
            "reference": self.reference,
            "failures": list(self.failures),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "random_weights": self.random_weights,
            "model_path": self.model_path,
            "device": self.device,
            "device_reason": self.device_reason,
            "dtype": self.dtype,
            "versions": dict(self.versions),
            "load_info": self.load_info.to_json(),
            "pages": list(self.pages),
            "tasks": dict(self.tasks),
            "output_length": self.output_length,
            "margins": dict(self.margins),
            "summary": {
                mode: mode_summary([r for r in self.readings if r.mode == mode]) for mode in self.modes()
            },
            "readings": [reading.to_json() for reading in self.readings],
            "comparisons": [comparison.to_json() for comparison in self.comparisons],
            "switched_on": list(self.switched_on),
            "kernel_backend": self.kernel_backend,
            "ops": {op: report.to_json() for op, report in self.ops.items()},
            "saved_outputs": self.saved_outputs,
            "against_outputs": self.against_outputs,
            "compilation": self.compilation,
            "options": dict(self.options),
        }


# --- bench --ocr ----------------------------------------------------------------------------------

PAGE_TIME_NOTE = (
    "vision: the vision encoder's forward; prefill: the rest of the way to the first token; decode: "
    "every further token. The three add up to the page's latency (the image processor's time, "
    "preprocess_s, comes before and is not in it)"
)


@dataclass
class PageRun:
    """One page at one batch size in one mode: medians over the timed runs."""

    page: str
    batch: int
    mode: str
    image_tokens: int
    prompt_tokens: int
    new_tokens: int  # per sequence
    vision_s: float | None
    prefill_s: float | None
    first_token_s: float | None
    decode_s: float | None
    latency_s: float
    preprocess_s: float
    latencies_s: list[float] = field(default_factory=list)

    @property
    def decode_tokens_per_s(self) -> float | None:
        if not self.decode_s or self.new_tokens < 2:
            return None
        return self.batch * (self.new_tokens - 1) / self.decode_s

    @property
    def pages_per_minute(self) -> float | None:
        return 60 * self.batch / self.latency_s if self.latency_s else None

    def split(self) -> dict[str, float] | None:
        """Each part's share of the latency: vision, prefill, decode."""
        parts = (self.vision_s, self.prefill_s, self.decode_s)
        if any(part is None for part in parts) or not self.latency_s:
            return None
        return {
            name: part / self.latency_s
            for name, part in zip(("vision", "prefill", "decode"), parts, strict=True)
        }

    def to_json(self) -> dict[str, Any]:
        split = self.split()
        return {
            "page": self.page,
            "batch": self.batch,
            "mode": self.mode,
            "image_tokens": self.image_tokens,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens_per_sequence": self.new_tokens,
            "vision_s": _round(self.vision_s),
            "prefill_s": _round(self.prefill_s),
            "first_token_s": _round(self.first_token_s),
            "decode_s": _round(self.decode_s),
            "decode_tokens_per_s": _round(self.decode_tokens_per_s, 3),
            "latency_s": _round(self.latency_s),
            "pages_per_minute": _round(self.pages_per_minute, 3),
            "preprocess_s": _round(self.preprocess_s),
            "split": None if split is None else {key: round(value, 5) for key, value in split.items()},
            "latencies_s": [round(x, 5) for x in self.latencies_s],
        }


@dataclass
class PageBenchResult(Verdict):
    model_path: str
    device: str
    dtype: str
    versions: dict[str, str]
    load_info: LoadInfo
    task: str
    prompt: str
    output_length: int
    pages: list[dict[str, Any]]
    runs: list[PageRun] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    random_weights: bool = False
    switched_on: list[str] = field(default_factory=list)
    kernel_backend: str | None = None
    ops: dict[str, OpReport] = field(default_factory=dict)
    plot: str | None = None
    files: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    compilation: dict[str, Any] | None = (
        None  # with --use_compile or --use_acl_graph: what compiled, per mode
    )

    def pairs(self) -> list[tuple[PageRun, PageRun]]:
        """(baseline, pto) per page and batch size, in run order."""
        runs = {(r.page, r.batch, r.mode): r for r in self.runs}
        return [
            (base, runs[(page, batch, "pto")])
            for (page, batch, mode), base in runs.items()
            if mode == "baseline" and (page, batch, "pto") in runs
        ]

    def speed(self, base: PageRun, pto: PageRun):
        """One page's speed per timed round with its noise band (no ratio where nothing was switched on)."""
        from pto_patch.run.noise import speed_band

        return speed_band(base.latencies_s, pto.latencies_s, bool(self.switched_on))

    def ratios(self) -> list[dict[str, Any]]:
        """PTO over baseline per (page, batch): latency, first token, decode tokens/s, and the page's
        speed per timed round with its noise band."""
        rows = []
        for base, pto in self.pairs():
            row: dict[str, Any] = {"page": base.page, "batch": base.batch}
            for key in ("latency_s", "first_token_s", "vision_s", "decode_tokens_per_s"):
                a, b = getattr(base, key), getattr(pto, key)
                row[key] = round(b / a, 4) if a and b is not None else None
            row["speed"] = self.speed(base, pto).to_json()
            rows.append(row)
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "command": "bench",
            "ocr": True,
            "passed": self.passed,
            "failures": list(self.failures),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "random_weights": self.random_weights,
            "model_path": self.model_path,
            "device": self.device,
            "dtype": self.dtype,
            "versions": dict(self.versions),
            "load_info": self.load_info.to_json(),
            "task": self.task,
            "prompt": self.prompt,
            "output_length": self.output_length,
            "pages": list(self.pages),
            "runs": [run.to_json() for run in self.runs],
            "pto_over_baseline": self.ratios(),
            "switched_on": list(self.switched_on),
            "kernel_backend": self.kernel_backend,
            "ops": {op: report.to_json() for op, report in self.ops.items()},
            "plot": self.plot,
            "files": list(self.files),
            "compilation": self.compilation,
            "options": dict(self.options),
        }
