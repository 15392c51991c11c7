"""All text output of the commands, and the one place that chooses text or JSON.

A command returns a result object; `show` prints it once: exactly one JSON document with --json
(`report.json_document`, one schema version), else text on the terminal. The text renderers
read the result's fields, never its JSON.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from typing import Any

from pto_patch.cli.compile_render import compilation_text
from pto_patch.cli.console import err, escape, out, print_json
from pto_patch.cli.judged_render import accuracy_text, judged_text, ops_table, vllm_judged_text
from pto_patch.errors import EXIT_ERROR, EXIT_OK


def _table(*headers: str, **options):
    from pto_patch.cli.console import folding_table  # text output only: --json never imports rich

    return folding_table(*headers, **options)


def show(result: Any, *, as_json: bool) -> None:
    """Print one command's result: exactly one JSON document, or text. Writes the run could not make
    after its work (run/kept_results) follow its verdict: a `kept` list in the document, or one error
    line and a hint each."""
    kept = _kept_writes()
    if as_json:
        from pto_patch.run.report import json_document  # text output never needs the report module

        document = json_document(result)
        if kept:
            document["kept"] = [write.to_json() for write in kept]
        print_json(document)
        return
    TEXT[type(result).__name__](result)
    for write in kept:
        err.print(f"[bold red]error:[/] {escape(write.line())}", markup=True, highlight=False)
        err.print(f"[bold]hint:[/] {escape(write.hint())}", markup=True, highlight=False)


def exit_code(result: Any) -> int:
    """The command's exit code: its result's, or 1 (an error) where the verdict passed but a write failed
    and was kept (the verdict is printed either way; a failed one keeps its own code)."""
    code = result.exit_code
    return EXIT_ERROR if code == EXIT_OK and _kept_writes() else code


def _kept_writes() -> list:
    kept = sys.modules.get("pto_patch.run.kept_results")  # never imported: nothing was kept
    return kept.kept_writes() if kept is not None else []


def demo_progress(result: Any, step: str, seconds: float, *, as_json: bool) -> None:
    """One finished demo step (on stderr under --json, so stdout keeps its one document)."""
    if as_json:
        err.print(f"demo: {step} done in {seconds:.1f} s")
        return
    out.rule(f"{step} ({seconds:.1f} s)")
    show(result, as_json=False)
    if type(result).__name__ == "VerifyReport":
        from pto_patch.run.report import DEMO_TIMING_NOTE

        out.print(f"[yellow]note:[/] {DEMO_TIMING_NOTE}", markup=True, highlight=False)


# --- apply, restore, status -----------------------------------------------------------------------


def _apply_text(result) -> None:
    if result.already_applied:
        out.print(f"{result.folder} is already patched (ops: {', '.join(result.ops)}); nothing to do.")
        return
    if result.dry_run:
        sys.stdout.write(result.diff)
        err.print(
            f"dry run: would change {len(result.files)} file(s) in {result.folder} "
            f"(ops: {', '.join(result.ops)}); nothing written."
        )
        return
    if result.rolled_back_interrupted:
        err.print("rolled back an interrupted apply before applying again")
    if result.overlay_of is not None:
        out.print(f"overlay of {result.overlay_of} (left untouched) written to {result.folder}")
    out.print(
        f"patched {result.folder} for ops {', '.join(result.ops)} "
        f"(source: transformers {result.source_release or result.release}, {result.source})"
    )
    added = sum(1 for _, action in result.files if action == "added")
    out.print(f"  {len(result.files) - added} file(s) modified, {added} added, in {result.elapsed_s:.2f} s")
    _config_changes(result.config_changes)
    out.print("  undo with: pto-patch restore --model-path " + str(result.folder))


def _config_changes(changes) -> None:
    """config.json's changes, one key a line: added keys by name, changed ones old -> new."""
    if changes:
        out.print("  config.json:")
    for change in changes:
        if change.change == "added":
            shown = f"{len(change.new)} keys" if isinstance(change.new, dict) else json.dumps(change.new)
            out.print(f"    {change.key} added ({shown})")
        else:
            out.print(f"    {change.key}: {json.dumps(change.old)} -> {json.dumps(change.new)}")


def _restore_text(result) -> None:
    if result.not_patched:
        out.print(f"{result.folder} is not patched; nothing to restore.")
        _left_behind(result)
        return
    if result.was_interrupted:
        err.print("the folder held an interrupted apply; it was rolled back")
    out.print(
        f"restored {result.folder}: {len(result.restored)} file(s) put back byte for byte, "
        f"{len(result.removed)} added file(s) removed, hashes checked, in {result.elapsed_s:.2f} s"
    )
    for path in result.kept_edited:
        out.print(f"  your edited copy was kept as {path}")
    for path in result.purged_module_caches:
        out.print(f"  removed stale remote-code copy {path}")
    if result.overlay_of is not None:
        gone = (
            "removed the overlay folder"
            if result.removed_folder
            else "removed what apply made in the overlay"
        )
        out.print(f"  {gone}; its source {result.overlay_of} was not touched")
    _left_behind(result)


def _left_behind(result) -> None:
    """Kept edits, and what neither the checkpoint nor the patch put in the folder (restore leaves both)."""
    earlier = [path for path in result.kept_edits if path not in getattr(result, "kept_edited", ())]
    if earlier:
        out.print("  kept edits from before: " + ", ".join(earlier))
    if result.unexpected:
        out.print("  not the checkpoint's nor the patch's, left as they are: " + ", ".join(result.unexpected))


def _status_text(result) -> None:
    table = _table(show_header=False, box=None)
    table.add_row("folder", escape(str(result.folder)))
    table.add_row("spec", escape(result.spec))
    if result.state == "in_progress":
        table.add_row("state", "[red]interrupted apply[/] (run pto-patch restore)")
    else:
        # the JSON's words: state "complete" (patched), or none
        table.add_row("state", f"patched ({result.state})" if result.patched else "not patched")
    if result.patched:
        table.add_row("ops", ", ".join(result.ops))
        found = ", ".join(f"{op}: {', '.join(targets)}" for op, targets in sorted(result.ops_found.items()))
        table.add_row("injections found", found or "[red]none[/]")
        release = f"{result.release_at_apply} at apply, {result.release_now} now"
        if result.needs_reapply:
            release += " [red](changed: restore, then apply again)[/]"
        table.add_row("transformers", release)
        table.add_row("drifted files", ", ".join(result.drifted) or "none")
    if result.overlay:
        table.add_row("overlay of", escape(str(result.overlay["source"])))
        changed = result.overlay["source_changed"]
        table.add_row(
            "source changed",
            ("[red]" + escape(", ".join(changed)) + "[/] (restore, then apply --overlay again)")
            if changed
            else "no",
        )
    if result.tuning:
        _tuning_rows(table, result.tuning)
    table.add_row("kept edits", escape(", ".join(result.kept_edits)) or "none")
    if result.unexpected:
        table.add_row("not the checkpoint's", escape(", ".join(result.unexpected)) + " (nor the patch's)")
    if result.download:
        table.add_row("downloaded", f"{result.download.get('repo_id')} @ {result.download.get('commit')}")
    out.print(table)


def _tuning_rows(table, tuning: dict[str, Any]) -> None:
    table.add_row("tuning", escape(tuning["file"]))
    verdict = "[green]used[/]" if tuning["applies"] else "[red]not used[/]"
    table.add_row("tuning applies", f"{verdict}: {escape(tuning['reason'])}")
    made = tuning["made_on"]
    if made:
        releases = ", ".join(f"{dist} {version}" for dist, version in made["versions"].items() if version)
        where = (
            f"{made['device']['kind']} '{made['device']['name']}', {made['dtype'] or 'dtype not recorded'}"
        )
        table.add_row("tuned on", escape(f"{where}; {releases}"))
    for entry in tuning["batches"]:
        chosen = ", ".join(f"{op}={backend}" for op, backend in entry["chosen"].items()) or "nothing on"
        table.add_row(f"  batch {entry['batch']}", escape(chosen))


# --- models, make-tiny, download, skill -----------------------------------------------------------


def _models_text(result) -> None:
    for entry in result.models:
        spec, shape = entry.spec, entry.to_json()["checkpoint"]
        where = "" if spec.builtin else f"  [{spec.source_path}]"
        out.print(
            f"[bold]{escape(spec.name)}[/]  {escape(spec.family.title)}  {escape(spec.hub_repo_id)}  "
            f"(${escape(spec.model_path_env)}){escape(where)}",
            highlight=False,
        )
        out.print(f"  {spec.description}", highlight=False)
        if shape["hidden_size"]:
            out.print(
                f"  text {shape['hidden_size']} / {shape['intermediate_size']}, "
                f"{shape['num_attention_heads']} / {shape['num_key_value_heads']} heads, "
                f"{shape['num_hidden_layers']} layers, vocab {shape['vocab_size']}, "
                f"{'tied' if spec.tie_word_embeddings else 'own'} lm_head; "
                f"vision {shape['vision_hidden_size']} -> {shape['vision_out_hidden_size']}",
                highlight=False,
            )
        for source in spec.sources:
            out.print(f"  source: {source['url']}: {source.get('what', '')}", highlight=False)
        for note in spec.disagreements:
            out.print(f"  sources disagree: {note}", highlight=False)


def _make_tiny_text(result) -> None:
    width = "full-width" if result.full_width else "tiny"
    out.print(
        f"wrote a {width} random-weight model to {result.path}: {result.layers} decoder layer(s), "
        f"{result.parameter_count:,} parameters, {len(result.files)} files"
    )
    model = "" if result.model == "gutenocr_3b" else f" --model {result.model}"
    out.print(f"  try: pto-patch apply{model} --model-path {result.path}")


def _download_text(result) -> None:
    total = result.total_size
    size = f"{total / 1e9:.2f} GB" if total >= 1e8 else f"{total / 1e6:.1f} MB"
    commit = result.commit or "unknown commit"
    what = f"{result.files} files, {size}"
    if result.offline:
        out.print(f"offline: {result.folder} is complete ({what}; {commit}); nothing fetched")
    elif result.checked_only:
        out.print(f"{result.folder} is already complete: {result.repo_id} @ {commit}, {what}")
    else:
        out.print(
            f"downloaded {result.repo_id} @ {commit} into {result.folder}: {what} "
            f"({len(result.fetched)} fetched, {len(result.already_present)} already there), "
            f"in {result.elapsed_s:.1f} s"
        )
    if not result.complete:
        out.print("  partial (--include/--exclude): the folder is not a complete model yet")
    else:
        out.print(f"  next: pto-patch apply --model-path {result.folder}")


def _skill_install_text(result) -> None:
    if result.action == "unchanged":
        out.print(
            f"{result.destination} already holds this pto-patch skill ({len(result.files)} files); nothing to do."
        )
        return
    verb = (
        "replaced the changed copy in"
        if result.action == "replaced"
        else "installed the pto-patch skill into"
    )
    out.print(f"{verb} {result.destination} ({len(result.files)} files)")
    out.print(f"  start with: {result.destination / 'SKILL.md'}")


# --- verify, bench, demo --------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(new: float | None, old: float | None, digits: int = 3) -> str:
    if new is None or not old:
        return "-"
    if _fmt(new, digits) == _fmt(old, digits):
        return "same as shown"  # a percentage between two equal-looking figures is noise of rounding
    return f"{(new - old) / old * 100:+.1f} %"


def _times(value: float | None, new: float | None = None, old: float | None = None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if new is not None and old is not None and _fmt(new, digits) == _fmt(old, digits):
        return "same as shown"
    return f"{value:.2f}x"


RANDOM_WEIGHTS_TIMING = " [indicative: random weights, this model's widths only]"


def _speed_line(label: str, estimate, ops=None, random_weights: bool = False) -> None:
    """The per-round speed ratio with its noise band, or why the runs say nothing yet; and, where a
    switched-on op never ran, that the ratio is no gain of its."""
    from pto_patch.run.noise import describe

    silent = [
        op for op, entry in (ops or {}).items() if entry.switched_on and not entry.calls and not entry.inside
    ]
    note = f" (no gain of {', '.join(silent)}: switched on, never ran)" if silent else ""
    note += RANDOM_WEIGHTS_TIMING if random_weights else ""
    out.print(f"  {label}: PTO speed / baseline, per timed round: {describe(estimate)}{note}", markup=False)


# (label, ModeMetrics attribute, digits): the rows verify's and bench's timing tables share.
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
        err.print(f"[yellow]warning:[/] {escape(warning)}", markup=True, highlight=False)
    for failure in failures:
        err.print(f"[bold red]failed:[/] {escape(failure)}", markup=True, highlight=False)


def _verdict(report) -> None:
    """A verify report's warnings and failures, where its JSON went, and PASSED or FAILED."""
    _messages(report.failures, report.warnings)
    if report.report_file:
        out.print(f"  report written to {report.report_file}")
    if report.passed and not getattr(report, "compared", True):
        out.print("[bold yellow]BASELINE ONLY[/]: nothing was compared, so nothing is verified", markup=True)
    elif report.passed:
        out.print("[bold green]PASSED[/]", markup=True)
    else:
        out.print(f"[bold red]FAILED[/] ({len(report.failures)} check(s)); exit code 3", markup=True)


def _verify_text(report) -> None:
    source = report.input
    what = f"image {source.get('image')}" if source["kind"] == "image" else f"prompt {source['prompt']!r}"
    out.print(f"verify {report.model_path}")
    out.print(
        f"  device {report.device} ({report.device_reason}), {report.dtype}, {what}, "
        f"{source['prompt_tokens']} prompt tokens, batch {report.baseline.batch}"
    )
    if report.pto_kernels_path:
        out.print(f"  pto_kernels from {report.pto_kernels_path} (backend {report.kernel_backend})")
    load = report.load_info
    out.print(
        f"  load info: {len(load.missing_keys)} missing, {len(load.unexpected_keys)} unexpected, "
        f"{len(load.mismatched_keys)} mismatched key(s)"
        + ("" if load.lm_head_tied is None else f", lm_head tied: {load.lm_head_tied}")
    )
    if load.hub_kernels:
        out.print(f"  hub kernels: {load.hub_kernels}", markup=False, highlight=False)
    for fix in report.rope_fixes:
        out.print(f"  rope fix: {fix}")
    _other_patchers(report.other_patchers)
    compilation_text(report.compile, report.compilation)
    if report.dynamic_config:
        _dynamic_source(report.dynamic_config_source)
        _dynamic_table(report.dynamic_config)
    _timing_table(report)
    if report.pto is not None:
        ops_table(report.ops)
        judged_text(report)
        accuracy_text(report.accuracy)
    elif source.get("baseline_text") is not None:
        out.print(f"  baseline text: {source['baseline_text']!r}")
    _verdict(report)


def _vllm_verify_text(report) -> None:
    source = report.input
    what = f"image {source['image']}" if source["kind"] == "image" else f"prompt {source['prompt']!r}"
    engine = "multi-process" if report.multiprocessing else "in-process"
    mode = "compiled" if report.compiled else "eager"
    out.print(f"verify --engine vllm {report.model_path}")
    out.print(
        f"  vLLM {report.vllm_version} on {report.device}, {report.dtype}, {engine} engine, {mode}; {what}, "
        f"{source['prompt_tokens']} prompt tokens, batch {source['batch']}, {source['output_length']} new tokens"
    )
    modes = [("baseline", report.baseline)] + ([("pto", report.pto)] if report.pto else [])
    table = _table("", *(name for name, _ in modes))
    for label, key in (("load (s)", "load_s"), ("latency (s)", "latency_s"), ("tokens / s", "tokens_per_s")):
        table.add_row(label, *(_fmt(run.get(key), 3) for _, run in modes))
    table.add_row("worker pids", *(", ".join(map(str, run["worker_pids"])) for _, run in modes))
    out.print(table)
    if report.pto is not None:
        out.print(f"  pto_kernels from {report.pto_kernels_path} (backend {report.kernel_backend})")
        ops = _table("op", "switched on", "calls (all workers)", "backends", "fallbacks")
        for op, entry in report.pto["ops"].items():
            backends = ", ".join(f"{name} {calls}" for name, calls in entry["backends"].items()) or "-"
            ops.add_row(
                op,
                "yes" if op in report.switched_on else "no",
                str(entry["calls"]),
                backends,
                str(entry["fallbacks"]),
            )
        out.print(ops)
        layers = ", ".join(f"{key} {n['pto']}/{n['built']}" for key, n in report.pto["layers"].items())
        out.print(f"  vLLM layers running pto_kernels: {layers or 'none'}")
        for key, entry in report.pto["layers"].items():
            for runs, n in entry.get("runs", {}).items():
                if runs != "pto_kernels":
                    out.print(f"  {key}: {n} layer(s) run {runs}", markup=False)
        acc = report.accuracy
        out.print(
            f"  greedy tokens, vLLM + PTO against vLLM's baseline: {acc['token_match_rate']:.1%} agree "
            f"({'equal' if acc['tokens_equal'] else 'differ'})"
        )
    vllm_judged_text(report)
    _verdict(report)


def _other_patchers(patchers) -> None:
    """One line: none, or per op how many modules another patcher took over (and the first of them)."""
    if not patchers:
        out.print("  other patchers: none")
        return
    groups: dict[tuple[Any, bool], list] = {}
    for patcher in patchers:
        groups.setdefault((patcher.op, patcher.bypasses), []).append(patcher)
    parts = []
    for (op, bypasses), found in groups.items():
        if op is None:
            parts.extend(entry.how for entry in found)
            continue
        verdict = "bypass the guard" if bypasses else "still reach the guard"
        parts.append(f"{op}: {len(found)} module(s) {verdict}, first {found[0].module} ({found[0].how})")
    out.print("  other patchers: " + "; ".join(parts), markup=False, highlight=False)


def _dynamic_source(source: dict[str, Any] | None) -> None:
    if source:
        out.print(f"  --use_dynamic_config from the {source['source']}: {source['reason']}", markup=False)


def _dynamic_table(rows: list[dict[str, Any]]) -> None:
    table = _table(title="--use_dynamic_config", title_justify="left")
    table.add_column("op")
    table.add_column("switched on")
    table.add_column("reason")
    for row in rows:
        table.add_row(row["op"], "yes" if row["enabled"] else "no", row["reason"])
    out.print(table)


def _timing_table(report) -> None:
    from pto_patch.run.report import ratio_of

    base, pto, ratios = report.baseline, report.pto, report.ratios()
    table = _table(title="timing (mean over the timed runs, after warm-up)", title_justify="left")
    table.add_column("metric")
    table.add_column("baseline", justify="right")
    if pto is not None:
        table.add_column("PTO", justify="right")
        table.add_column("PTO / baseline", justify="right")
    for label, key, digits in MODE_ROWS:
        cells = [label, _fmt(getattr(base, key), digits)]
        if pto is not None:
            ratio = ratios.get(key, ratio_of(getattr(pto, key), getattr(base, key)))
            cells += [
                _fmt(getattr(pto, key), digits),
                _times(ratio, getattr(pto, key), getattr(base, key), digits),
            ]
        table.add_row(*cells)
    out.print(table)
    if pto is not None:
        _speed_line("speed", report.speed(), report.ops, report.random_weights)
    out.print(f"  peak memory: {report.peak_memory_source}")


def _bench_text(result) -> None:
    out.print(f"bench {result.model_path} on {result.device} ({result.dtype}), input {result.input['kind']}")
    table = _table(title="baseline vs PTO (mean over the timed runs)", title_justify="left")
    for column in ("batch", "metric", "baseline", "PTO", "difference"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    floor_s = result.floor_s
    rows: tuple[tuple[str, Callable[[Any], float | None], int], ...] = tuple(
        (label, lambda run, key=key: getattr(run.metrics, key), digits) for label, key, digits in MODE_ROWS
    ) + (
        ("decode step (ms)", lambda run: run.metrics.decode_step_ms, 2),
        ("bandwidth floor / step", lambda run: run.bandwidth_fraction(floor_s), 4),
    )
    for run in result.runs:
        for index, (label, value, digits) in enumerate(rows):
            base, pto = value(run.baseline), value(run.pto)
            table.add_row(
                str(run.batch) if index == 0 else "",
                label,
                _fmt(base, digits),
                _fmt(pto, digits),
                _pct(pto, base, digits),
                end_section=index == len(rows) - 1,
            )
    out.print(table)
    out.print(
        f"  bandwidth floor per decode step: {result.weight_bytes_per_token / 2**20:.1f} MiB of weights "
        f"/ {result.copy_bandwidth_bytes_s / 1e9:.2f} GB/s copy bandwidth = {floor_s * 1000:.2f} ms"
    )
    out.print(f"  peak memory: {result.peak_memory_source}")
    if result.load_info.hub_kernels:
        out.print(f"  hub kernels: {result.load_info.hub_kernels}", markup=False, highlight=False)
    compilation_text(result.compile, result.compilation)
    _dynamic_source(result.dynamic_config_source)
    for run in result.runs:
        _speed_line(f"batch {run.batch}", run.speed(), run.pto.ops, result.random_weights)
    for run in result.runs:
        out.print(f"  batch {run.batch}: switched on {', '.join(run.switched_on) or 'none'}")
        for row in run.dynamic_config or ():
            on = f"on ({row['backend']})" if row.get("backend") else ("on" if row["enabled"] else "off")
            out.print(f"    {row['op']}: {on} ({row['reason']})", markup=False)
    for path in result.files:
        out.print(f"  wrote {path}")
    _messages(result.failures, result.warnings)
    if not result.passed:
        out.print(f"[bold red]FAILED[/] ({len(result.failures)} check(s)); exit code 3", markup=True)


def _demo_text(result) -> None:
    out.rule("result")
    same = result.hashes_identical
    out.print(
        f"folder hashes after restore: {'identical to' if same else '[red]DIFFERENT from[/]'} "
        f"the originals ({result.files_compared} files)",
        markup=True,
    )
    for path in result.hash_differences:
        out.print(f"  differs: {path}")
    out.print(f"kept {result.directory} (--keep)" if result.kept else f"removed {result.directory}")
    out.print(f"demo finished in {result.seconds:.1f} s")
    if result.passed:
        out.print("[bold green]PASSED[/]", markup=True)
    else:
        out.print("[bold red]FAILED[/]; exit code 3", markup=True)


def _tune_text(result) -> None:
    from pto_patch.cli import tune_render  # tune's tables, and its progress bar while it measures

    tune_render.tune_result(result, as_json=False)


def _in_module(module: str, function: str) -> Callable[[Any], None]:
    """A renderer that lives in a module of its own, imported when its result is shown."""

    def render(result) -> None:
        getattr(importlib.import_module(f"pto_patch.cli.{module}"), function)(result)

    return render


# Result type name -> its text renderer (by name, so that rendering imports no engine module).
TEXT: dict[str, Callable[[Any], None]] = {
    "ApplyResult": _apply_text,
    "RestoreResult": _restore_text,
    "StatusResult": _status_text,
    "ModelsResult": _models_text,
    "TinyModelResult": _make_tiny_text,
    "DownloadResult": _download_text,
    "SkillInstallResult": _skill_install_text,
    "VerifyReport": _verify_text,
    "VllmVerifyReport": _vllm_verify_text,
    "BenchResult": _bench_text,
    "DemoResult": _demo_text,
    "TuneResult": _tune_text,
    "OcrVerifyReport": _in_module("ocr_render", "ocr_verify_text"),
    "PageBenchResult": _in_module("ocr_render", "page_bench_text"),
    "DoctorReport": _in_module("doctor_render", "doctor_text"),
}
