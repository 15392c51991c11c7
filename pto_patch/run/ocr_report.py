"""The results of `verify --ocr` and `bench --ocr`: data only (no torch), each its own JSON document."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from pto_patch.run.ocr_scoring import Score
from pto_patch.run.report import SCHEMA_VERSION, LoadInfo, OpReport, Verdict

RANDOM_WEIGHTS_NOTE = (
    "this model's weights are random (a make-tiny model): its scores against the truth mean nothing; "
    "only the mechanics and the PTO-vs-baseline comparison do"
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

    def modes(self) -> list[str]:
        return list(dict.fromkeys(reading.mode for reading in self.readings))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "command": "verify",
            "ocr": True,
            "passed": self.passed,
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
            "options": dict(self.options),
        }
