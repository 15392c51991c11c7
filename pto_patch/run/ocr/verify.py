"""`verify --ocr`: read every page with GutenOCR's tasks and judge both modes against the unpatched model.

The unpatched model, eager (`run.reference`), reads every (page, task) first: its answers and, per
generated step, its top scores. Then the patched folder reads the same (page, task)s in the asked mode
with its kernels off (the mode's baseline) and on (PTO), each teacher-forced on the reference's tokens,
every step judged as plain verify judges it (`run.modes.judge_cases`): a mode whose baseline differs from
the eager model fails naming the mode, a PTO run that differs fails naming the kernels, each with the
page, the task and the first failing step. Exit 3.

Beside the step rule, each run's own greedy choices are read as its answer and scored against the truth
of the page; a run fails too when it reads measurably worse than the reference:

- one reading's CER rises by more than `READING_CER_MARGIN` (0.05): a kernel that breaks one kind
  of page or task shows there even when the others hide it;
- the mean CER over all readings rises by more than `MEAN_CER_MARGIN` (0.01);
- fewer LINES answers parse, or the mean box F1 falls by more than `BOX_F1_MARGIN` (0.05).

Why these margins: runs that compute the same function up to rounding mostly choose the reference's
tokens; where a near-tie flips one greedy choice, one word (5 - 10 characters) on a page of 300 - 800
characters is a CER change of 0.01 - 0.03, either way. A kernel that computes something else changes most
tokens of an answer (the tests' sabotaged RMSNorm: CER 0 -> above 1). The margins sit between; they are not
yet calibrated on a trained checkpoint in bf16 on a 910B. With a random-weight model the CER means nothing
and only the step rule decides.

With --against-outputs the same CER rules compare this run with a trusted device's saved answers: each
mode here against the trusted baseline, scored against the truth of the same pages. With --baseline-only
the folder reads the pages once, kernels off, free-running, and nothing is judged.
"""

from __future__ import annotations

from pathlib import Path

from pto_patch.patching.tuning_file import describe_backend, lookup_for_run
from pto_patch.run import image_inputs, progress
from pto_patch.run.generation import generate, tolerances
from pto_patch.run.graph.compiling import CompileWatch, apply_compile, finish_watch
from pto_patch.run.inputs import repeat_for_batch
from pto_patch.run.judging import TRACE_TOP_K
from pto_patch.run.loading import LoadedModel, versions
from pto_patch.run.modes import BASELINE, PTO, JudgedCase, KernelModes, judge_cases, modes_for
from pto_patch.run.ocr.options import OcrOptions
from pto_patch.run.ocr.outputs import (
    SavedRun,
    check_weights,
    load_answers,
    save_answers,
    weight_files,
    weights_digest,
)
from pto_patch.run.ocr.pages import Page, load_pages
from pto_patch.run.ocr.report import (
    RANDOM_WEIGHTS_NOTE,
    TRUTH_NOTE,
    Comparison,
    OcrVerifyReport,
    Reading,
    mode_summary,
)
from pto_patch.run.ocr.scoring import (
    IOU_THRESHOLD,
    TASKS,
    error_rates,
    normalise_text,
    normalise_text2d,
    score_answer,
)
from pto_patch.run.reference import open_reference
from pto_patch.run.report import write_report
from pto_patch.run.start import plan_run, start_run
from pto_patch.run.verify import VERDICT_RULE, VerifyOptions, compares, run_label

READING_CER_MARGIN = 0.05
MEAN_CER_MARGIN = 0.01
BOX_F1_MARGIN = 0.05
POOR_BASELINE_CER = 0.5

MARGINS = {
    "reading_cer_rise": READING_CER_MARGIN,
    "mean_cer_rise": MEAN_CER_MARGIN,
    "box_f1_fall": BOX_F1_MARGIN,
    "lines_parsed": "no fewer LINES answers may parse",
    "iou_threshold": IOU_THRESHOLD,
}


def _normalise(task: str, text: str) -> str:
    return normalise_text2d(text) if task == "TEXT2D" else normalise_text(text)


def agreement_cer(task: str, reference: str, candidate: str) -> float:
    """The candidate's answer scored against the reference's answer (0: the same reading)."""
    reference, candidate = _normalise(task, reference), _normalise(task, candidate)
    if not reference:
        return 0.0 if not candidate else 1.0
    return error_rates(reference, candidate)[0]


def compare_readings(
    references: list[Reading], candidates: list[Reading], reference_label: str
) -> tuple[list[Comparison], list[str]]:
    """Per (page, task), a candidate mode's reading against the reference's; the failures of the rules."""
    by_key = {(r.page, r.task): r for r in references}
    comparisons = []
    for candidate in candidates:
        reference = by_key[(candidate.page, candidate.task)]
        comparisons.append(
            Comparison(
                page=candidate.page,
                task=candidate.task,
                reference=reference_label,
                candidate=candidate.mode,
                reference_cer=reference.score.cer,
                candidate_cer=candidate.score.cer,
                agreement_cer=agreement_cer(candidate.task, reference.answer, candidate.answer),
                reference_f1=reference.score.box_f1,
                candidate_f1=candidate.score.box_f1,
            )
        )
    return comparisons, worse_than_reference(comparisons, references, candidates)


def worse_than_reference(
    comparisons: list[Comparison], references: list[Reading], candidates: list[Reading]
) -> list[str]:
    if not comparisons:
        return []
    who = f"{comparisons[0].candidate} against {comparisons[0].reference}"
    failures = []
    for c in comparisons:
        if c.cer_rise > READING_CER_MARGIN:
            failures.append(
                f"{who}: page {c.page}, {c.task} reads worse: CER {c.reference_cer:.3f} -> "
                f"{c.candidate_cer:.3f} (rise > {READING_CER_MARGIN})"
            )
    rise = sum(c.cer_rise for c in comparisons) / len(comparisons)
    if rise > MEAN_CER_MARGIN:
        failures.append(
            f"{who}: mean CER rises by {rise:.3f} (> {MEAN_CER_MARGIN}) over {len(comparisons)} readings"
        )
    base, cand = mode_summary(references), mode_summary(candidates)
    if cand["lines_parsed"] < base["lines_parsed"]:
        failures.append(
            f"{who}: {cand['lines_parsed']} LINES answer(s) parse, against {base['lines_parsed']}"
        )
    if base["mean_box_f1"] is not None and cand["mean_box_f1"] is not None:
        fall = base["mean_box_f1"] - cand["mean_box_f1"]
        if fall > BOX_F1_MARGIN:
            failures.append(
                f"{who}: mean box F1 falls by {fall:.3f} (> {BOX_F1_MARGIN}) at IoU {IOU_THRESHOLD}"
            )
    return failures


def page_inputs(loaded: LoadedModel, page: Page, task, image_processor, image=None):
    """The model's inputs for one page read with one task (the page decoded now unless `image` is given)."""
    return repeat_for_batch(
        image_inputs.build_inputs(
            loaded.folder,
            task.prompt,
            page.image if image is None else image,
            tokenizer=loaded.tokenizer,
            image_processor=image_processor,
        ),
        1,
        loaded.device,
    )


def reading_of(
    page: Page, task, mode: str, answer: str, new_tokens: int, output_length: int, **more
) -> Reading:
    return Reading(
        page=page.name,
        task=task.name,
        mode=mode,
        answer=answer,
        new_tokens=new_tokens,
        truncated=new_tokens >= output_length,
        score=score_answer(task.name, answer, page),
        **more,
    )


def read_pages(
    loaded: LoadedModel,
    pages: list[Page],
    mode: str,
    output_length: int,
    image_processor,
    input_sizes: dict[str, tuple[int, int]] | None = None,
    read=None,
) -> list[Reading]:
    """Every page with every task, greedily, free-running, in the mode the kernels are switched to now
    (`read(page, task, inputs)`, where given, generates instead and returns (answer, new_tokens, more)).

    A page is decoded once, read with each task, and let go before the next: memory does not grow
    with the number of pages. `input_sizes` gets the (width, height) the model saw each page at.
    """
    readings = []
    for page in pages:
        image = page.image
        for task in TASKS:
            inputs = page_inputs(loaded, page, task, image_processor, image)
            if input_sizes is not None and "image_grid_thw" in inputs:
                input_sizes[page.name] = model_input_size(inputs["image_grid_thw"][0], image_processor)
            if read is not None:
                answer, new_tokens, more = read(page, task, inputs)
            else:
                run = generate(loaded, inputs, output_length, fixed_length=False, logits=False)
                answer = loaded.tokenizer.decode(run.new_tokens[0], skip_special_tokens=True)
                new_tokens, more = int(run.new_tokens.shape[1]), {"seconds": run.seconds}
            readings.append(reading_of(page, task, mode, answer, new_tokens, output_length, **more))
        del image
    return readings


def read_reference(plan, pages: list[Page], output_length: int, input_sizes: dict[str, tuple[int, int]]):
    """The unpatched model, eager, reads every (page, task): its readings (mode `reference`), each
    generation (its step trace) by (page, task), and what the reference was."""
    generations = {}
    with open_reference(plan) as reference:
        processor = _image_processor(reference.folder)

        def read(page, task, inputs):
            progress.phase(f"the reference reads page {page.name}, {task.name}")
            generation = reference.generate(inputs, output_length)
            generations[(page.name, task.name)] = generation
            return generation.texts[0], int(generation.new_tokens.shape[1]), {"seconds": generation.seconds}

        readings = read_pages(reference, pages, "reference", output_length, processor, input_sizes, read=read)
        described = reference.describe()
    return readings, generations, described


def judged_readings(loaded, pages, generations, modes, options, failures, label, compiled=False):
    """Both modes on every (page, task), teacher-forced on the reference's tokens and judged at every step;
    each run's own greedy choices read as its answer."""
    processor = _image_processor(loaded.folder)
    atol, rtol = tolerances(options.dtype, options.atol, options.rtol, compiled)
    keys = [(page, task) for page in pages for task in TASKS]
    cases = [
        JudgedCase(
            lambda page=page, task=task: page_inputs(loaded, page, task, processor),
            generations[(page.name, task.name)],
            f"page {page.name}, {task.name}",
        )
        for page, task in keys
    ]
    judged = judge_cases(loaded, cases, modes, atol, rtol, failures, label)
    readings = []
    for run in (BASELINE, PTO):
        for (page, task), judgement, case in zip(keys, judged[run], cases, strict=True):
            choices = judgement.choices
            answer = "" if choices is None else loaded.tokenizer.decode(choices[0], skip_special_tokens=True)
            new_tokens = int(case.reference.new_tokens.shape[1])
            readings.append(
                reading_of(
                    page,
                    task,
                    run,
                    answer,
                    new_tokens,
                    options.output_length,
                    seconds=judgement.seconds,
                    judged=judgement,
                )
            )
    return readings


def trusted_readings(saved: SavedRun, pages: list[Page]) -> dict[str, list[Reading]]:
    """The saved answers as readings (mode `trusted <mode>`), scored against today's truth of the pages."""
    result: dict[str, list[Reading]] = {}
    for mode in saved.modes:
        rows = []
        for page in pages:
            for task in TASKS:
                answer = saved.answers.get((page.name, task.name, mode))
                if answer is None:
                    continue
                rows.append(
                    Reading(
                        page=page.name,
                        task=task.name,
                        mode=f"trusted {mode}",
                        answer=answer.answer,
                        new_tokens=answer.new_tokens,
                        truncated=answer.truncated,
                        score=score_answer(task.name, answer.answer, page),
                    )
                )
        result[mode] = rows
    return result


RESIZE_WARNING_FRACTION = 0.03  # the processor rounds each side to its 28-pixel patch groups


def model_input_size(grid, image_processor) -> tuple[int, int]:
    """The (width, height) the model sees a page at, from its image grid (t, h, w) in patches."""
    patch = int(getattr(image_processor, "patch_size", 14))
    return int(grid[2]) * patch, int(grid[1]) * patch


def resized_pages(
    pages: list[Page], input_sizes: dict[str, tuple[int, int]], described: list[dict]
) -> list[str]:
    """Record each page's model input size in `described`; name the pages resized by more than 3 %."""
    resized = []
    for page, entry in zip(pages, described, strict=True):
        size = input_sizes.get(page.name)
        entry["model_input_size"] = None if size is None else list(size)
        if size is not None and any(
            abs(seen - given) > RESIZE_WARNING_FRACTION * given
            for seen, given in zip(size, page.size, strict=True)
        ):
            resized.append(f"{page.name} ({page.size[0]}x{page.size[1]} -> {size[0]}x{size[1]})")
    return resized


def _image_processor(folder: Path):
    # build_inputs says what is missing when there is no preprocessor_config.json.
    return (
        image_inputs.load_image_processor(folder) if (folder / "preprocessor_config.json").is_file() else None
    )


def run_ocr_verify(options: VerifyOptions, ocr: OcrOptions) -> OcrVerifyReport:
    pages = load_pages(ocr.pages)  # bad pages and a bad saved file are usage errors, before any load
    saved = load_answers(ocr.against_outputs, pages) if ocr.against_outputs is not None else None
    use_pto = compares(options)  # verify's own decision: PTO is compared unless --baseline-only
    plan = plan_run(
        options,
        batch=1,
        use_pto=use_pto,
        reference=use_pto,
        usage_checks=lambda folder: (
            check_weights(saved, folder, ocr.other_weights) if saved is not None else None
        ),
    )
    weights_warning = plan.usage
    input_sizes: dict[str, tuple[int, int]] = {}
    readings: list[Reading] = []
    generations: dict = {}
    reference_info = None
    if use_pto:  # the truth first, and let go before the patched model loads
        readings, generations, reference_info = read_reference(
            plan, pages, options.output_length, input_sizes
        )
    started = start_run(plan)
    loaded, failures, warnings = started.loaded, started.failures, started.warnings
    if weights_warning is not None:
        warnings.append(weights_warning)
    compiled = apply_compile(loaded.model, options, warnings, kernels=loaded.kernels)
    label = run_label(compiled)
    switched_on: tuple[str, ...] = ()
    kernel_backend = None
    modes = watch = None
    if use_pto:
        lookup = lookup_for_run(loaded, warnings, compiled) if options.use_dynamic_config else None
        choice = modes_for(plan, 1, options, lookup)
        switched_on, kernel_backend = choice.switched_on, choice.backend
        watch = CompileWatch(compiled) if compiled is not None else None
        modes = KernelModes(loaded.kernels, choice, watch)
        readings += judged_readings(
            loaded, pages, generations, modes, options, failures, label, compiled is not None
        )
    else:
        kernels = loaded.kernels
        if kernels is not None:
            kernels.disable()
        processor = _image_processor(loaded.folder)
        readings = read_pages(loaded, pages, BASELINE, options.output_length, processor, input_sizes)

    random_weights = loaded.random_weights
    failures += started.folder_changes()  # a restore or edit meanwhile fails the run
    report = OcrVerifyReport(
        model_path=str(loaded.folder),
        device=loaded.device.name,
        device_reason=loaded.device.reason,
        dtype=loaded.dtype_name,
        versions=versions(),
        load_info=loaded.load_info,
        pages=[page.describe() for page in pages],
        tasks={task.name: task.prompt for task in TASKS},
        output_length=options.output_length,
        margins=dict(MARGINS),
        readings=readings,
        failures=failures,
        warnings=warnings,
        notes=[RANDOM_WEIGHTS_NOTE if random_weights else TRUTH_NOTE],
        random_weights=random_weights,
        switched_on=list(switched_on),
        kernel_backend=describe_backend(kernel_backend) if use_pto else None,
        options={**options.to_json(), "pages": None if ocr.pages is None else str(ocr.pages)},
    )
    resized = resized_pages(pages, input_sizes, report.pages)
    if resized and any(page.lines for page in pages) and not random_weights:
        report.warnings.append(
            f"the image processor resized page(s) {', '.join(resized)}: LINES boxes are scored in the page's "
            "pixels, so if the model answers in the resized image's pixels its box F1 is too low"
        )
    baseline = [r for r in readings if r.mode == BASELINE]
    if use_pto:
        report.ops, more_failures, more_warnings = modes.op_checks(options.strict, loaded.text_layers)
        report.failures += more_failures
        report.warnings += more_warnings
        report.mode = label
        report.rule = VERDICT_RULE.format(k=TRACE_TOP_K) + f", on every (page, task) ({len(generations)})"
        report.reference = reference_info
        truth = [r for r in readings if r.mode == "reference"]
        for run in (BASELINE, PTO):
            comparisons, worse = compare_readings(truth, [r for r in readings if r.mode == run], "reference")
            report.comparisons += comparisons
            report.failures += worse
        baseline = truth  # the CER warnings below speak of what the model reads
        if not switched_on:
            report.warnings.append("no op was switched on, so the PTO run equals the baseline")
    else:
        report.notes.append("baseline only (--baseline-only): nothing was compared, so nothing is verified")
    # compared: PTO with the baseline, or this run with a trusted run's saved answers
    report.compared = use_pto or saved is not None
    if saved is not None:
        trusted = trusted_readings(saved, pages)
        report.readings += [r for rows in trusted.values() for r in rows]
        report.against_outputs = saved.describe()
        if saved.redrawn:
            report.warnings.append(
                f"--against-outputs {saved.path}: page(s) {', '.join(saved.redrawn)} have the same truth but "
                "other pixels (another Pillow or FreeType drew them); for identical pages, write them once "
                "and pass --pages on both devices"
            )
        if saved.header.get("output_length") != options.output_length:
            report.warnings.append(
                f"--against-outputs {saved.path} was read with --output_length "
                f"{saved.header.get('output_length')}, this run with {options.output_length}"
            )
        for mode in report.modes():
            if mode.startswith("trusted"):
                continue
            # the trusted device's own eager reading where its file has one, else its baseline
            trusted_mode = "reference" if "reference" in trusted else "baseline"
            comparisons, worse = compare_readings(
                trusted[trusted_mode], [r for r in readings if r.mode == mode], f"trusted {trusted_mode}"
            )
            report.comparisons += comparisons
            report.failures += worse
    truncated = sum(1 for r in readings if r.truncated)
    if truncated and not random_weights:
        report.warnings.append(
            f"{truncated} answer(s) stopped at --output_length {options.output_length}: "
            "raise it so that a page's whole answer fits"
        )
    base_cer = mode_summary(baseline)["mean_cer"]
    if not random_weights and base_cer is not None and base_cer > POOR_BASELINE_CER:
        report.warnings.append(
            f"the baseline itself reads these pages poorly (mean CER {base_cer:.3f}): "
            "PTO mode agreeing with it proves little; compare with a trusted device (--against-outputs)"
        )
    if ocr.save_outputs is not None:
        header = {
            "model_path": str(loaded.folder),
            "weights": weight_files(loaded.folder),
            "weights_digest": weights_digest(loaded.folder),
            "device": loaded.device.name,
            "dtype": loaded.dtype_name,
            "versions": report.versions,
            "output_length": options.output_length,
        }
        if save_answers(
            ocr.save_outputs, header, pages, [r for r in readings if not r.mode.startswith("trusted")]
        ):  # else kept in the cache: the CLI names where
            report.saved_outputs = str(ocr.save_outputs)
    # Nothing compiles after the judged runs: the watch closes here, its verdict after the other checks'.
    report.compilation = finish_watch(watch, report.failures, report.warnings)
    if options.report_file is not None:
        write_report(report.to_json(), options.report_file)
    return report
