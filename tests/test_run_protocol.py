"""One implementation of the two-mode run (run/modes.py): each command that runs a model in the baseline
and PTO modes takes its ops, backend, switches and what-ran checks from it, and none keeps a copy."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pto_patch"
CALLERS = {
    "verify": "run/verify.py",
    "verify --ocr": "run/ocr/verify.py",
    "bench": "run/bench.py",
    "bench --ocr": "run/ocr/bench.py",
    "tune": "tune/tuning.py",
}
# what the protocol does, which no caller may do itself
PROTOCOL_NAMES = {"choose_ops", "set_switches", "op_reports", "op_failures"}


def imported(path: Path) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.setdefault(node.module, set()).update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("command", CALLERS)
def test_each_caller_runs_the_modes_through_the_protocol(command):
    names = imported(PACKAGE / CALLERS[command])
    assert "KernelModes" in names.get("pto_patch.run.modes", set()), f"{command} does not use run.modes"
    copied = {name for module, found in names.items() if module != "pto_patch.run.modes" for name in found}
    assert not copied & PROTOCOL_NAMES, f"{command} runs the protocol itself: {copied & PROTOCOL_NAMES}"


def test_the_check_sees_a_caller_that_keeps_its_own_copy(tmp_path):
    copy = tmp_path / "bench.py"
    copy.write_text("from pto_patch.run.op_choice import choose_ops, set_switches\n", encoding="utf-8")
    names = imported(copy)
    assert "KernelModes" not in names.get("pto_patch.run.modes", set())
    assert {"choose_ops", "set_switches"} <= names["pto_patch.run.op_choice"]
