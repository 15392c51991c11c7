#!/usr/bin/env python3
"""Check a `pto-patch verify --json` report (or `--report-file`), or bench's or demo's, one criterion a line.

    python check_report.py verify.json        # or: pto-patch verify ... --json | python check_report.py -

Prints PASS / FAIL / WARN per criterion and exits 0 when every criterion passes, 3 when one
fails (as verify does), 2 when the report cannot be read. Standard library only.
"""

from __future__ import annotations

import json
import sys

SUPPORTED_SCHEMA = 1
EXIT_OK, EXIT_USAGE, EXIT_FAILED = 0, 2, 3


def _ops_rows(check, ops: dict, prefix: str = "") -> None:
    for op, entry in sorted(ops.items()):
        calls, on = entry.get("calls", 0), entry.get("switched_on", False)
        if on:
            ran = calls > 0 or bool(entry.get("inside"))  # a block did its work: not a failure
            detail = f"{calls} call(s), backend {entry.get('backend')}" + (
                f", inside {entry['inside']}" if entry.get("inside") else ""
            )
            check(ran, f"{prefix}{op}: switched on and ran", detail)
            fallbacks = entry.get("fallbacks", 0)
            check(
                fallbacks == 0,
                f"{prefix}{op}: no fallback to torch",
                entry.get("first_fallback_error") or f"{fallbacks} fallback(s)",
                warn_only=True,
            )
        else:
            check(calls == 0, f"{prefix}{op}: switched off and silent", f"{calls} call(s)")


def criteria(report: dict) -> list[tuple[str, str, str]]:
    """(status, criterion, detail) rows, status one of PASS, FAIL, WARN, for a verify, bench or demo report."""
    rows: list[tuple[str, str, str]] = []

    def check(ok: bool, name: str, detail: str = "", warn_only: bool = False) -> None:
        rows.append(("PASS" if ok else ("WARN" if warn_only else "FAIL"), name, detail))

    version = report.get("schema_version")
    check(version == SUPPORTED_SCHEMA, "schema_version is 1", f"found {version!r}")
    command = report.get("command", "verify")
    if command == "demo":
        check(
            report.get("hashes_identical") is True,
            "folder byte-identical after restore",
            ", ".join(report.get("hash_differences") or []),
        )
        inner = report.get("verify")
        check(inner is not None, "the demo's verify ran", "")
        rows.extend((status, f"verify: {name}", detail) for status, name, detail in criteria(inner or {})[1:])
        return rows
    failures = report.get("failures") or []
    check(report.get("passed") is True and not failures, f"{command} passed", "; ".join(failures))

    load = report.get("load_info") or {}
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        found = load.get(key) or []
        check(not found, f"no {key.replace('_', ' ')}", ", ".join(found[:3]))
    check(load.get("lm_head_tied") is not False, "lm_head tied as the config says", "")

    if command == "bench":  # both modes at every batch size; no accuracy run
        runs = report.get("runs") or []
        check(bool(runs), "bench measured at least one batch size", "")
        for run in runs:
            _ops_rows(check, ((run.get("pto") or {}).get("ops") or {}), f"batch {run.get('batch')}: ")
        return rows

    pto = report.get("pto")
    check(pto is not None, "the PTO run happened (not --baseline-only)", "" if pto else "baseline only")
    _ops_rows(check, (pto or {}).get("ops") or {})

    accuracy = report.get("accuracy")
    if pto is not None:
        check(accuracy is not None, "accuracy was measured", "")
    if accuracy:
        check(
            accuracy.get("logits_within_tolerance") is True,
            "first-step logits within tolerance",
            f"max |diff| {accuracy.get('max_abs_logit_diff')} (atol {accuracy.get('atol')}, "
            f"rtol {accuracy.get('rtol')})",
        )
        rate = accuracy.get("token_match_rate")
        check(rate == 1.0, "greedy tokens identical", f"match rate {rate}", warn_only=True)
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_report.py REPORT.json  (or - for stdin)", file=sys.stderr)
        return EXIT_USAGE
    try:
        text = sys.stdin.read() if argv[0] == "-" else open(argv[0], encoding="utf-8").read()
        report = json.loads(text)
    except (OSError, ValueError) as exc:
        print(f"error: cannot read the report {argv[0]}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not isinstance(report, dict) or "error" in report:
        detail = report.get("error") if isinstance(report, dict) else "not a JSON object"
        print(f"error: not a verify, bench or demo report: {detail}", file=sys.stderr)
        return EXIT_USAGE
    rows = criteria(report)
    for status, name, detail in rows:
        print(f"{status:4}  {name}" + (f"  ({detail})" if detail and status != "PASS" else ""))
    failed = sum(1 for status, _, _ in rows if status == "FAIL")
    print(f"{'FAILED' if failed else 'PASSED'}: {len(rows) - failed} of {len(rows)} criteria passed")
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
