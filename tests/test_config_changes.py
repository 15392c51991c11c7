"""apply says what it changes in config.json, and never replaces an mrope_section that does not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pto_patch.errors import ModelFolderError
from pto_patch.patching import engine
from tests.folder_snapshot import snapshot
from tests.helpers.cli import run_cli
from tests.helpers.folders import HUB_CONFIG, write_config


def folder_with(tmp_path: Path, **changes) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    write_config(folder, {k: v for k, v in {**HUB_CONFIG, **changes}.items() if v is not None})
    return folder


def changes_of(result) -> dict[str, tuple]:
    return {c.key: (c.change, c.old, c.new) for c in result.config_changes}


def test_apply_lists_each_key_it_adds_or_changes(tmp_path: Path, capsys):
    folder = folder_with(tmp_path)
    assert run_cli("apply", "--model-path", str(folder)) == 0
    out = capsys.readouterr().out
    assert 'rope_scaling.type: "default" -> "mrope"' in out
    assert "auto_map added (4 keys)" in out
    engine.restore_model(model_path=folder)

    result = engine.apply_patch(model_path=folder, dry_run=True)  # a dry run lists them too
    listed = changes_of(result)
    assert listed.pop("rope_scaling.type") == ("changed", "default", "mrope")
    change, old, new = listed.pop("auto_map")
    assert change == "added" and old is None and set(new) >= {"AutoConfig", "AutoModelForCausalLM"}
    assert listed == {}  # the section [16, 24, 24] fits head_dim 128: kept, so not listed


def test_a_missing_section_is_added_and_listed_old_to_new(tmp_path: Path, capsys):
    folder = folder_with(
        tmp_path, rope_scaling=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6}
    )
    assert run_cli("apply", "--model-path", str(folder), "--json") == 0
    document = json.loads(capsys.readouterr().out)
    listed = {c["key"]: c for c in document["config_changes"]}
    assert listed["rope_scaling"] == {
        "key": "rope_scaling",
        "change": "added",
        "old": None,
        "new": {"type": "mrope", "mrope_section": [16, 24, 24]},
    }
    assert listed["rope_parameters.mrope_section"]["new"] == [16, 24, 24]
    config = json.loads((folder / "config.json").read_text())
    assert config["rope_parameters"]["mrope_section"] == [16, 24, 24]


@pytest.mark.parametrize(
    ("rope", "where"),
    [
        ({"rope_scaling": {"type": "mrope", "mrope_section": [10, 10, 10]}}, "rope_scaling.mrope_section"),
        (
            {"text_config": {"rope_parameters": {"mrope_section": [16, 24, 23]}}},
            "text_config.rope_parameters.mrope_section",
        ),
    ],
)
def test_a_section_that_does_not_fit_is_reported_not_replaced(tmp_path: Path, rope, where):
    folder = folder_with(tmp_path, **rope)
    before = snapshot(folder)
    with pytest.raises(ModelFolderError) as refused:
        engine.apply_patch(model_path=folder)
    assert f"{where} " in refused.value.message
    assert "does not fit head_dim 128 (its numbers must sum to 64)" in refused.value.message
    assert "[16, 24, 24]" in refused.value.hint
    assert snapshot(folder) == before
