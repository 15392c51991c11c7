"""Text output of `verify --ocr` and `bench --ocr` (their JSON is the report's own document)."""

from __future__ import annotations

from pto_patch.cli.console import err, escape, folding_table, out
from pto_patch.cli.judged_render import judged_readings_text, ops_table


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _messages(result) -> None:
    for note in result.notes:
        out.print(f"[yellow]note:[/] {escape(note)}", markup=True, highlight=False)
    for warning in result.warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}", markup=True, highlight=False)
    for failure in result.failures:
        err.print(f"[bold red]failed:[/] {escape(failure)}", markup=True, highlight=False)


def _verdict(result) -> None:
    if result.passed and not getattr(result, "compared", True):
        out.print("[bold yellow]BASELINE ONLY[/]: nothing was compared, so nothing is verified", markup=True)
    elif result.passed:
        out.print("[bold green]PASSED[/]", markup=True)
    else:
        out.print(f"[bold red]FAILED[/] ({len(result.failures)} check(s)); exit code 3", markup=True)


def ocr_verify_text(report) -> None:
    from pto_patch.run.ocr.report import mode_summary

    out.print(f"verify --ocr {report.model_path}")
    out.print(
        f"  device {report.device} ({report.device_reason}), {report.dtype}, {len(report.pages)} page(s), "
        f"tasks {', '.join(report.tasks)}, up to {report.output_length} new tokens per answer"
    )
    modes = report.modes()
    table = folding_table(
        title="CER against the truth (lower is better; LINES: parsed, box F1)", title_justify="left"
    )
    table.add_column("page")
    table.add_column("task")
    for mode in modes:
        table.add_column(mode, justify="right")
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for r in report.readings:
        text = _num(r.score.cer)
        if r.task == "LINES":
            text += f" ({'parsed' if r.score.parsed else 'not JSON'}, F1 {_num(r.score.box_f1, 2)})"
        if r.truncated:
            text += " *"
        cells.setdefault((r.page, r.task), {})[r.mode] = text
    for (page, task), row in cells.items():
        table.add_row(page, task, *(row.get(mode, "-") for mode in modes))
    out.print(table)
    out.print("  * the answer stopped at --output_length")
    summary = folding_table(title="per mode", title_justify="left")
    for column in ("mode", "mean CER", "mean WER", "LINES parsed", "mean box F1"):
        summary.add_column(column, justify="left" if column == "mode" else "right")
    for mode in modes:
        s = mode_summary([r for r in report.readings if r.mode == mode])
        summary.add_row(
            mode,
            _num(s["mean_cer"]),
            _num(s["mean_wer"]),
            f"{s['lines_parsed']} / {s['lines_answers']}",
            _num(s["mean_box_f1"]),
        )
    out.print(summary)
    if report.comparisons:
        worst = max(report.comparisons, key=lambda c: c.cer_rise)
        out.print(
            f"  largest CER rise: {worst.candidate} against {worst.reference}, page {worst.page} "
            f"{worst.task}: {worst.cer_rise:+.3f} (margins: {report.margins['reading_cer_rise']} per reading, "
            f"{report.margins['mean_cer_rise']} on the mean)"
        )
    judged_readings_text(report)
    if report.ops:
        ops_table(report.ops)
    if report.saved_outputs:
        out.print(f"  answers saved to {report.saved_outputs}")
    if report.against_outputs:
        trusted = report.against_outputs
        out.print(f"  compared with {trusted['file']} (read on {trusted['device']}, {trusted['dtype']})")
    _messages(report)
    _verdict(report)


def _page_speed_lines(result) -> None:
    """Per page and batch: PTO's speed over the baseline's per timed round, with its noise band."""
    from pto_patch.run.noise import describe

    for base, pto in result.pairs():
        out.print(
            f"  {base.page}, batch {base.batch}: PTO speed / baseline, per timed round: "
            f"{describe(result.speed(base, pto))}",
            markup=False,
        )


def page_bench_text(result) -> None:
    out.print(f"bench --ocr {result.model_path} on {result.device} ({result.dtype}), task {result.task}")
    table = folding_table(title="a page's time (median of the timed runs)", title_justify="left")
    columns = (
        "page",
        "b",
        "mode",
        "img tok",
        "vision s",
        "prefill s",
        "TTFT s",
        "dec tok/s",
        "page s",
        "pg/min",
    )
    for column in columns:
        table.add_column(column, justify="left" if column in ("page", "mode") else "right")
    for run in result.runs:
        table.add_row(
            run.page,
            str(run.batch),
            run.mode,
            str(run.image_tokens),
            _num(run.vision_s),
            _num(run.prefill_s),
            _num(run.first_token_s),
            _num(run.decode_tokens_per_s, 1),
            _num(run.latency_s),
            _num(run.pages_per_minute, 2),
        )
    out.print(table)
    out.print("  b: batch; img tok: image tokens; TTFT: time to the first token; pg/min: pages per minute")
    _page_speed_lines(result)
    for run in result.runs:
        split = run.split()
        if split:
            out.print(
                f"  {run.page}, batch {run.batch}, {run.mode}: vision {split['vision'] * 100:.1f} %, "
                f"prefill {split['prefill'] * 100:.1f} %, decode {split['decode'] * 100:.1f} % "
                f"of {run.latency_s:.3f} s ({run.new_tokens} new tokens)"
            )
    if result.ops:
        ops_table(result.ops)
    if result.plot:
        out.print(f"  plot written to {result.plot}")
    for path in result.files:
        out.print(f"  wrote {path}")
    _messages(result)
    _verdict(result)
