"""The one place that turns errors into messages."""

from __future__ import annotations

import pytest

from pto_patch.console import report_error
from pto_patch.errors import EXIT_DRIFTED, DriftError, PtoPatchError


def test_brackets_in_messages_and_hints_are_printed_literally(capsys):
    code = report_error(PtoPatchError("no device [npu:0] here [/x]", "pip install 'pto-patch[ascend]'"))
    stderr = capsys.readouterr().err
    assert code == 1
    assert "no device [npu:0] here [/x]" in stderr
    assert "pip install 'pto-patch[ascend]'" in stderr


def test_typed_errors_carry_their_exit_code(capsys):
    assert report_error(DriftError("edited", "use --force")) == EXIT_DRIFTED
    assert capsys.readouterr().err.splitlines() == ["error: edited", "hint: use --force"]


@pytest.mark.parametrize("as_json", [False, True])
def test_unexpected_errors_say_so_and_point_at_the_debug_variable(capsys, as_json):
    assert report_error(ValueError("boom"), as_json=as_json) == 1
    captured = capsys.readouterr()
    text = captured.out if as_json else captured.err
    assert "unexpected error: ValueError: boom" in text and "PTO_PATCH_DEBUG=1" in text


def test_an_unexpected_multi_line_error_stays_on_one_line(capsys):
    report_error(ImportError("\nAutoImageProcessor requires the Torchvision library.\nSee the docs."))
    lines = capsys.readouterr().err.splitlines()
    assert (
        lines[0]
        == "error: unexpected error: ImportError: AutoImageProcessor requires the Torchvision library."
    )
    assert len(lines) == 2 and lines[1].startswith("hint:")
