"""Rendering of `tune`: a progress bar while it measures, then the choice per batch or one JSON document."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.progress import BarColumn, Progress, TextColumn

from pto_patch.cli.console import err, escape, folding_table, out, print_json


@contextlib.contextmanager
def progress(budget_s: float) -> Iterator[Callable[[int, str, float], None]]:
    """A bar of the time budget used, on stderr, naming what last ran; yields the tune's on_run."""
    columns = (
        TextColumn("tune {task.description}"),
        BarColumn(),
        TextColumn("{task.completed:>5.0f} / {task.total:.0f} s"),
    )
    with Progress(*columns, console=err.rich_console, transient=True) as bar:
        task = bar.add_task("loading the model", total=budget_s)

        def on_run(batch: int, what: str, elapsed: float) -> None:
            bar.update(task, completed=min(elapsed, budget_s), description=f"batch {batch}: {what}")

        yield on_run


def _ratio(entry: dict) -> str:
    ratio = entry.get("ratio_to_baseline")
    if not ratio or ratio.get("median") is None:
        return "-"
    if ratio.get("low") is None or ratio.get("high") is None:  # too few rounds for a band
        return f"{ratio['median']:.3f} [no band]"
    return f"{ratio['median']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]"


def tune_result(result, *, as_json: bool) -> None:
    doc = result.to_json()
    if as_json:
        print_json(doc)
        return
    for warning in doc["warnings"]:
        err.print(f"[yellow]warning:[/] {escape(warning)}", markup=True, highlight=False)
    for failure in doc["failures"]:
        err.print(f"[bold red]failed:[/] {escape(failure)}", markup=True, highlight=False)
    out.print(f"tune {doc['model_path']}")
    out.print(
        f"  device {doc['device']} ({doc['device_name']}), {doc['dtype']}, "
        f"{doc['duration_s']:.0f} s of a {doc['budget_s']:.0f} s budget"
    )
    for probe in doc["probes"]:
        if not probe["runs_here"]:
            out.print(f"  left out {probe['op']} on {probe['backend']}: {probe['note']}")
    if not doc["batches"]:
        return
    table = folding_table(title="chosen per batch (tokens/s median; ratio to baseline with its noise band)")
    for column in ("batch", "switched on", "baseline tok/s", "chosen tok/s", "ratio", "why"):
        table.add_column(column)
    for entry in doc["batches"]:
        speeds = entry["tokens_per_s"]
        chosen = ", ".join(f"{op}={backend}" for op, backend in entry["chosen"].items()) or "nothing"
        table.add_row(
            str(entry["batch"]),
            chosen,
            f"{speeds['baseline']['median']}",
            f"{speeds['chosen']['median']}" if speeds["chosen"] else "-",
            _ratio(entry),
            entry["decided"],
        )
    out.print(table)
    tried = folding_table(title="every candidate tried")
    for column in ("batch", "candidate", "runs", "ratio", "verdict"):
        tried.add_column(column)
    for entry in doc["batches"]:
        again = [entry["confirmation"]] if entry.get("confirmation") else []
        for alternative, label in [(a, a["label"]) for a in entry["alternatives"]] + [
            (a, f"{a['label']} (measured again)") for a in again
        ]:
            tried.add_row(
                str(entry["batch"]),
                label,
                str(alternative["runs"]),
                _ratio(alternative),
                alternative["verdict"],
            )
    out.print(tried)
    if doc["tuning_file"]:
        out.print(f"wrote {doc['tuning_file']}; `verify` and `bench` use it with --use_dynamic_config")
