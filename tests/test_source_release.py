"""apply names the release its source came from: the installed one's file, or the folder's own file and
the release the folder's config.json names, beside the installed one where they differ."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pto_patch.model.locate import installed_transformers_release
from pto_patch.model.source_release import folder_source_release
from pto_patch.patching import engine
from pto_patch.patching.codemods.banner import BANNER_MARKER
from tests.release_sources import FILES, installed_folder

INSTALLED = installed_transformers_release()


def folder_with(tmp_path: Path, modeling: bytes, config: dict) -> tuple[Path, Path]:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_qwen2_5_vl.py").write_bytes(modeling)
    installed = tmp_path / "installed.py"
    installed.write_bytes(b"# the installed release's file\n")
    return folder, installed


@pytest.mark.parametrize(
    ("modeling", "config", "expected"),
    [
        (b"# the installed release's file\n", {"transformers_version": "5.24.0"}, "5.24.0"),
        (
            b"# the installed release's file\n",
            {"transformers_version": "5.25.0"},
            "5.25.0 per config.json (the folder's own file, identical to the installed 5.24.0's)",
        ),
        (b"# another\n", {"transformers_version": "5.25.0"}, "5.25.0 per config.json (the folder's own file; installed: 5.24.0)"),
        (b"# another\n", {"transformers_version": "5.24.0"}, "5.24.0 per config.json (the folder's own file differs from the installed one)"),
        (b"# another\n", {}, "unknown (the folder's own file; config.json names no release; installed: 5.24.0)"),
        (b"# the installed release's file\n", {}, "5.24.0 (the folder's own file, identical to the installed one)"),
    ],
)  # fmt: skip
def test_the_label_says_which_release_and_whether_it_is_the_installed_file(
    tmp_path, modeling, config, expected
):
    folder, installed = folder_with(tmp_path, modeling, config)
    assert folder_source_release(folder, folder / "modeling_qwen2_5_vl.py", installed, "5.24.0") == expected


def test_apply_names_the_folder_s_release_in_its_result_and_banner(tmp_path):
    from pto_patch.tiny.model import make_tiny

    folder = tmp_path / "tiny"
    make_tiny(folder)
    for name in FILES:  # the installed release's files, shipped by a folder written by another release
        shutil.copyfile(installed_folder() / name, folder / name)
    config = json.loads((folder / "config.json").read_text())
    config["transformers_version"] = "9.9.0"
    (folder / "config.json").write_text(json.dumps(config))

    result = engine.apply_patch(model_path=folder)
    assert result.release == INSTALLED  # what status compares with the installed release later
    assert result.source_release == (
        f"9.9.0 per config.json (the folder's own file, identical to the installed {INSTALLED}'s)"
    )
    first_line = (folder / "modeling_qwen2_5_vl.py").read_text(encoding="utf-8").splitlines()[0]
    assert first_line.startswith(BANNER_MARKER) and first_line.endswith(
        f"from transformers {result.source_release}"
    )


def test_apply_of_the_installed_release_says_that_release(tmp_path):
    from pto_patch.tiny.model import make_tiny

    make_tiny(tmp_path / "tiny")
    result = engine.apply_patch(model_path=tmp_path / "tiny")
    assert result.release == result.source_release == INSTALLED
