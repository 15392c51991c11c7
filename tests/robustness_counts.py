"""Counts the robustness suites keep (faults injected, kills, races, bad inputs, recoveries), printed
at the end of the pytest run by conftest's terminal summary."""

from __future__ import annotations

from collections import Counter

COUNTS: Counter = Counter()


def summary() -> list[str]:
    if not COUNTS:
        return []
    c = COUNTS
    lines = []
    if c["fault_runs"] or c["kills"]:
        lines.append(
            f"fault injection: {c['faults']} faults injected over {c['fault_runs']} runs "
            f"({c['left_in_progress']} left the folder in progress, as their message said), "
            f"{c['kills']} SIGKILLs; {c['recovered']} of {c['fault_runs'] + c['kills']} recovered "
            "to the original byte for byte"
        )
    if c["races"]:
        lines.append(
            f"races: {c['races']} concurrent commands in {c['race_rounds']} rounds, original kept every time"
        )
    if c["generated_cases"]:
        lines.append(
            f"generated bad inputs: {c['generated_cases']} cases, {c['generated_clear']} ended in one error line "
            "+ hint, the documented exit code, the folder unchanged"
        )
    if c["bad_inputs"]:
        lines.append(
            f"bad inputs: {c['bad_inputs']} inputs, {c['bad_input_runs']} command runs, each one line + hint, "
            "no traceback, folder unchanged"
        )
    return lines
