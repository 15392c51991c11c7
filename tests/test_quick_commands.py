"""Commands that rewrite nothing import nothing heavy: --help, status, restore, models and an apply
whose rewrites the cache holds load no libcst, torch, transformers, pydantic, huggingface_hub or run
library; all but apply load none of the rewrite's modules (the engine, config_fix, patch_context,
the rewrite cache); --help loads only the command line; --help, --json output and restore's text
load no rich. Each command runs in a fresh interpreter, which reports the modules it ended up with,
and each check has a case where an eager import makes it fail.

(Their speed is measured in benchmarks/bench_apply.py, never asserted here.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pto_patch.patching import engine
from tests.helpers.folders import HUB_CONFIG, write_config

REPO = Path(__file__).resolve().parents[1]
HEAVY = (
    "libcst",
    "torch",
    "transformers",
    "pydantic",
    "huggingface_hub",
    "pto_patch.patching.codemods",
    # what runs a model; not its report, which is data (every --json document is shaped there)
    *sorted(
        "pto_patch." + ".".join(path.relative_to(REPO / "pto_patch").with_suffix("").parts)
        for path in (REPO / "pto_patch" / "run").rglob("*.py")
        if path.stem not in ("__init__", "report") or path.parent.name == "ocr"
    ),
    "pto_patch.tune",
    "pto_patch.serving",
)
# The rewrite's own modules: only apply needs them.
REWRITE = (
    "pto_patch.patching.engine",
    "pto_patch.patching.plan",
    "pto_patch.patching.config_fix",
    "pto_patch.patching.patch_context",
    "pto_patch.patching.rewrite_cache",
)
# All of pto_patch that --help needs.
COMMANDS = (
    "apply",
    "bench",
    "demo",
    "doctor",
    "download",
    "make_tiny",
    "models",
    "restore",
    "skill",
    "status",
    "tune",
    "verify",
)
HELP_MODULES = sorted(
    [
        "pto_patch",
        "pto_patch.cli",
        "pto_patch.cli.app",
        "pto_patch.cli.commands",
        *(f"pto_patch.cli.commands.{command}" for command in COMMANDS),  # their options only
        "pto_patch.cli.console",
        "pto_patch.cli.lazy_commands",
        "pto_patch.cli.options",
        "pto_patch.cli.spellings",
        "pto_patch.cli.usage_hints",
        "pto_patch.cli.values",
        "pto_patch.errors",
    ]
)

# Runs the command line after `setup`, then writes the names of every module imported to a file.
COMMAND_THEN_MODULES = """
import json, sys
exec(sys.argv[2])
from pto_patch.cli.app import main
try:
    main(sys.argv[3:])
except SystemExit:
    pass
with open(sys.argv[1], "w") as handle:
    json.dump(sorted(sys.modules), handle)
"""


def modules_after(tmp_path: Path, args: list[str], setup: str = "") -> list[str]:
    report = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", COMMAND_THEN_MODULES, str(report), setup, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(report.read_text())


def own(modules: list[str]) -> list[str]:
    return [name for name in modules if name.split(".")[0] == "pto_patch"]


def heavy(modules: list[str], roots: tuple[str, ...] = HEAVY) -> list[str]:
    return sorted({root for root in roots for name in modules if name == root or name.startswith(root + ".")})


@pytest.fixture()
def patched(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    write_config(folder, HUB_CONFIG)
    engine.apply_patch(model_path=folder)
    return folder


def quick_commands(folder: Path) -> list[list[str]]:
    path = ["--model-path", str(folder)]
    return [
        ["--help"],
        ["status", *path],
        ["status", "--json", *path],
        ["models"],
        ["models", "--json"],
        ["restore", "--json", *path],  # last: it unpatches the folder
    ]


def test_commands_that_rewrite_nothing_import_nothing_heavy(tmp_path: Path, patched: Path):
    for args in quick_commands(patched):
        modules = modules_after(tmp_path, args)
        assert heavy(modules) == [], args
        assert heavy(modules, REWRITE) == [], args
        if args == ["--help"] or "--json" in args or args[0] == "restore":
            assert heavy(modules, ("rich",)) == [], args
    assert not (patched / ".pto_patch").exists()  # restore ran, and restored


def test_status_of_a_folder_that_is_no_overlay_imports_no_overlay_writer(tmp_path: Path, patched: Path):
    writers = ("pto_patch.patching.overlay", "pto_patch.patching.put_back")
    assert heavy(modules_after(tmp_path, ["status", "--model-path", str(patched)]), writers) == []
    eager = modules_after(
        tmp_path, ["status", "--model-path", str(patched)], "import pto_patch.patching.overlay"
    )
    assert heavy(eager, writers) == sorted(writers)  # the check sees them when they are imported


def test_help_imports_only_the_command_line(tmp_path: Path):
    assert own(modules_after(tmp_path, ["--help"])) == HELP_MODULES


def test_a_restore_in_text_imports_no_rich(tmp_path: Path, patched: Path):
    """Its lines are plain: console prints them as rich would, without rich."""
    modules = modules_after(tmp_path, ["restore", "--model-path", str(patched)])
    assert heavy(modules, ("rich", *HEAVY, *REWRITE)) == []
    assert not (patched / ".pto_patch").exists()


def test_an_apply_of_a_seen_release_imports_no_libcst(tmp_path: Path, rewrite_cache_dir: Path, patched: Path):
    """`patched` filled the cache; a first rewrite needs libcst, a seen one does not."""
    seen = tmp_path / "seen"
    seen.mkdir()
    write_config(seen, HUB_CONFIG)
    assert heavy(modules_after(tmp_path, ["apply", "--json", "--model-path", str(seen)])) == []
    assert (seen / ".pto_patch" / "manifest.json").is_file()
    other = tmp_path / "other-ops"
    other.mkdir()
    write_config(other, HUB_CONFIG)
    rewrote = modules_after(tmp_path, ["apply", "--json", "--ops", "mrope", "--model-path", str(other)])
    assert heavy(rewrote) == ["libcst", "pto_patch.patching.codemods"]
    assert "libcst.matchers" not in rewrote  # plain node checks: its import alone cost 0.6 s


def test_the_check_sees_an_import_made_eager(tmp_path: Path, patched: Path):
    """What a module-level `import pto_patch.patching.codemods` in the engine would do to status."""
    modules = modules_after(
        tmp_path, ["status", "--model-path", str(patched)], "import pto_patch.patching.codemods"
    )
    assert heavy(modules) == ["libcst", "pto_patch.patching.codemods"]


def test_the_check_sees_the_engine_and_rich_made_eager(tmp_path: Path, patched: Path):
    """What `status` importing the engine again, or rich for --json, would do."""
    setup = "import pto_patch.patching.engine, rich.console"
    modules = modules_after(tmp_path, ["status", "--json", "--model-path", str(patched)], setup)
    assert heavy(modules, REWRITE) == sorted(REWRITE)
    assert heavy(modules, ("rich",)) == ["rich"]
    assert own(modules_after(tmp_path, ["--help"], "import pto_patch.model.locate")) == sorted(
        [
            *HELP_MODULES,
            "pto_patch.model",
            "pto_patch.model.family",
            "pto_patch.model.input_files",
            "pto_patch.model.locate",
            "pto_patch.model.spec",
            "pto_patch.resources",
        ]
    )


@pytest.mark.skipif(
    importlib.util.find_spec("typer._adapters") is None, reason="this typer coerces without pydantic"
)
def test_the_check_sees_pydantic_when_options_go_through_typer(tmp_path: Path, patched: Path):
    """Without pto_patch.cli.values, this typer builds a pydantic adapter for the first option value."""
    off = "import pto_patch.cli.values as values; values.plain_type = lambda param: None"
    modules = modules_after(tmp_path, ["status", "--model-path", str(patched)], off)
    assert heavy(modules) == ["pydantic"]


ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # typer makes each option's info anew for each build


def command_infos(typer_app) -> dict[str, tuple]:
    """Every command of a Typer app as click sees it: each option's attributes, and its --help text."""
    import typer.main

    def described(command, ctx) -> tuple:
        params = [
            (
                type(param).__name__,
                sorted((key, ADDRESS.sub("", repr(value))) for key, value in vars(param).items()),
            )
            for param in command.get_params(ctx)
        ]
        sub = getattr(command, "commands", {})
        return params, command.get_help(ctx), {name: described(sub[name], ctx) for name in sub}

    group = typer.main.get_command(typer_app)
    ctx = group.make_context("pto-patch", ["models"], resilient_parsing=True)
    return {name: described(group.get_command(ctx, name), ctx) for name in group.list_commands(ctx)}


def group_help(typer_app) -> str:
    import typer.main

    group = typer.main.get_command(typer_app)
    return group.get_help(group.make_context("pto-patch", [], resilient_parsing=True))


def test_the_lazy_app_has_every_command_of_the_whole_app_and_builds_only_what_a_call_looks_up():
    """Its help and each command (option for option, help text) are the whole app's; listing the
    commands builds none of them, running one builds that one."""
    import typer.main

    from pto_patch.cli.app import app
    from pto_patch.cli.lazy_commands import LazyGroup, lazy_app

    assert group_help(lazy_app(app)) == group_help(app)
    assert command_infos(lazy_app(app)) == command_infos(app)
    group = typer.main.get_command(lazy_app(app))
    assert isinstance(group, LazyGroup)
    ctx = group.make_context("pto-patch", [], resilient_parsing=True)
    assert "--model-path" not in group.get_help(ctx)
    assert list(group.commands.built) == ["skill"]  # the sub-group, listed as typer lists it
    assert group.resolve_command(ctx, ["status", "--json"])[0] == "status"
    assert list(group.commands.built) == ["skill", "status"]
    assert group.get_command(ctx, "stauts") is None and list(group.commands.built) == ["skill", "status"]
    assert len(app.registered_commands) + len(app.registered_groups) == len(command_infos(app))  # untouched


def test_the_listing_check_sees_a_different_short_help(monkeypatch):
    from pto_patch.cli.app import app
    from pto_patch.cli.lazy_commands import LazyCommands, lazy_app

    whole_help = group_help(app)
    monkeypatch.setattr(LazyCommands, "listed", lambda self, name: self[name].__class__(name=name, help="x"))
    assert group_help(lazy_app(app)) != whole_help
