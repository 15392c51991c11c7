"""`pto-patch bench`: the reference's bench script as a command, baseline then PTO per batch size.

For each batch size it measures both modes on one loaded model: warm-up, then timed runs of
`--output_length` new tokens, the two modes alternating so that a shared machine's load hits both
alike. It writes `bench_baseline.json` and `bench_pypto.json` with the verify report's per-mode
keys, and relates the decode step to a memory-bandwidth floor: the weight bytes a decode step must
read, over a copy bandwidth measured in the same run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pto_patch import verify
from pto_patch.errors import EXIT_USAGE, PtoPatchError

BASELINE_FILE = "bench_baseline.json"
PTO_FILE = "bench_pypto.json"
COPY_BYTES = 256 * 2**20  # well past any cache, small next to the model
COPY_REPEATS = 5


@dataclass(frozen=True)
class BenchOptions(verify.RunOptions):
    output_length: int = 100
    batches: str = "1,4,8"
    output_dir: Path = Path(".")


def parse_batches(text: str) -> tuple[int, ...]:
    try:
        batches = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        batches = ()
    if not batches or any(batch < 1 for batch in batches):
        raise PtoPatchError(
            f"--batches '{text}' is not a list of batch sizes",
            "pass comma-separated positive integers, e.g. --batches 1,4,8",
            exit_code=EXIT_USAGE,
        )
    return batches


# --- the bandwidth floor --------------------------------------------------------------------------


def decode_weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: the text decoder and lm_head.

    The vision tower does not run at decode; the input embedding reads one row per token, except
    when it is tied to lm_head, which reads it whole.
    """
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    lm_head = output.weight if output is not None else None
    total = 0
    for name, parameter in model.named_parameters():  # tied parameters come once
        if ".visual." in f".{name}.":
            continue
        if parameter is embedding and parameter is not lm_head:
            continue
        total += parameter.numel() * parameter.element_size()
    return total


def measure_copy_bandwidth(device: verify.DeviceChoice, nbytes: int = COPY_BYTES) -> float:
    """Bytes moved per second (read + write) by a device-to-same-device copy, median of a few."""
    import torch

    source = torch.ones(nbytes, dtype=torch.uint8, device=device.name)
    target = torch.zeros_like(source)
    target.copy_(source)
    times = []
    for _ in range(COPY_REPEATS):
        verify.synchronize(device)
        started = time.perf_counter()
        target.copy_(source)
        verify.synchronize(device)
        times.append(time.perf_counter() - started)
    del source, target
    return 2 * nbytes / statistics.median(times)


# --- results --------------------------------------------------------------------------------------


@dataclass
class ModeRun:
    metrics: verify.ModeMetrics
    ops: dict[str, verify.OpReport] | None = None

    def to_json(self, floor_s: float | None) -> dict[str, Any]:
        data = self.metrics.to_json()
        step = self.metrics.decode_step_s  # timed token by token inside the timed runs
        data["bandwidth_fraction"] = round(floor_s / step, 6) if floor_s and step else None
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


@dataclass
class BenchResult(verify.Checked):
    model_path: str
    device: str
    dtype: str
    versions: dict[str, str]
    input: dict[str, Any]
    load_info: verify.LoadInfo
    weight_bytes_per_token: int
    copy_bandwidth_bytes_s: float
    peak_memory_source: str
    runs: list[BatchRun] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    kernel_backend: str = "auto"
    options: dict[str, Any] = field(default_factory=dict)
    other_patchers: list[verify.OtherPatcher] = field(default_factory=list)

    @property
    def floor_s(self) -> float:
        return self.weight_bytes_per_token / self.copy_bandwidth_bytes_s

    def _header(self) -> dict[str, Any]:
        return {
            "schema_version": verify.SCHEMA_VERSION,
            "model_path": self.model_path,
            "device": self.device,
            "dtype": self.dtype,
            "versions": dict(self.versions),
            "input": dict(self.input),
            "load_info": self.load_info.to_json(),
            "other_patchers": [patcher.to_json() for patcher in self.other_patchers],
            "bandwidth": {
                "weight_bytes_per_token": self.weight_bytes_per_token,
                "copy_bandwidth_gb_s": round(self.copy_bandwidth_bytes_s / 1e9, 3),
                "floor_ms": round(self.floor_s * 1000, 4),
                "note": "floor = weight bytes one decode step reads / measured copy bandwidth (read + write)",
            },
            "peak_memory_source": self.peak_memory_source,
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
        doc = {"schema_version": verify.SCHEMA_VERSION, "command": "bench", "passed": self.passed}
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
            options=dict(self.options),
        )
        return doc


# --- the run --------------------------------------------------------------------------------------


def run_bench(options: BenchOptions) -> BenchResult:
    batches = parse_batches(options.batches)
    loaded, failures, warnings = verify.start_run(options, batch=max(batches), use_pto=True)
    spec, folder, device = loaded.spec, loaded.folder, loaded.device
    verify.apply_compile(loaded.model, options, warnings)
    single, description = verify.build_inputs(loaded, options.prompt, options.image, options.simple_prompt)
    kernel_backend = verify.kernel_backend_name(options)
    kernels = loaded.kernels

    runs = []
    for batch in batches:
        inputs = verify.batched(single, batch, device)
        switched_on, table = verify.choose_ops(
            options.ops, spec, loaded.state, batch, options.use_dynamic_config
        )
        kernels.disable()
        kernels.reset_stats()
        switches = {
            "baseline": kernels.disable,
            "pto": lambda ops=switched_on: verify.switch_on(kernels, ops, kernel_backend),
        }
        try:
            timed = verify.measure_modes(
                loaded,
                inputs,
                switches,
                batch=batch,
                new_tokens=options.output_length,
                warmup=options.warmup,
                iters=options.iters,
            )
        finally:
            stats = kernels.stats()
            kernels.disable()
        ops = verify.op_reports(stats, switched_on)
        more_failures, more_warnings = verify.op_failures(ops, strict=False)
        failures += [f"batch {batch}: {message}" for message in more_failures]
        warnings += [f"batch {batch}: {message}" for message in more_warnings]
        runs.append(
            BatchRun(
                batch=batch,
                baseline=ModeRun(timed["baseline"]),
                pto=ModeRun(timed["pto"], ops),
                switched_on=switched_on,
                dynamic_config=table,
            )
        )

    weight_bytes = decode_weight_bytes(loaded.model)
    bandwidth = measure_copy_bandwidth(device)  # last, so its buffers never count in a mode's peak
    result = BenchResult(
        model_path=str(folder),
        device=device.name,
        dtype=loaded.dtype_name,
        versions=verify.versions(),
        input=description,
        load_info=loaded.load_info,
        other_patchers=list(loaded.other_patchers),
        weight_bytes_per_token=weight_bytes,
        copy_bandwidth_bytes_s=bandwidth,
        peak_memory_source=verify.peak_memory_source(device),
        runs=runs,
        failures=failures,
        warnings=warnings,
        kernel_backend=kernel_backend,
        options=options.to_json(),
    )
    for name, mode in ((BASELINE_FILE, "baseline"), (PTO_FILE, "pto")):
        path = Path(options.output_dir) / name
        verify.write_report(result.mode_document(mode), path)
        result.files.append(str(path))
    return result
