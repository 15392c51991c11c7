"""Every command's JSON document, with the one schema version; the results of verify, bench and demo.

verify, bench and demo return the report types below; apply, restore, status, make-tiny, download
and skill install return their engine's result, shaped here by `json_document`. The renderer prints
a result as text or as exactly one JSON document. Nothing here imports torch: a report is data.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pto_patch.errors import EXIT_OK, EXIT_VERIFY_FAILED

if TYPE_CHECKING:
    from pto_patch.run.graph.compiling import Compilation
    from pto_patch.run.noise import Band

SCHEMA_VERSION = 1
DEMO_TIMING_NOTE = (
    "the tiny model's timing is indicative only and says nothing about GutenOCR-3B's speed; "
    "for that, run `pto-patch bench` on a `pto-patch make-tiny --full-width` model or the real one"
)


def _jsonable(value: Any) -> Any:
    if is_dataclass(value):
        return _jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def document(command: str, result: Any, **extra: Any) -> dict[str, Any]:
    """A versioned JSON document for one command's result (a dataclass or a dict)."""
    return {"schema_version": SCHEMA_VERSION, "command": command, **_jsonable(result), **extra}


def _files(result) -> list[dict[str, str]]:
    return [{"path": path, "action": action} for path, action in result.files]


# Result type name -> (command, its JSON body): the engine's results, named so this imports no engine.
_DOCUMENTS: dict[str, tuple[str, Any]] = {
    "ApplyResult": ("apply", lambda result: {**_jsonable(result), "files": _files(result)}),
    "RestoreResult": ("restore", _jsonable),
    "ModelsResult": ("models", lambda result: result.to_json()),
    "StatusResult": (
        "status",
        lambda result: {**_jsonable(result), "files": _files(result), "needs_reapply": result.needs_reapply},
    ),
    "TinyModelResult": ("make-tiny", lambda result: result.to_json()),
    "DownloadResult": ("download", lambda result: result.to_json()),
    "SkillInstallResult": ("skill install", lambda result: result.to_json()),
}


def json_document(result: Any) -> dict[str, Any]:
    """The one JSON document a command prints for `result` under --json."""
    shape = _DOCUMENTS.get(type(result).__name__)
    if shape is None:  # verify, bench and demo: their report is the document
        return result.to_json()
    command, body = shape
    return document(command, body(result))


def report_bytes(document: dict[str, Any]) -> bytes:
    return (json.dumps(document, indent=2, ensure_ascii=False, default=str) + "\n").encode("utf-8")


def write_report(document: dict[str, Any], path: Path, flag: str = "--report-file") -> bool:
    """The JSON report, in one rename (run/user_files): never half a file, never through a device node.
    False where the write failed and the report was kept in pto-patch's cache instead (run/kept_results)."""
    from pto_patch.run.user_files import write_user_file

    return write_user_file(Path(path), report_bytes(document), flag)


def ratio_of(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None where either is missing or the denominator is 0."""
    return numerator / denominator if numerator is not None and denominator else None


# --- the parts ------------------------------------------------------------------------------------


@dataclass
class ModeMetrics:
    """One mode's timing over the timed runs (after warm-up)."""

    load_s: float
    latency_s: float
    tokens: int  # new tokens per timed run, all sequences of the batch together
    tokens_per_s: float
    peak_memory_mb: float
    batch: int
    new_tokens_per_sequence: int
    latencies_s: list[float] = field(default_factory=list)
    prefill_s: float | None = None  # prompt in, first new token out
    decode_step_s: float | None = None  # each further token

    @property
    def latency_median_s(self) -> float:
        import statistics  # its import costs more than the quick commands' whole work

        return statistics.median(self.latencies_s) if self.latencies_s else self.latency_s

    @property
    def tokens_per_s_median(self) -> float:
        return self.tokens / self.latency_median_s if self.latency_median_s else 0.0

    @property
    def decode_step_ms(self) -> float | None:
        return None if self.decode_step_s is None else self.decode_step_s * 1000

    def to_json(self) -> dict[str, Any]:
        return {
            "prefill_s": None if self.prefill_s is None else round(self.prefill_s, 5),
            "decode_step_ms": None if self.decode_step_ms is None else round(self.decode_step_ms, 4),
            "load_s": round(self.load_s, 4),
            "latency_s": round(self.latency_s, 5),
            "tokens": self.tokens,
            "tokens_per_s": round(self.tokens_per_s, 3),
            "peak_memory_mb": round(self.peak_memory_mb, 1),
            "batch": self.batch,
            "new_tokens_per_sequence": self.new_tokens_per_sequence,
            "latencies_s": [round(x, 5) for x in self.latencies_s],
            "latency_median_s": round(self.latency_median_s, 5),
            "tokens_per_s_median": round(self.tokens_per_s_median, 3),
        }


@dataclass
class OpReport:
    switched_on: bool
    backend: str | None
    calls: int
    fallbacks: int
    backends: dict[str, int] = field(default_factory=dict)
    first_fallback_error: str | None = None
    captured: int = 0  # calls made while a device graph was captured (ACL graph, CUDA graph)
    replays: int = 0  # replays of such a graph, where they were counted
    cache_writes: int = 0  # calls that also wrote the static KV cache (the attention prologue's)
    inside: str | None = None  # the block that ran this op's work while its own guard was not reached
    calls_per_layer: float | None = None  # a decoder-layer block's calls / the model's decoder layers
    compile_s: float | None = None  # seconds in pypto's compiles of its kernels, apart from the runs

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class OtherPatcher:
    """Something besides the injected guard that decides what runs for an op: one module instance
    whose forward was swapped, a swapped module-level function, or a note (`op` None)."""

    op: str | None
    module: str  # the module's path in the model, or `<remote module>.<function>`; "" for the model
    how: str
    bypasses: bool  # the guard is not reached there, so the PTO kernel never runs there

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Accuracy:
    max_abs_logit_diff: float
    max_rel_logit_diff: float  # max |pto - base| over max |base|
    token_match_rate: float
    text_equal: bool
    passed: bool
    atol: float
    rtol: float
    logits_within_tolerance: bool
    baseline_text: str  # the mode's baseline's own greedy choices, fed the reference's tokens
    pto_text: str  # the PTO run's own greedy choices, fed the reference's tokens
    reference_text: str = ""  # what the unpatched eager model generated
    worst_step: int | None = None  # the PTO run's worst step (0: the prefill's)
    steps_judged: int = 0  # steps x sequences of the PTO run judged against the reference
    first_choice_divergence: int | None = None  # the first step whose greedy choice is not the reference's

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("max_abs_logit_diff", "max_rel_logit_diff", "token_match_rate"):
            value = data[key]
            # JSON has no NaN or infinity: a non-finite difference is said as a string
            data[key] = "nan" if value != value else ("inf" if value == float("inf") else round(value, 8))
        return data


@dataclass
class LoadInfo:
    missing_keys: list[str]
    unexpected_keys: list[str]
    mismatched_keys: list[str]
    lm_head_tied: bool | None  # None when the config does not tie it
    hub_kernels: str | None = None  # how the load treated Hugging Face hub kernels (run/hub_kernels.py)

    @property
    def ok(self) -> bool:
        return (
            not self.missing_keys
            and not self.unexpected_keys
            and not self.mismatched_keys
            and (self.lm_head_tied is not False)
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Verdict:
    """A report passes when it lists no `failures`; its exit code follows (verify's and bench's)."""

    failures: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_VERIFY_FAILED

    @property
    def stated_verdict(self) -> bool | None:
        """`passed` as the JSON states it: None (no verdict) for a run that compared nothing and failed
        nothing (verify --baseline-only)."""
        return self.passed if getattr(self, "compared", True) or not self.passed else None


# --- verify ---------------------------------------------------------------------------------------


@dataclass
class VerifyReport(Verdict):
    model_path: str
    device: str
    device_reason: str
    dtype: str
    versions: dict[str, str]
    input: dict[str, Any]
    load_info: LoadInfo
    baseline: ModeMetrics
    pto: ModeMetrics | None = None
    ops: dict[str, OpReport] = field(default_factory=dict)
    accuracy: Accuracy | None = None
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    patched_ops: list[str] = field(default_factory=list)
    switched_on: list[str] = field(default_factory=list)
    kernel_backend: str | None = None
    dynamic_config: list[dict[str, Any]] | None = None
    dynamic_config_source: dict[str, Any] | None = None  # with --use_dynamic_config: tuning or table, why
    pto_kernels_path: str | None = None
    modified_files: list[str] = field(default_factory=list)
    allow_modified: bool = False
    rope_fixes: list[str] = field(default_factory=list)
    compile: str | None = None
    compilation: Compilation | None = None  # what the compiler did per mode, when compiled
    peak_memory_source: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    report_file: str | None = None
    other_patchers: list[OtherPatcher] = field(default_factory=list)
    mode: str | None = None  # the mode both compared runs ran in: eager, torch.compile, graph decode ...
    rule: str | None = None  # the verdict's rule, in words
    reference: dict[str, Any] | None = None  # the unpatched eager run every compared run is judged against
    judged: dict[str, Any] = field(default_factory=dict)  # run -> judging.RunJudgement
    random_weights: bool = False  # a make-tiny model: its timing is indicative of its widths only

    @property
    def compared(self) -> bool:
        """Whether a PTO run was compared with the baseline (a --baseline-only run compares nothing)."""
        return self.pto is not None

    def speed(self) -> Band | None:
        """PTO's speed over the baseline's per timed round, with its noise band (None: nothing compared)."""
        from pto_patch.run.noise import speed_band  # the quick commands' JSON imports this module

        if self.pto is None:
            return None
        return speed_band(self.baseline.latencies_s, self.pto.latencies_s, bool(self.switched_on))

    def ratios(self) -> dict[str, float | None]:
        if self.pto is None:
            return {}
        return {
            "latency_s": ratio_of(self.pto.latency_s, self.baseline.latency_s),
            "tokens_per_s": ratio_of(self.pto.tokens_per_s, self.baseline.tokens_per_s),
            "peak_memory_mb": ratio_of(self.pto.peak_memory_mb, self.baseline.peak_memory_mb),
            "load_s": ratio_of(self.pto.load_s, self.baseline.load_s),
        }

    def to_json(self) -> dict[str, Any]:
        pto = None
        if self.pto is not None:
            pto = self.pto.to_json()
            pto["ops"] = {op: report.to_json() for op, report in self.ops.items()}
        return {
            "schema_version": SCHEMA_VERSION,
            "command": "verify",
            "passed": self.stated_verdict,
            "compared": self.compared,
            "failures": list(self.failures),
            "warnings": list(self.warnings),
            "model_path": self.model_path,
            "device": self.device,
            "device_reason": self.device_reason,
            "dtype": self.dtype,
            "versions": dict(self.versions),
            "input": dict(self.input),
            "load_info": self.load_info.to_json(),
            "baseline": self.baseline.to_json(),
            "pto": pto,
            "ratios": {key: (None if v is None else round(v, 4)) for key, v in self.ratios().items()},
            "speed": None if self.pto is None else self.speed().to_json(),
            "accuracy": None if self.accuracy is None else self.accuracy.to_json(),
            "mode": self.mode,
            "rule": self.rule,
            "reference": self.reference,
            "judged": {run: judgement.to_json() for run, judgement in self.judged.items()},
            "random_weights": self.random_weights,
            "patched_ops": list(self.patched_ops),
            "switched_on": list(self.switched_on),
            "kernel_backend": self.kernel_backend,
            "dynamic_config": self.dynamic_config,
            "dynamic_config_source": self.dynamic_config_source,
            "pto_kernels_path": self.pto_kernels_path,
            "allow_modified": self.allow_modified,
            "modified_files": list(self.modified_files),
            "rope_fixes": list(self.rope_fixes),
            "other_patchers": [patcher.to_json() for patcher in self.other_patchers],
            "compile": self.compile,
            "compilation": None if self.compilation is None else self.compilation.to_json(),
            "peak_memory_source": self.peak_memory_source,
            "load_note": "the model is loaded once; both modes share that load time",
            "options": dict(self.options),
            "report_file": self.report_file,
        }


# --- bench ----------------------------------------------------------------------------------------


@dataclass
class ModeRun:
    metrics: ModeMetrics
    ops: dict[str, OpReport] | None = None

    def bandwidth_fraction(self, floor_s: float | None) -> float | None:
        """The bandwidth floor over the decode step (timed token by token inside the timed runs)."""
        step = self.metrics.decode_step_s
        return floor_s / step if floor_s and step else None

    def to_json(self, floor_s: float | None) -> dict[str, Any]:
        data = self.metrics.to_json()
        fraction = self.bandwidth_fraction(floor_s)
        data["bandwidth_fraction"] = None if fraction is None else round(fraction, 6)
        if self.ops is not None:
            data["ops"] = {op: report.to_json() for op, report in self.ops.items()}
        return data


@dataclass
class BatchRun:
    batch: int
    baseline: ModeRun
    pto: ModeRun
    switched_on: tuple[str, ...]
    dynamic_config: list[dict[str, Any]] | None

    def speed(self) -> Band:
        """PTO's speed over the baseline's per timed round, with its noise band."""
        from pto_patch.run.noise import speed_band  # the quick commands' JSON imports this module

        return speed_band(
            self.baseline.metrics.latencies_s, self.pto.metrics.latencies_s, bool(self.switched_on)
        )


@dataclass
class BenchResult(Verdict):
    model_path: str
    device: str
    dtype: str
    versions: dict[str, str]
    input: dict[str, Any]
    load_info: LoadInfo
    weight_bytes_per_token: int
    copy_bandwidth_bytes_s: float
    peak_memory_source: str
    runs: list[BatchRun] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    kernel_backend: str = "auto"
    dynamic_config_source: dict[str, Any] | None = None  # with --use_dynamic_config: tuning or table, why
    options: dict[str, Any] = field(default_factory=dict)
    other_patchers: list[OtherPatcher] = field(default_factory=list)
    random_weights: bool = False  # a make-tiny model: its timing is indicative of its widths only
    compile: str | None = None
    compilation: Compilation | None = None

    @property
    def floor_s(self) -> float:
        return self.weight_bytes_per_token / self.copy_bandwidth_bytes_s

    def _header(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "model_path": self.model_path,
            "device": self.device,
            "dtype": self.dtype,
            "versions": dict(self.versions),
            "input": dict(self.input),
            "load_info": self.load_info.to_json(),
            "other_patchers": [patcher.to_json() for patcher in self.other_patchers],
            "random_weights": self.random_weights,
            "bandwidth": {
                "weight_bytes_per_token": self.weight_bytes_per_token,
                "copy_bandwidth_gb_s": round(self.copy_bandwidth_bytes_s / 1e9, 3),
                "floor_ms": round(self.floor_s * 1000, 4),
                "note": "floor = weight bytes one decode step reads / measured copy bandwidth (read + write)",
            },
            "peak_memory_source": self.peak_memory_source,
            "compile": self.compile,
            "compilation": None if self.compilation is None else self.compilation.to_json(),
        }

    def mode_document(self, mode: str) -> dict[str, Any]:
        """bench_baseline.json / bench_pypto.json: the verify report's per-mode keys, one entry per batch."""
        runs = []
        for run in self.runs:
            entry = {"batch": run.batch}
            entry.update((run.baseline if mode == "baseline" else run.pto).to_json(self.floor_s))
            if mode != "baseline":
                entry["switched_on"] = list(run.switched_on)
            runs.append(entry)
        doc = self._header()
        doc.update(mode=mode, kernel_backend=None if mode == "baseline" else self.kernel_backend, runs=runs)
        return doc

    def to_json(self) -> dict[str, Any]:
        doc = {"schema_version": SCHEMA_VERSION, "command": "bench", "passed": self.passed}
        doc.update(self._header())
        runs = []
        for run in self.runs:
            base, pto = run.baseline.to_json(self.floor_s), run.pto.to_json(self.floor_s)
            diff = {}
            for key in ("latency_s", "tokens_per_s", "peak_memory_mb", "decode_step_ms"):
                if base.get(key) and pto.get(key) is not None:
                    diff[key] = round((pto[key] - base[key]) / base[key] * 100, 2)
            runs.append(
                {
                    "batch": run.batch,
                    "baseline": base,
                    "pto": pto,
                    "pto_vs_baseline_pct": diff,
                    "speed": run.speed().to_json(),
                    "switched_on": list(run.switched_on),
                    "dynamic_config": run.dynamic_config,
                }
            )
        doc.update(
            runs=runs,
            failures=list(self.failures),
            warnings=list(self.warnings),
            files=list(self.files),
            kernel_backend=self.kernel_backend,
            dynamic_config_source=self.dynamic_config_source,
            options=dict(self.options),
        )
        return doc


# --- demo -----------------------------------------------------------------------------------------


@dataclass
class DemoResult:
    directory: str
    kept: bool
    seconds: float
    steps: list[tuple[str, float]]
    files_compared: int
    hash_differences: list[str]
    verify: VerifyReport | None = None
    modules_cache: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def hashes_identical(self) -> bool:
        return self.files_compared > 0 and not self.hash_differences

    @property
    def passed(self) -> bool:
        return self.hashes_identical and self.verify is not None and self.verify.passed

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_VERIFY_FAILED

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "command": "demo",
            "passed": self.passed,
            "directory": self.directory,
            "kept": self.kept,
            "seconds": round(self.seconds, 2),
            "steps": [{"step": name, "seconds": round(seconds, 3)} for name, seconds in self.steps],
            "hashes_identical": self.hashes_identical,
            "files_compared": self.files_compared,
            "hash_differences": list(self.hash_differences),
            "verify": None if self.verify is None else self.verify.to_json(),
            "modules_cache": self.modules_cache,
            "notes": list(self.notes),
            "timing_note": DEMO_TIMING_NOTE,
        }


# --- tune -----------------------------------------------------------------------------------------


@dataclass
class TuneResult(Verdict):
    """What tune measured and chose per batch; `batches` are the tuning file's entries."""

    model_path: str
    device: str
    dtype: str
    versions: dict[str, str]
    budget_s: float
    load_s: float
    duration_s: float = 0.0
    input: dict[str, Any] = field(default_factory=dict)
    probes: list[dict[str, Any]] = field(default_factory=list)
    batches: list[dict[str, Any]] = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=dict)
    tuning_file: str | None = None
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    compilation: dict[str, Any] | None = None  # a compiled tune: per candidate what the compiler did

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "command": "tune",
            "passed": self.passed,
            "failures": list(self.failures),
            "warnings": list(self.warnings),
            "model_path": self.model_path,
            "device": self.device,
            "device_name": (self.header.get("device") or {}).get("name"),
            "dtype": self.dtype,
            "versions": dict(self.versions),
            "input": dict(self.input),
            "budget_s": self.budget_s,
            "duration_s": round(self.duration_s, 1),
            "within_budget": self.duration_s <= self.budget_s,
            "load_s": round(self.load_s, 3),
            "probes": list(self.probes),
            "batches": list(self.batches),
            "tuning_file": self.tuning_file,
            "options": dict(self.options),
            "compilation": self.compilation,
        }
