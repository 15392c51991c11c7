"""Rendering of engine results: rich text on the terminal, or one JSON document with --json."""

from __future__ import annotations

import json
import sys

from rich.table import Table

from pto_patch.console import err, out, print_json
from pto_patch.report import document


def apply_result(result, *, as_json: bool) -> None:
    if as_json:
        doc = document("apply", result)
        doc["files"] = [{"path": p, "action": a} for p, a in result.files]
        print_json(doc)
        return
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
        f"(source: transformers {result.release}, {result.source})"
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


def restore_result(result, *, as_json: bool) -> None:
    if as_json:
        print_json(document("restore", result))
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


def status_result(result, *, as_json: bool) -> None:
    if as_json:
        doc = document("status", result, needs_reapply=result.needs_reapply)
        doc["files"] = [{"path": p, "action": a} for p, a in result.files]
        print_json(doc)
        return
    table = Table(show_header=False, box=None)
    table.add_row("folder", str(result.folder))
    table.add_row("spec", result.spec)
    if result.state == "in_progress":
        table.add_row("state", "[red]interrupted apply[/] (run pto-patch restore)")
    else:
        table.add_row("state", "patched" if result.patched else "not patched")
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
        table.add_row("overlay of", str(result.overlay["source"]))
        changed = result.overlay["source_changed"]
        table.add_row(
            "source changed",
            ("[red]" + ", ".join(changed) + "[/] (restore, then apply --overlay again)") if changed else "no",
        )
    if result.download:
        table.add_row("downloaded", f"{result.download.get('repo_id')} @ {result.download.get('commit')}")
    out.print(table)


# --- models ------------------------------------------------------------------------------------------


def models_result(result, *, as_json: bool) -> None:
    if as_json:
        print_json(document("models", result.to_json()))
        return
    for entry in result.models:
        spec, shape = entry.spec, entry.to_json()["checkpoint"]
        where = "" if spec.builtin else f"  [{spec.source_path}]"
        out.print(
            f"[bold]{spec.name}[/]  {spec.hub_repo_id}  (${spec.model_path_env}){where}", highlight=False
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


# --- make-tiny and download ---------------------------------------------------------------------------


def make_tiny_result(result, *, as_json: bool) -> None:
    if as_json:
        print_json(document("make-tiny", result.to_json()))
        return
    width = "full-width" if result.full_width else "tiny"
    out.print(
        f"wrote a {width} random-weight model to {result.path}: {result.layers} decoder layer(s), "
        f"{result.parameter_count:,} parameters, {len(result.files)} files"
    )
    out.print(f"  try: pto-patch apply --model-path {result.path}")


def download_result(result, *, as_json: bool) -> None:
    if as_json:
        print_json(document("download", result.to_json()))
        return
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


# --- skill ------------------------------------------------------------------------------------------


def skill_install_result(result, *, as_json: bool) -> None:
    if as_json:
        print_json(document("skill install", result.to_json()))
        return
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
