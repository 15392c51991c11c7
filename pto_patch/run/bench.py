"""`pto-patch bench`: the reference's bench script as a command, baseline then PTO per batch size.

For each batch size it measures both modes on one loaded model: warm-up, then timed runs of
`--output_length` new tokens, the two modes alternating so that a shared machine's load hits both
alike. It writes `bench_baseline.json` and `bench_pypto.json` with the verify report's per-mode
keys (into a folder of its own: `run.report_folder`), and relates the decode step to a memory-bandwidth floor: the weight bytes a decode step must
read, over a copy bandwidth measured in the same run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from pto_patch.patching.tuning_file import describe_backend, lookup_for_run
from pto_patch.run import progress
from pto_patch.run.device import DeviceChoice, peak_memory_source, synchronize
from pto_patch.run.generation import measure_modes
from pto_patch.run.graph.compiling import CompileWatch, apply_compile, finish_watch
from pto_patch.run.inputs import encode_prompt, repeat_for_batch
from pto_patch.run.loading import versions
from pto_patch.run.modes import BASELINE, PTO, KernelModes, modes_for
from pto_patch.run.options import RunOptions, parse_batches
from pto_patch.run.report import BatchRun, BenchResult, ModeRun
from pto_patch.run.report_folder import output_dir_check
from pto_patch.run.start import plan_run, start_run

BASELINE_FILE = "bench_baseline.json"
PTO_FILE = "bench_pypto.json"
COPY_BYTES = 256 * 2**20  # well past any cache, small next to the model
COPY_REPEATS = 5


@dataclass(frozen=True)
class BenchOptions(RunOptions):
    output_length: int = 100
    batches: str = "1,4,8"
    output_dir: Path | None = None  # None: a new folder under the user's pto-patch reports


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


def measure_copy_bandwidth(device: DeviceChoice, nbytes: int = COPY_BYTES) -> float:
    """Bytes moved per second (read + write) by a device-to-same-device copy, median of a few."""
    import torch

    source = torch.ones(nbytes, dtype=torch.uint8, device=device.name)
    target = torch.zeros_like(source)
    target.copy_(source)
    times = []
    for _ in range(COPY_REPEATS):
        synchronize(device)
        started = time.perf_counter()
        target.copy_(source)
        synchronize(device)
        times.append(time.perf_counter() - started)
    del source, target
    return 2 * nbytes / statistics.median(times)


# --- the run --------------------------------------------------------------------------------------


def run_bench(options: BenchOptions) -> BenchResult:
    batches = parse_batches(options.batches)
    checks = output_dir_check("bench", options.output_dir, (BASELINE_FILE, PTO_FILE))
    plan = plan_run(options, batch=max(batches), use_pto=True, usage_checks=checks)
    place = plan.usage
    started = start_run(plan)
    loaded, failures, warnings = started.loaded, started.failures, started.warnings
    folder, device = loaded.folder, loaded.device
    compiled = apply_compile(loaded.model, options, warnings, kernels=loaded.kernels)
    single, description = encode_prompt(loaded, options.prompt, options.image, options.simple_prompt)
    lookup = lookup_for_run(loaded, warnings, compiled) if options.use_dynamic_config else None
    backends_used = []
    watch = CompileWatch(compiled) if compiled is not None else None

    runs = []
    for batch in batches:
        inputs = repeat_for_batch(single, batch, device)
        modes = KernelModes(loaded.kernels, modes_for(plan, batch, options, lookup), watch)
        backends_used.append(describe_backend(modes.choice.backend))
        progress.phase(f"batch {batch}: timed runs, baseline and PTO alternating")
        with modes.timed() as switches:
            timed = measure_modes(
                loaded,
                inputs,
                switches,
                batch=batch,
                new_tokens=options.output_length,
                warmup=options.warmup,
                iters=options.iters,
            )
        ops = modes.batch_checks(batch, loaded.text_layers, failures, warnings)
        runs.append(
            BatchRun(
                batch=batch,
                baseline=ModeRun(timed[BASELINE]),
                pto=ModeRun(timed[PTO], ops),
                switched_on=modes.choice.switched_on,
                dynamic_config=modes.choice.table,
            )
        )

    compilation = finish_watch(watch, failures, warnings)
    weight_bytes = decode_weight_bytes(loaded.model)
    bandwidth = measure_copy_bandwidth(device)  # last, so its buffers never count in a mode's peak
    failures += started.folder_changes()  # a restore or edit meanwhile fails the run
    result = BenchResult(
        model_path=str(folder),
        device=device.name,
        dtype=loaded.dtype_name,
        versions=versions(),
        input=description,
        load_info=loaded.load_info,
        other_patchers=list(loaded.other_patchers),
        random_weights=loaded.random_weights,
        weight_bytes_per_token=weight_bytes,
        copy_bandwidth_bytes_s=bandwidth,
        peak_memory_source=peak_memory_source(device),
        runs=runs,
        failures=failures,
        warnings=warnings,
        kernel_backend=backends_used[0] if len(set(backends_used)) == 1 else "per-batch",
        dynamic_config_source=lookup.to_json() if lookup else None,
        options=options.to_json(),
        compile=compiled.description if compiled else None,
        compilation=compilation,
    )
    directory = place.make()
    for name, mode in ((BASELINE_FILE, BASELINE), (PTO_FILE, PTO)):
        result.files.append(str(place.write(directory, name, result.mode_document(mode))))
    return result
