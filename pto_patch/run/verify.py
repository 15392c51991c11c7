"""A verify run: the unpatched model eagerly as the truth, then the patched folder in the asked mode
with its kernels off and on, every generated step of both judged against the truth.

The run mirrors the reference system's run script (warm-up, timed runs, a JSON report), and adds
what it lacked: the patched code must be exactly what `apply` wrote, every checkpoint key must load
(a random-weight model never passes), each switched-on op must actually run, and neither the mode's
baseline (a compiler or capture fault) nor its PTO run (a kernel fault) may compute, at any step,
something other than the unpatched eager model within the dtype's tolerance (`run.judging`).
`pto-patch verify` and `pto-patch demo` both run it (`run_verify` writes its report file where asked).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from pto_patch.patching.folder_kernels import module_dir
from pto_patch.patching.tuning_file import describe_backend, lookup_for_run
from pto_patch.run import progress
from pto_patch.run.device import peak_memory_source
from pto_patch.run.generation import generate, measure_modes, tolerances
from pto_patch.run.graph.compiling import CompileWatch, apply_compile, finish_watch
from pto_patch.run.inputs import encode_prompt, repeat_for_batch
from pto_patch.run.judging import TRACE_TOP_K, RunJudgement
from pto_patch.run.loading import versions
from pto_patch.run.modes import BASELINE, PTO, JudgedCase, KernelModes, OpChoice, judge_cases, modes_for
from pto_patch.run.op_choice import backend_for
from pto_patch.run.options import RunOptions
from pto_patch.run.options import compares as options_compares
from pto_patch.run.reference import open_reference
from pto_patch.run.report import Accuracy, VerifyReport, write_report
from pto_patch.run.start import plan_run, start_run


@dataclass(frozen=True)
class VerifyOptions(RunOptions):
    batch: int = 1
    use_pto: bool = False  # the reference's flag; a patched folder is compared without it too
    baseline_only: bool = False
    atol: float | None = None
    rtol: float | None = None
    strict: bool = False
    report_file: Path | None = None


def compares(options: VerifyOptions) -> bool:
    """Whether the run compares PTO with the baseline (run.options.compares decides, for every path)."""
    return options_compares(options.use_pto, options.baseline_only)


def run_label(compiled) -> str:
    """The mode a run's two runs share, in words: eager, torch.compile, graph decode or ACL graph."""
    if compiled is None:
        return "eager"
    if compiled.backend == "torchair":
        return "ACL graph"
    if compiled.graph_run:
        return f"graph decode ({compiled.backend})"
    return f"torch.compile ({compiled.backend})"


VERDICT_RULE = (
    "every generated step of both runs (the mode with its kernels off, and with them on) is judged against "
    "the unpatched model run eagerly on the same inputs, teacher-forced on its tokens: a step passes when its "
    "largest score difference over the reference's top {k} scores (and any score that rises above them) is at "
    "most atol + rtol x max|reference score|"
)


def verify_model(options: VerifyOptions) -> VerifyReport:
    """The unpatched model eagerly (the reference), then the patched one in the asked mode with its kernels
    off and on, each judged at every step against the reference; then both modes timed."""
    use_pto = compares(options)
    plan = plan_run(
        options, batch=options.batch, use_pto=use_pto, report_file=options.report_file, reference=use_pto
    )
    reference_run = reference_info = None
    single = description = None
    if use_pto:
        with open_reference(plan) as reference:
            single, description = encode_prompt(
                reference, options.prompt, options.image, options.simple_prompt
            )
            progress.phase("the reference generates")
            reference_run = reference.generate(
                repeat_for_batch(single, options.batch, plan.device), options.output_length
            )
            reference_info = reference.describe()
    started = start_run(plan)
    loaded, failures, warnings = started.loaded, started.failures, started.warnings
    folder, device = loaded.folder, loaded.device
    if not use_pto:
        ignored = [
            flag
            for flag, used in (
                ("--ops", options.ops),
                ("--use_dynamic_config", options.use_dynamic_config),
                ("--kernel-backend", options.kernel_backend),
                ("--strict", options.strict),
            )
            if used
        ]
        if ignored:
            warnings.append(
                f"{', '.join(ignored)} only matter without --baseline-only; ran the baseline only"
            )
    compiled = apply_compile(loaded.model, options, warnings, kernels=loaded.kernels)
    atol, rtol = tolerances(options.dtype, options.atol, options.rtol, compiled=compiled is not None)
    if single is None:
        single, description = encode_prompt(loaded, options.prompt, options.image, options.simple_prompt)
    inputs = repeat_for_batch(single, options.batch, device)

    lookup = None
    if use_pto and options.use_dynamic_config:
        lookup = lookup_for_run(loaded, warnings, compiled)
    choice = (
        modes_for(plan, options.batch, options, lookup)
        if use_pto
        else OpChoice((), None, backend_for(None, options.kernel_backend), options.kernel_backend)
    )
    switched_on, table, kernel_backend = choice.switched_on, choice.table, choice.backend
    watch = CompileWatch(compiled) if compiled is not None else None
    modes = KernelModes(loaded.kernels, choice, watch)
    label = run_label(compiled)

    judgements: dict[str, RunJudgement] = {}
    base_run = None
    if use_pto:
        judged = judge_cases(loaded, [JudgedCase(inputs, reference_run)], modes, atol, rtol, failures, label)
        judgements = {run: runs[0] for run, runs in judged.items()}
    else:
        with modes.baseline(failures):
            base_run = generate(loaded, inputs, options.output_length, fixed_length=False, logits=False)
    progress.phase(f"timed runs ({options.warmup} warm-up, {options.iters} timed a mode)")
    with modes.pto() if use_pto else nullcontext():  # the PTO counters include the timed runs'
        timed = measure_modes(
            loaded,
            inputs,
            modes.switches,
            batch=options.batch,
            new_tokens=options.output_length,
            warmup=options.warmup,
            iters=options.iters,
        )
    baseline = timed[BASELINE]

    report = VerifyReport(
        model_path=str(folder),
        device=device.name,
        device_reason=device.reason,
        dtype=loaded.dtype_name,
        versions=versions(),
        input=description,
        load_info=loaded.load_info,
        baseline=baseline,
        failures=failures,
        warnings=warnings,
        patched_ops=list(loaded.state.patched_ops),
        switched_on=list(switched_on),
        kernel_backend=describe_backend(kernel_backend) if use_pto else None,
        dynamic_config=table,
        dynamic_config_source=lookup.to_json() if lookup else None,
        pto_kernels_path=str(module_dir(loaded.kernels)) if loaded.kernels is not None else None,
        modified_files=list(loaded.state.modified_files),
        allow_modified=options.allow_modified,
        rope_fixes=loaded.rope_fixes,
        compile=compiled.description if compiled else None,
        peak_memory_source=peak_memory_source(device),
        options=options.to_json(),
        other_patchers=list(loaded.other_patchers),
        random_weights=loaded.random_weights,
    )

    if use_pto:
        report.pto = timed[PTO]
        report.ops, more_failures, more_warnings = modes.op_checks(options.strict, loaded.text_layers)
        report.failures += more_failures
        report.warnings += more_warnings
        report.mode = label
        report.rule = VERDICT_RULE.format(k=TRACE_TOP_K)
        report.reference = {**reference_info, "text": reference_run.texts[0] if reference_run.texts else ""}
        report.judged = judgements
        report.accuracy = accuracy_of(judgements, reference_run, loaded.tokenizer)
        if not switched_on:
            report.warnings.append("no op was switched on, so the PTO run equals the baseline")
    else:
        text = loaded.tokenizer.decode(base_run.new_tokens[0], skip_special_tokens=True)
        report.input["baseline_text"] = text
    # Nothing compiles after the timed runs: the watch closes here, its verdict after the other checks'.
    report.compilation = finish_watch(watch, report.failures, report.warnings)
    report.failures += started.folder_changes()  # a restore or edit meanwhile fails the run

    return report


def run_verify(options: VerifyOptions) -> VerifyReport:
    report = verify_model(options)  # a --report-file in a hub cache is refused in its plan, before the run
    if options.report_file is not None:
        report.report_file = str(options.report_file)
        if not write_report(report.to_json(), options.report_file):
            report.report_file = None  # kept in the cache instead: the CLI names where
    return report


def accuracy_of(judgements: dict[str, RunJudgement], reference, tokenizer) -> Accuracy:
    """The PTO run's judgement in the accuracy record's fields (its texts: each run's own greedy choices)."""
    pto, base = judgements[PTO], judgements[BASELINE]

    def text(judgement: RunJudgement) -> str:
        if judgement.choices is None:
            return ""
        return tokenizer.batch_decode(judgement.choices, skip_special_tokens=True)[0]

    reference_text = reference.texts[0] if reference.texts else ""
    scale = pto.worst_scale
    return Accuracy(
        max_abs_logit_diff=pto.worst_diff,
        max_rel_logit_diff=pto.worst_diff / scale
        if scale > 0
        else (0.0 if pto.worst_diff == 0 else float("inf")),
        token_match_rate=pto.choice_match_rate,
        text_equal=text(pto) == reference_text,
        passed=pto.passed and base.passed,
        atol=pto.atol,
        rtol=pto.rtol,
        logits_within_tolerance=pto.passed,
        baseline_text=text(base),
        pto_text=text(pto),
        reference_text=reference_text,
        worst_step=pto.worst_step,
        steps_judged=pto.steps_judged,
        first_choice_divergence=pto.first_choice_divergence,
    )
