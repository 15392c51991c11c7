"""A verify run: load the patched folder once, run it with the kernels off and on, compare.

The run mirrors the reference system's run script (warm-up, timed runs, a JSON report), and adds
what it lacked: the patched code must be exactly what `apply` wrote, every checkpoint key must load
(a random-weight model never passes), each switched-on op must actually run, and the PTO run must
compute what the baseline computes within the dtype's tolerance. `pto-patch verify` and
`pto-patch demo` both run it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pto_patch.patching.folder_kernels import module_dir
from pto_patch.patching.tuning_file import describe_backend, lookup_for_run
from pto_patch.run.device import peak_memory_source
from pto_patch.run.generation import compare, generate, measure_modes, tolerances
from pto_patch.run.graph.compiling import CompileWatch, apply_compile, finish_watch
from pto_patch.run.inputs import encode_prompt, repeat_for_batch
from pto_patch.run.loading import versions
from pto_patch.run.ops import backend_for, choose_ops, op_failures, op_reports, set_switches
from pto_patch.run.options import RunOptions
from pto_patch.run.options import compares as options_compares
from pto_patch.run.report import VerifyReport
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


def verify_model(options: VerifyOptions) -> VerifyReport:
    """Baseline, then PTO on the same inputs (unless --baseline-only), then both timed; every check in
    the report."""
    use_pto = compares(options)
    plan = plan_run(options, batch=options.batch, use_pto=use_pto, report_file=options.report_file)
    started = start_run(plan)
    loaded, failures, warnings = started.loaded, started.failures, started.warnings
    spec, folder, device = loaded.spec, loaded.folder, loaded.device
    atol, rtol = tolerances(options.dtype, options.atol, options.rtol)
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
    inputs, description = encode_prompt(loaded, options.prompt, options.image, options.simple_prompt)
    inputs = repeat_for_batch(inputs, options.batch, device)

    switched_on: tuple[str, ...] = ()
    table = lookup = None
    if use_pto:
        if options.use_dynamic_config:
            lookup = lookup_for_run(loaded, warnings, compiled)
        switched_on, table = choose_ops(
            plan.ops,
            spec,
            loaded.state,
            options.batch,
            options.use_dynamic_config,
            tuning=lookup.tuning if lookup else None,
        )
    kernel_backend = backend_for(table, options.kernel_backend)

    # The accuracy runs: switches off, then on, on the same inputs; then the timed runs of both modes.
    kernels = loaded.kernels
    switches: dict[str, Callable[[], None]] = {"baseline": kernels.disable if kernels else lambda: None}
    if use_pto:
        switches["pto"] = lambda: set_switches(kernels, switched_on, kernel_backend)
    watch = CompileWatch(compiled) if compiled is not None else None
    if watch is not None:
        switches = watch.wrap(switches)
    switches["baseline"]()
    if kernels is not None:
        kernels.reset_stats()
    base_run = generate(loaded, inputs, options.output_length, fixed_length=False, logits=True)
    if kernels is not None:
        stray = {op: entry["calls"] for op, entry in kernels.stats().items() if entry.get("calls")}
        if stray:
            failures.append(f"kernels ran with every switch off: {stray}")
    pto_run, stats = None, {}
    try:
        if use_pto:
            switches["pto"]()
            pto_run = generate(loaded, inputs, options.output_length, fixed_length=False, logits=True)
        timed = measure_modes(
            loaded,
            inputs,
            switches,
            batch=options.batch,
            new_tokens=options.output_length,
            warmup=options.warmup,
            iters=options.iters,
        )
    finally:
        if kernels is not None:
            stats = kernels.stats()  # only the PTO runs count: the switches are off for the baseline
            kernels.disable()
    baseline = timed["baseline"]

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
    )

    if use_pto:
        report.pto = timed["pto"]
        report.ops = op_reports(stats, switched_on, loaded.text_layers)
        more_failures, more_warnings = op_failures(report.ops, options.strict)
        report.failures += more_failures
        report.warnings += more_warnings
        report.accuracy = compare(base_run, pto_run, loaded.tokenizer, atol, rtol)
        if not report.accuracy.logits_within_tolerance:
            report.failures.append(
                f"first-step logits differ by {report.accuracy.max_abs_logit_diff:.4g} "
                f"(> atol {atol:g} + rtol {rtol:g} x max|logit|)"
            )
        if not switched_on:
            report.warnings.append("no op was switched on, so the PTO run equals the baseline")
    else:
        text = loaded.tokenizer.decode(base_run.new_tokens[0], skip_special_tokens=True)
        report.input["baseline_text"] = text
    # Nothing compiles after the timed runs: the watch closes here, its verdict after the other checks'.
    report.compilation = finish_watch(watch, report.failures, report.warnings)

    return report
