"""The package's shape: thin proving commands over `pto_patch.run`, and each module opening with the one
concern it holds (files are split by concern, never by a line count)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pto_patch"
# The proving commands; what they share lives in pto_patch.run and pto_patch.run.report. (`run.demo` is
# make-tiny, apply and the verify run in one: it runs `run.verify` by design, so it is not among them.)
COMMAND_MODULES = (
    "pto_patch.run.verify",
    "pto_patch.run.bench",
    "pto_patch.tune.tuning",
)
SOURCES = (PACKAGE, PACKAGE.parent / "kernels" / "pto_kernels")


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function (`from a import b` gives a and a.b)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_no_command_module_imports_another():
    for name in COMMAND_MODULES:
        path = PACKAGE.parent / f"{name.replace('.', '/')}.py"
        others = imported_modules(path) & (set(COMMAND_MODULES) - {name})
        assert not others, f"{name} imports {sorted(others)}: move what they share into pto_patch.run"


def test_the_import_check_sees_imports_inside_functions(tmp_path: Path):
    source = tmp_path / "x.py"
    source.write_text("def f():\n    from pto_patch.run import verify\n", encoding="utf-8")
    assert "pto_patch.run.verify" in imported_modules(source)


def modules_without_a_concern(roots) -> list[str]:
    """Modules whose docstring does not open with what they are for (a first line of a few words at least)."""
    missing = []
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            if len(doc.split("\n")[0].split()) < 4:
                missing.append(path.relative_to(root).as_posix())
    return missing


def test_every_module_opens_with_its_concern():
    assert modules_without_a_concern(SOURCES) == [], "say in the module's docstring what it is for"


def test_the_concern_check_sees_a_module_that_says_nothing(tmp_path: Path):
    (tmp_path / "said.py").write_text(
        '"""The folder lock: one writer or many readers."""\n', encoding="utf-8"
    )
    (tmp_path / "silent.py").write_text("X = 1\n", encoding="utf-8")
    (tmp_path / "terse.py").write_text('"""Helpers."""\n', encoding="utf-8")
    assert modules_without_a_concern([tmp_path]) == ["silent.py", "terse.py"]


def test_one_renderer_knows_every_command_result():
    """`render.show` picks text or JSON for every result a command returns; nothing else prints them."""
    from pto_patch.cli import render, skill
    from pto_patch.hub import download
    from pto_patch.model import catalog as model_catalog
    from pto_patch.patching import engine
    from pto_patch.run import report
    from pto_patch.run.diagnosis import doctor
    from pto_patch.run.ocr import report as ocr_report
    from pto_patch.serving import vllm_verify
    from pto_patch.tiny import model as tiny_model

    results = (
        engine.ApplyResult,
        engine.RestoreResult,
        engine.StatusResult,
        model_catalog.ModelsResult,
        tiny_model.TinyModelResult,
        download.DownloadResult,
        skill.SkillInstallResult,
        report.VerifyReport,
        report.BenchResult,
        report.DemoResult,
        report.TuneResult,
        ocr_report.OcrVerifyReport,
        ocr_report.PageBenchResult,
        doctor.DoctorReport,
        vllm_verify.VllmVerifyReport,
    )
    assert set(render.TEXT) == {result.__name__ for result in results}
    cli_source = (PACKAGE / "cli" / "app.py").read_text(encoding="utf-8")
    assert "print_json(document" not in cli_source and "if as_json:" not in cli_source.split("def main")[0]


def test_the_kernel_package_a_patched_folder_receives_is_code_only():
    """apply copies kernels/pto_kernels into every patched folder: a data file only a benchmark reads
    (the tile search's 120 KB of cost-model cycles) belongs beside the benchmark."""
    package = PACKAGE.parent / "kernels" / "pto_kernels"
    extra = [
        path.relative_to(package).as_posix()
        for path in package.rglob("*")
        if path.is_file() and path.suffix != ".py" and "__pycache__" not in path.parts
    ]
    assert extra == [], f"not code, yet copied into every patched folder: {extra}"
    assert (PACKAGE.parent / "benchmarks" / "tile_search.json").is_file()
