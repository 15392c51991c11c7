"""verify's judgement as text: the reference, the mode's two runs judged against it, the rule, the PTO
run's accuracy record, and what ran (the kernels table, shared with verify --ocr)."""

from __future__ import annotations

from pto_patch.cli.console import folding_table, out


def accuracy_text(acc) -> None:
    table = folding_table(
        title="accuracy (PTO run against the unpatched eager model, every step, teacher-forced)",
        title_justify="left",
    )
    table.add_column("check")
    table.add_column("value", justify="right")
    table.add_row("max |logit diff|, every step", f"{acc.max_abs_logit_diff:.4g}")
    table.add_row("  at step", "-" if acc.worst_step is None else str(acc.worst_step))
    table.add_row("  relative to max |logit|", f"{acc.max_rel_logit_diff:.4g}")
    table.add_row("  tolerance", f"atol {acc.atol:g} + rtol {acc.rtol:g} x max|logit|")
    table.add_row("steps judged", str(acc.steps_judged))
    table.add_row("greedy choices as the reference's", f"{acc.token_match_rate * 100:.1f} %")
    table.add_row("decoded texts equal", "yes" if acc.text_equal else "no")
    table.add_row("logits within tolerance", "yes" if acc.logits_within_tolerance else "[red]no[/]")
    out.print(table)


def judged_text(report) -> None:
    """The reference, the mode's two runs judged against it, and the rule, side by side."""
    if not report.judged:
        return
    reference = report.reference or {}
    out.print(f"  reference: {reference.get('what', 'the unpatched model, eager')}", markup=False)
    table = folding_table(title=f"judged against the reference ({report.mode})", title_justify="left")
    for column in ("run", "steps", "worst diff", "at step", "tolerance", "verdict"):
        table.add_column(column, justify="left" if column in ("run", "verdict") else "right")
    table.add_row("eager unpatched (reference)", "-", "-", "-", "-", "the truth")
    names = {"baseline": f"{report.mode}, kernels off", "pto": f"{report.mode}, kernels on"}
    for run, judgement in report.judged.items():
        table.add_row(
            names.get(run, run), *_judged_cells(judgement), "pass" if judgement.passed else "[red]FAIL[/]"
        )
    out.print(table)
    if report.rule:
        out.print(f"  rule: {report.rule}", markup=False, highlight=False)


def ops_table(ops) -> None:
    """Per op: switched on, the backend that really ran each call, calls (per layer) and fallbacks."""
    table = folding_table(title="kernels", title_justify="left")
    for column in ("op", "switched on", "backend", "calls", "fallbacks"):
        table.add_column(column, justify="right" if column in ("calls", "fallbacks") else "left")
    for op, entry in ops.items():
        backends = ", ".join(f"{name} {count}" for name, count in entry.backends.items())
        inside = f"inside {entry.inside}" if entry.inside else None
        per_layer = f" ({entry.calls_per_layer:g} per layer)" if entry.calls_per_layer and entry.calls else ""
        if entry.cache_writes:
            per_layer += f", {entry.cache_writes} writing the KV cache"
        table.add_row(
            op,
            "yes" if entry.switched_on else "no",
            backends or inside or (entry.backend or "-"),
            f"{entry.calls}{per_layer}",
            str(entry.fallbacks),
        )
    out.print(table)


def judged_readings_text(report) -> None:
    """verify --ocr: per run, the (page, task)s judged against the reference and the worst of them."""
    runs = {}
    for reading in report.readings:
        if reading.judged is not None:
            runs.setdefault(reading.mode, []).append(reading)
    if not runs:
        return
    out.print(
        f"  reference: {(report.reference or {}).get('what', 'the unpatched model, eager')}", markup=False
    )
    table = folding_table(title=f"judged against the reference ({report.mode})", title_justify="left")
    for column in ("run", "readings passed", "steps", "worst diff", "at", "tolerance"):
        table.add_column(column, justify="left" if column in ("run", "at") else "right")
    names = {"baseline": f"{report.mode}, kernels off", "pto": f"{report.mode}, kernels on"}
    for run, readings in runs.items():
        worst = max(readings, key=lambda r: r.judged.worst_relative)
        step = worst.judged.worst_step
        table.add_row(
            names.get(run, run),
            f"{sum(r.judged.passed for r in readings)} / {len(readings)}",
            str(sum(r.judged.steps_judged for r in readings)),
            f"{worst.judged.worst_diff:.4g}",
            f"{worst.page} {worst.task}" + ("" if step is None else f", step {step}"),
            f"{worst.judged.worst_tolerance:.4g}",
        )
    out.print(table)
    if report.rule:
        out.print(f"  rule: {report.rule}", markup=False, highlight=False)


def vllm_judged_text(report) -> None:
    """verify --engine vllm: the transformers eager reference and each vLLM run judged against it."""
    if not report.judged:
        return
    reference = report.reference or {}
    out.print(f"  reference: {reference.get('what', 'the unpatched model, eager')}", markup=False)
    table = folding_table(title="judged against the reference (vLLM)", title_justify="left")
    for column in ("run", "steps", "worst logprob diff", "at step", "bound", "first divergence", "verdict"):
        table.add_column(column, justify="left" if column in ("run", "verdict") else "right")
    table.add_row("transformers eager (reference)", "-", "-", "-", "-", "-", "the truth")
    names = {"baseline": "vLLM, plugin's ops off", "pto": "vLLM + PTO"}
    for run, judgement in report.judged.items():
        divergence = judgement.first_choice_divergence
        if divergence is None:
            where = "none"
        else:
            where = f"{divergence} ({'near tie' if judgement.divergence_near_tie else 'no near tie'})"
        table.add_row(
            names.get(run, run),
            *_judged_cells(judgement),
            where,
            "pass" if judgement.passed else "[red]FAIL[/]",
        )
    out.print(table)
    out.print(f"  reference text: {reference.get('text', '')!r}", markup=False, highlight=False)
    if report.rule:
        out.print(f"  rule: {report.rule}", markup=False, highlight=False)


def _judged_cells(judgement) -> list[str]:
    """A judged run's steps, worst difference, its step and the tolerance there (both judged tables)."""
    return [
        str(judgement.steps_judged),
        f"{judgement.worst_diff:.4g}",
        "-" if judgement.worst_step is None else str(judgement.worst_step),
        f"{judgement.worst_tolerance:.4g}",
    ]
