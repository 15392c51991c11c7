"""One rule for every file a run writes: never one of its inputs, never in the model folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pto_patch.errors import EXIT_USAGE
from tests.test_engine import run_cli
from tests.test_generated_bad_inputs import tree_digest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from pto_patch.tiny.model import make_tiny

    folder = tmp_path_factory.mktemp("tiny") / "model"
    make_tiny(folder)
    return folder


@pytest.fixture()
def folder(tiny: Path, tmp_path: Path, monkeypatch) -> Path:
    from pto_patch.run import loading

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_model", no_load)
    copy = tmp_path / "model"
    shutil.copytree(tiny, copy)
    (tmp_path / "link-to-model").symlink_to(copy)
    return copy


def _targets(folder: Path) -> list[tuple[str, ...]]:
    root = folder.parent
    return [
        ("verify", "--report-file", str(folder / "model-00002-of-00002.safetensors")),
        ("verify", "--report-file", str(folder / "config.json")),
        ("verify", "--report-file", str(folder / "new-report.json")),  # not an input yet, but in the folder
        ("verify", "--report-file", str(root / "link-to-model" / "tokenizer.json")),
        ("verify", "--report-file", str(folder / "sub" / ".." / "generation_config.json")),
        ("verify", "--ocr", "--save-outputs", str(folder / "model-00001-of-00002.safetensors")),
        ("bench", "--ocr", "--plot", str(folder / "times.png")),
        ("bench", "--output-dir", str(folder)),
        ("bench", "--output-dir", str(folder / "reports")),
    ]


@pytest.mark.parametrize("index", range(9))
def test_a_run_pointed_at_its_own_inputs_is_refused_before_loading(folder: Path, capsys, index: int):
    command, *rest = _targets(folder)[index]
    before = tree_digest(folder.parent)
    code = run_cli(command, "--model-path", str(folder), *rest)
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert "model folder" in err.splitlines()[0], err
    assert tree_digest(folder.parent) == before


def test_nothing_is_written_into_the_pages_folder(folder: Path, tmp_path: Path, capsys):
    from pto_patch.run.ocr.pages import bundled_pages, write_pages

    pages = tmp_path / "pages"
    pages.mkdir()
    write_pages(bundled_pages()[:1], pages)
    truth = next(pages.glob("*.txt"))
    before = tree_digest(tmp_path)
    for flag in ("--save-outputs", "--report-file"):
        argv = ["verify", "--model-path", str(folder), "--ocr", "--pages", str(pages), flag, str(truth)]
        assert run_cli(*argv) == EXIT_USAGE
        assert "--pages folder" in capsys.readouterr().err
    assert tree_digest(tmp_path) == before
