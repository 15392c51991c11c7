"""`bench --ocr`: where a page's time goes, per page, batch size and mode.

Each timed run is one greedy generation of `--output_length` new tokens (end of sequence
suppressed, so every run is as long) for GutenOCR's TEXT task on one page, repeated `batch` times.
Hooks around the vision encoder's forward time it inside the run; the streamer's first token gives
the time to the first token, so prefill is that time less the vision encoder's, and decode is the
rest of the run. As in `bench`, each mode gets its untimed warm-up runs on each page (at least one, so
no first call is timed), then the modes alternate run by run (the order reversed every other round),
so a shared machine's load drifts over both alike; each figure is the median over the timed runs, and
each page's speed ratio comes with its noise band from the per-round ratios (run/noise.py).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from pto_patch.patching.tuning_file import describe_backend, lookup_for_run
from pto_patch.run import image_inputs, progress
from pto_patch.run.bench import BenchOptions
from pto_patch.run.device import synchronize
from pto_patch.run.generation import WARMUP_NEW_TOKENS, generate, warmup_runs
from pto_patch.run.graph.compiling import CompileWatch, apply_compile, finish_watch
from pto_patch.run.inputs import repeat_for_batch
from pto_patch.run.loading import LoadedModel, versions
from pto_patch.run.modes import KernelModes, modes_for
from pto_patch.run.ocr.options import OcrOptions
from pto_patch.run.ocr.pages import load_pages
from pto_patch.run.ocr.plot import write_time_plot
from pto_patch.run.ocr.report import PAGE_TIME_NOTE, RANDOM_WEIGHTS_NOTE, PageBenchResult, PageRun
from pto_patch.run.ocr.scoring import TASKS
from pto_patch.run.options import parse_batches
from pto_patch.run.report_folder import output_dir_check
from pto_patch.run.start import plan_run, start_run

PAGE_BENCH_FILE = "bench_ocr_pages.json"
TASK = TASKS[0]  # TEXT: read the whole page, the task a page is OCR'd with


class VisionClock:
    """Sums the wall time of the vision encoder's forwards while attached (device synchronised)."""

    def __init__(self, module, device):
        self.device, self.total, self._started = device, 0.0, None
        self._handles = [
            module.register_forward_pre_hook(self._start),
            module.register_forward_hook(self._stop),
        ]

    def _start(self, module, args) -> None:
        synchronize(self.device)
        self._started = time.perf_counter()

    def _stop(self, module, args, output) -> None:
        synchronize(self.device)
        self.total += time.perf_counter() - self._started

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def vision_module(model):
    """The vision encoder: the module named `visual` nearest the top of the model."""
    found = [
        (name.count("."), name, module)
        for name, module in model.named_modules()
        if name.split(".")[-1] == "visual"
    ]
    return min(found, key=lambda item: item[:2])[2] if found else None


@dataclass
class _Timed:
    seconds: float
    first_token_s: float | None
    vision_s: float | None
    new_tokens: int


def time_page(loaded: LoadedModel, inputs, new_tokens: int, visual) -> _Timed:
    clock = VisionClock(visual, loaded.device) if visual is not None else None
    try:
        run = generate(loaded, inputs, new_tokens, fixed_length=True, logits=False)
    finally:
        if clock is not None:
            clock.close()
    return _Timed(run.seconds, run.prefill_s, clock.total if clock else None, int(run.new_tokens.shape[1]))


def _median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def _page_run(page, batch, mode, runs: list[_Timed], image_tokens, prompt_tokens, preprocess_s) -> PageRun:
    first = _median([r.first_token_s for r in runs])
    vision = _median([r.vision_s for r in runs])
    latency = statistics.median(r.seconds for r in runs)
    decodes = [r.seconds - r.first_token_s for r in runs if r.first_token_s is not None]
    prefills = [
        r.first_token_s - r.vision_s for r in runs if r.first_token_s is not None and r.vision_s is not None
    ]
    return PageRun(
        page=page,
        batch=batch,
        mode=mode,
        image_tokens=image_tokens,
        prompt_tokens=prompt_tokens,
        new_tokens=runs[-1].new_tokens,
        vision_s=vision,
        prefill_s=_median(prefills),
        first_token_s=first,
        decode_s=_median(decodes),
        latency_s=latency,
        preprocess_s=preprocess_s,
        latencies_s=[r.seconds for r in runs],
    )


def run_page_bench(options: BenchOptions, ocr: OcrOptions) -> PageBenchResult:
    batches = parse_batches(options.batches)
    pages = load_pages(ocr.pages)
    checks = output_dir_check("bench-ocr", options.output_dir, (PAGE_BENCH_FILE,))
    plan = plan_run(options, batch=max(batches), use_pto=True, usage_checks=checks)
    place = plan.usage
    started = start_run(plan)
    loaded, failures, warnings = started.loaded, started.failures, started.warnings
    compiled = apply_compile(loaded.model, options, warnings, kernels=loaded.kernels)
    watch = CompileWatch(compiled) if compiled is not None else None
    lookup = lookup_for_run(loaded, warnings, compiled) if options.use_dynamic_config else None
    visual = vision_module(loaded.model)
    if visual is None:
        warnings.append("no vision encoder (a module named visual) found: vision time is not split out")
    folder = loaded.folder
    processor = (
        image_inputs.load_image_processor(folder) if (folder / "preprocessor_config.json").is_file() else None
    )
    image_id = loaded.tokenizer.convert_tokens_to_ids(image_inputs.IMAGE_TOKEN)

    runs: list[PageRun] = []
    ops = {}
    switched_all: list[str] = []
    backends = []
    for batch in batches:
        modes = KernelModes(loaded.kernels, modes_for(plan, batch, options, lookup), watch)
        backends.append(describe_backend(modes.choice.backend))
        switched_all += [op for op in modes.choice.switched_on if op not in switched_all]
        with modes.timed() as switches:
            for index, page in enumerate(pages):
                progress.phase(f"batch {batch}: page {page.name} ({index + 1} of {len(pages)})")
                started_at = time.perf_counter()
                single = image_inputs.build_inputs(
                    folder, TASK.prompt, page.image, tokenizer=loaded.tokenizer, image_processor=processor
                )
                preprocess_s = time.perf_counter() - started_at
                inputs = repeat_for_batch(single, batch, loaded.device)
                image_tokens = int((single["input_ids"] == image_id).sum())
                prompt_tokens = int(single["input_ids"].shape[1])
                for switch in switches.values():
                    switch()
                    for _ in range(warmup_runs(options.warmup)):
                        generate(loaded, inputs, WARMUP_NEW_TOKENS, fixed_length=True, logits=False)
                timed: dict[str, list[_Timed]] = {name: [] for name in switches}
                for round_index in range(options.iters):
                    for name in list(switches) if round_index % 2 == 0 else reversed(list(switches)):
                        switches[name]()
                        timed[name].append(time_page(loaded, inputs, options.output_length, visual))
                for name, rows in timed.items():
                    runs.append(
                        _page_run(page.name, batch, name, rows, image_tokens, prompt_tokens, preprocess_s)
                    )
        ops = modes.batch_checks(batch, loaded.text_layers, failures, warnings)

    compilation = finish_watch(watch, failures, warnings)
    random_weights = loaded.random_weights
    notes = [PAGE_TIME_NOTE]
    if random_weights:
        notes.append(
            RANDOM_WEIGHTS_NOTE.split(":")[0]
            + ": its timing holds for its widths and layer count only, never for GutenOCR-3B's"
        )
    failures += started.folder_changes()  # a restore or edit meanwhile fails the run
    result = PageBenchResult(
        model_path=str(folder),
        device=loaded.device.name,
        dtype=loaded.dtype_name,
        versions=versions(),
        load_info=loaded.load_info,
        task=TASK.name,
        prompt=TASK.prompt,
        output_length=options.output_length,
        pages=[page.describe() for page in pages],
        runs=runs,
        failures=failures,
        warnings=warnings,
        notes=notes,
        random_weights=random_weights,
        switched_on=switched_all,
        kernel_backend=backends[0] if len(set(backends)) == 1 else "per-batch",
        ops=ops,
        options={**options.to_json(), "pages": None if ocr.pages is None else str(ocr.pages)},
        compilation=compilation,
    )
    if ocr.plot is not None:
        if write_time_plot(result.runs, Path(ocr.plot)):  # else kept in the cache: the CLI names where
            result.plot = str(ocr.plot)
    result.files.append(str(place.write(place.make(), PAGE_BENCH_FILE, result.to_json())))
    return result
