"""pto_patch.cli.values coerces str, bool and Path options exactly as typer does, without pydantic:
the same value (and type) or the same error, for every option of every command, on a corpus of
values. A typer that changes its coercion fails here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import typer.main

from pto_patch.cli import values as cli_values
from pto_patch.cli.app import app

pytestmark = pytest.mark.skipif(cli_values.RuntimeParam is None, reason="this typer coerces with click types")


def options():
    """The parse context and (command, parameter) of every option, as PlainValuesGroup hands them out."""
    group = typer.main.get_command(app)
    ctx = group.make_context("pto-patch", ["models"], resilient_parsing=True)
    found = [(("pto-patch",), param) for param in group.get_params(ctx)]
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        found += [((name,), param) for param in command.get_params(ctx)]
    return ctx, found


def outcome(runtime, value, param, ctx):
    try:
        result = runtime.coerce(value, param=param, ctx=ctx)
    except Exception as exc:  # the error is part of the behaviour compared
        return ("error", type(exc).__name__, str(exc))
    return ("value", type(result), result)


def test_plain_coercion_equals_typers_own(tmp_path: Path):
    from typer._coercion import build_runtime_param

    a_file, a_folder = tmp_path / "file.txt", tmp_path / "folder"
    a_file.write_text("x")
    a_folder.mkdir()
    values = [
        None,
        "",
        "x",
        " spaced ",
        "~/x",
        "-",
        "a//b/",
        str(a_file),
        str(a_folder),
        str(tmp_path / "none"),
    ]
    values += [True, False, 3, b"bytes"]
    ctx, found = options()
    plain = 0
    for where, param in found:
        ours = param._runtime_param  # set by PlainValuesGroup where the plain coercion applies
        if ours is None:
            continue
        plain += 1
        theirs = build_runtime_param(param.type_descriptor)
        for value in values:
            assert outcome(ours, value, param, ctx) == outcome(theirs, value, param, ctx), (
                where,
                param.name,
                value,
            )
    assert plain >= 20  # --model, --model-path, --json ... of every command


def test_an_unreadable_path_is_refused_as_typer_refuses_it(tmp_path: Path):
    from typer._coercion import build_runtime_param

    if os.geteuid() == 0:
        pytest.skip("root reads through permission bits")
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o000)
    try:
        ctx, found = options()
        param = next(p for (name,), p in found if name == "status" and p.name == "model_path")
        ours = cli_values.PlainRuntimeParam(
            parameter_info=param.type_descriptor.parameter_info, annotation=param.type_descriptor.annotation
        )
        theirs = build_runtime_param(param.type_descriptor)
        assert outcome(ours, str(folder), param, ctx)[0] == "error"
        assert outcome(ours, str(folder), param, ctx) == outcome(theirs, str(folder), param, ctx)
    finally:
        folder.chmod(0o755)


def test_commands_get_the_plain_coercion_and_other_types_keep_typers():
    ctx, found = options()
    for (name,), param in found:
        if name == "verify" and param.name == "warmup":  # an int: typer's own, through pydantic
            assert cli_values.plain_type(param) is None
        if name == "status" and param.name in ("model", "model_path", "as_json"):
            assert isinstance(param._runtime_param, cli_values.PlainRuntimeParam), param.name
