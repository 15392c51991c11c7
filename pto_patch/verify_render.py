"""Rendering of `verify`, `bench` and `demo` results: rich tables, or exactly one JSON document."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from pto_patch.console import err, out, print_json
from pto_patch.report import DEMO_TIMING_NOTE, ratio_of


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


def _pct(new: float | None, old: float | None) -> str:
    if new is None or not old:
        return "-"
    return f"{(new - old) / old * 100:+.1f} %"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


# (label, per-mode key, digits): the rows verify's and bench's timing tables share.
MODE_ROWS = (
    ("load (s, shared)", "load_s", 3),
    ("latency (s)", "latency_s", 4),
    ("tokens per run", "tokens", 0),
    ("tokens / s", "tokens_per_s", 2),
    ("tokens / s, median run", "tokens_per_s_median", 2),
    ("peak memory (MB)", "peak_memory_mb", 1),
)


def _messages(failures: list[str], warnings: list[str]) -> None:
    for warning in warnings:
        err.print(f"[yellow]warning:[/] {warning}", markup=True, highlight=False)
    for failure in failures:
        err.print(f"[bold red]failed:[/] {failure}", markup=True, highlight=False)


# --- verify ---------------------------------------------------------------------------------------


def verify_report(report, *, as_json: bool) -> None:
    doc = report.to_json()
    if as_json:
        print_json(doc)
        return
    source = doc["input"]
    what = f"image {source.get('image')}" if source["kind"] == "image" else f"prompt {source['prompt']!r}"
    out.print(f"verify {doc['model_path']}")
    out.print(
        f"  device {doc['device']} ({doc['device_reason']}), {doc['dtype']}, {what}, "
        f"{source['prompt_tokens']} prompt tokens, batch {doc['baseline']['batch']}"
    )
    if doc["pto_kernels_path"]:
        out.print(f"  pto_kernels from {doc['pto_kernels_path']} (backend {doc['kernel_backend']})")
    load = doc["load_info"]
    out.print(
        f"  load info: {len(load['missing_keys'])} missing, {len(load['unexpected_keys'])} unexpected, "
        f"{len(load['mismatched_keys'])} mismatched key(s)"
        + ("" if load["lm_head_tied"] is None else f", lm_head tied: {load['lm_head_tied']}")
    )
    for fix in doc["rope_fixes"]:
        out.print(f"  rope fix: {fix}")
    _other_patchers(doc["other_patchers"])
    if doc["compile"]:
        out.print(f"  compiled: {doc['compile']}")
    if doc["dynamic_config"]:
        _dynamic_source(doc.get("dynamic_config_source"))
        _dynamic_table(doc["dynamic_config"])
    _timing_table(doc)
    if doc["pto"] is not None:
        _ops_table(doc["pto"]["ops"])
        _accuracy(doc["accuracy"])
    elif source.get("baseline_text") is not None:
        out.print(f"  baseline text: {source['baseline_text']!r}")
    _messages(doc["failures"], doc["warnings"])
    if doc["report_file"]:
        out.print(f"  report written to {doc['report_file']}")
    if doc["passed"]:
        out.print("[bold green]PASSED[/]", markup=True)
    else:
        out.print(f"[bold red]FAILED[/] ({len(doc['failures'])} check(s)); exit code 3", markup=True)


def _other_patchers(patchers: list[dict[str, Any]]) -> None:
    """One line: none, or per op how many modules another patcher took over (and the first of them)."""
    if not patchers:
        out.print("  other patchers: none")
        return
    groups: dict[tuple[Any, bool], list[dict[str, Any]]] = {}
    for patcher in patchers:
        groups.setdefault((patcher["op"], patcher["bypasses"]), []).append(patcher)
    parts = []
    for (op, bypasses), found in groups.items():
        first = found[0]
        if op is None:
            parts.extend(entry["how"] for entry in found)
            continue
        verdict = "bypass the guard" if bypasses else "still reach the guard"
        parts.append(f"{op}: {len(found)} module(s) {verdict}, first {first['module']} ({first['how']})")
    out.print("  other patchers: " + "; ".join(parts), markup=False, highlight=False)


def _dynamic_source(source: dict[str, Any] | None) -> None:
    if source:
        out.print(f"  --use_dynamic_config from the {source['source']}: {source['reason']}", markup=False)


def _dynamic_table(rows: list[dict[str, Any]]) -> None:
    table = Table(title="--use_dynamic_config", title_justify="left")
    table.add_column("op")
    table.add_column("switched on")
    table.add_column("reason")
    for row in rows:
        table.add_row(row["op"], "yes" if row["enabled"] else "no", row["reason"])
    out.print(table)


def _timing_table(doc: dict[str, Any]) -> None:
    base, pto, ratios = doc["baseline"], doc["pto"], doc["ratios"]
    table = Table(title="timing (mean over the timed runs, after warm-up)", title_justify="left")
    table.add_column("metric")
    table.add_column("baseline", justify="right")
    if pto is not None:
        table.add_column("PTO", justify="right")
        table.add_column("PTO / baseline", justify="right")
    for label, key, digits in MODE_ROWS:
        cells = [label, _fmt(base[key], digits)]
        if pto is not None:
            cells += [_fmt(pto[key], digits), _times(ratios.get(key, ratio_of(pto[key], base[key])))]
        table.add_row(*cells)
    out.print(table)
    out.print(f"  peak memory: {doc['peak_memory_source']}")


def _ops_table(ops: dict[str, Any]) -> None:
    table = Table(title="kernels", title_justify="left")
    for column in ("op", "switched on", "backend", "calls", "fallbacks"):
        table.add_column(column, justify="right" if column in ("calls", "fallbacks") else "left")
    for op, entry in ops.items():
        backends = ", ".join(f"{name} {count}" for name, count in entry["backends"].items())
        table.add_row(
            op,
            "yes" if entry["switched_on"] else "no",
            backends or (entry["backend"] or "-"),
            str(entry["calls"]),
            str(entry["fallbacks"]),
        )
    out.print(table)


def _accuracy(acc: dict[str, Any]) -> None:
    table = Table(title="accuracy (PTO vs baseline, same inputs, greedy)", title_justify="left")
    table.add_column("check")
    table.add_column("value", justify="right")
    table.add_row("max |logit diff|, first step", f"{acc['max_abs_logit_diff']:.4g}")
    table.add_row("  relative to max |logit|", f"{acc['max_rel_logit_diff']:.4g}")
    table.add_row("  tolerance", f"atol {acc['atol']:g} + rtol {acc['rtol']:g} x max|logit|")
    table.add_row("token match rate", f"{acc['token_match_rate'] * 100:.1f} %")
    table.add_row("decoded texts equal", "yes" if acc["text_equal"] else "no")
    table.add_row("logits within tolerance", "yes" if acc["logits_within_tolerance"] else "[red]no[/]")
    out.print(table)


# --- bench ----------------------------------------------------------------------------------------


def bench_result(result, *, as_json: bool) -> None:
    doc = result.to_json()
    if as_json:
        print_json(doc)
        return
    out.print(f"bench {doc['model_path']} on {doc['device']} ({doc['dtype']}), input {doc['input']['kind']}")
    table = Table(title="baseline vs PTO (mean over the timed runs)", title_justify="left")
    for column in ("batch", "metric", "baseline", "PTO", "difference"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    rows = MODE_ROWS + (
        ("decode step (ms)", "decode_step_ms", 2),
        ("bandwidth floor / step", "bandwidth_fraction", 4),
    )
    for run in doc["runs"]:
        base, pto = run["baseline"], run["pto"]
        for index, (label, key, digits) in enumerate(rows):
            table.add_row(
                str(run["batch"]) if index == 0 else "",
                label,
                _fmt(base.get(key), digits),
                _fmt(pto.get(key), digits),
                _pct(pto.get(key), base.get(key)),
                end_section=index == len(rows) - 1,
            )
    out.print(table)
    floor = doc["bandwidth"]
    out.print(
        f"  bandwidth floor per decode step: {floor['weight_bytes_per_token'] / 2**20:.1f} MiB of weights "
        f"/ {floor['copy_bandwidth_gb_s']:.2f} GB/s copy bandwidth = {floor['floor_ms']:.2f} ms"
    )
    out.print(f"  peak memory: {doc['peak_memory_source']}")
    _dynamic_source(doc.get("dynamic_config_source"))
    for run in doc["runs"]:
        if run.get("switched_on") is not None:
            ops = ", ".join(run["switched_on"]) or "none"
            out.print(f"  batch {run['batch']}: switched on {ops}")
        for row in run.get("dynamic_config") or ():
            on = f"on ({row['backend']})" if row.get("backend") else ("on" if row["enabled"] else "off")
            out.print(f"    {row['op']}: {on} ({row['reason']})", markup=False)
    for path in doc["files"]:
        out.print(f"  wrote {path}")
    _messages(doc["failures"], doc["warnings"])
    if not doc["passed"]:
        out.print(f"[bold red]FAILED[/] ({len(doc['failures'])} check(s)); exit code 3", markup=True)


# --- demo -----------------------------------------------------------------------------------------


def demo_step(name: str, result: Any, seconds: float, as_json: bool) -> None:
    """Progress while the demo runs (stderr under --json, so stdout keeps one document)."""
    from pto_patch import render

    if as_json:
        err.print(f"demo: {name} done in {seconds:.1f} s")
        return
    out.rule(f"{name} ({seconds:.1f} s)")
    if name == "make-tiny":
        render.make_tiny_result(result, as_json=False)
    elif name == "apply":
        render.apply_result(result, as_json=False)
    elif name == "status":
        render.status_result(result, as_json=False)
    elif name == "verify --use_pto":
        verify_report(result, as_json=False)
        out.print(f"[yellow]note:[/] {DEMO_TIMING_NOTE}", markup=True, highlight=False)
    elif name == "restore":
        render.restore_result(result, as_json=False)


def demo_result(result, *, as_json: bool) -> None:
    doc = result.to_json()
    if as_json:
        print_json(doc)
        return
    out.rule("result")
    same = doc["hashes_identical"]
    out.print(
        f"folder hashes after restore: {'identical to' if same else '[red]DIFFERENT from[/]'} "
        f"the originals ({doc['files_compared']} files)",
        markup=True,
    )
    for path in doc["hash_differences"]:
        out.print(f"  differs: {path}")
    if doc["kept"]:
        out.print(f"kept {doc['directory']} (--keep)")
    else:
        out.print(f"removed {doc['directory']}")
    out.print(f"demo finished in {doc['seconds']:.1f} s")
    if doc["passed"]:
        out.print("[bold green]PASSED[/]", markup=True)
    else:
        out.print("[bold red]FAILED[/]; exit code 3", markup=True)
