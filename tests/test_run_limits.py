"""Limits and order (issue 51, item 6): option values checked against a stated limit before the model loads
(run/limits.py), and the JSON on stdout valid JSON whatever it holds (cli/console.finite)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pto_patch.cli.console import print_json
from pto_patch.errors import EXIT_USAGE
from tests.spec_pipeline import run_in_process


def _loads_nothing(monkeypatch) -> None:
    from pto_patch.run import loading

    monkeypatch.setattr(
        loading, "load_model", lambda *a, **k: pytest.fail("loaded before the options were checked")
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["verify", "--cache", "static"], "--cache static is the cache of a compiled run; this run is eager"),
        (["bench", "--cache", "static"], "--cache static is the cache of a compiled run"),
        (["verify", "--mode", "max-autotune"], "--mode max-autotune changes a compiled run only"),
        (["verify", "--use_compile", "--mode", "bogus"], "--mode 'bogus' is not a torch.compile mode"),
        (["bench", "--use_compile", "--mode", "bogus"], "--mode 'bogus' is not a torch.compile mode"),
        (["verify", "--atol", "nan"], "--atol must be a finite number, 0 or more, got nan"),
        (["verify", "--rtol", "inf"], "--rtol must be a finite number, 0 or more, got inf"),
        (["verify", "--atol", "-1"], "--atol must be a finite number, 0 or more, got -1.0"),
        (
            ["verify", "--output_length", "1000000000"],
            "--output_length 1,000,000,000 is past the model's max_position_embeddings 128,000",
        ),
        (["bench", "--output_length", "128001"], "--output_length 128,001 is past the model's"),
        (["verify", "--ocr", "--output_length", "200000"], "--output_length 200,000 is past the model's"),
    ],
)
def test_a_value_past_its_limit_is_refused_before_the_load(
    args, said, patched_tiny: Path, monkeypatch, capsys
):
    _loads_nothing(monkeypatch)
    code = run_in_process(*args, "--model-path", str(patched_tiny))
    err = " ".join(capsys.readouterr().err.split())
    assert code == EXIT_USAGE and said in err and "Traceback" not in err, err


def test_the_json_on_stdout_never_holds_nan_or_infinity(capsys):
    def strict(name):
        raise AssertionError(f"{name} in the JSON document")

    print_json({"a": float("nan"), "b": [1.5, float("inf"), {"c": -float("inf")}], "d": (2.0,)})
    assert json.loads(capsys.readouterr().out, parse_constant=strict) == {
        "a": None,
        "b": [1.5, None, {"c": None}],
        "d": [2.0],
    }
