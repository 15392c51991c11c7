"""The first hour with pto-patch: the mistakes a new user makes, run as they type them, and the answers.

Each case is a command line from a first session on a small folder (a config.json and a tokenizer
are enough for apply, restore and status; runs that load a model are in test_verify.py and
test_bench.py). Every test holds a case that fails without the behaviour it checks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pto_patch.cli.app import main
from pto_patch.errors import EXIT_OK, EXIT_USAGE
from pto_patch.patching import engine
from pto_patch.patching.restore import restore_model
from tests.folder_snapshot import snapshot
from tests.test_engine import HUB_CONFIG, write_config


@pytest.fixture()
def model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "GutenOCR-3B"
    folder.mkdir()
    write_config(folder, HUB_CONFIG)
    (folder / "tokenizer.json").write_text("{}")
    return folder


def cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code


def json_cli(capsys, *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = cli(*args, "--json")
    return code, json.loads(capsys.readouterr().out)


def edit(folder: Path, text: str) -> None:
    modeling = folder / "modeling_qwen2_5_vl.py"
    modeling.write_text(modeling.read_text() + f"\n# {text}\n")


# --- no lost edit -----------------------------------------------------------------------------------


def test_a_second_forced_restore_keeps_the_first_edit_too(model_folder: Path, capsys):
    engine.apply_patch(model_path=model_folder)
    edit(model_folder, "first edit")
    assert cli("restore", "--model-path", str(model_folder), "--force") == EXIT_OK
    engine.apply_patch(model_path=model_folder)
    edit(model_folder, "second edit")
    code, restored = json_cli(capsys, "restore", "--model-path", str(model_folder), "--force")
    assert code == EXIT_OK
    assert restored["kept_edited"] == ["modeling_qwen2_5_vl.py.edited.2"]
    assert "# first edit" in (model_folder / "modeling_qwen2_5_vl.py.edited").read_text()
    assert "# second edit" in (model_folder / "modeling_qwen2_5_vl.py.edited.2").read_text()
    code, status = json_cli(capsys, "status", "--model-path", str(model_folder))
    assert status["kept_edits"] == ["modeling_qwen2_5_vl.py.edited", "modeling_qwen2_5_vl.py.edited.2"]
    capsys.readouterr()
    cli("status", "--model-path", str(model_folder))
    assert "modeling_qwen2_5_vl.py.edited.2" in " ".join(capsys.readouterr().out.split())


# --- nothing left behind unnamed ----------------------------------------------------------------------


def test_status_and_restore_name_files_neither_the_checkpoint_nor_the_patch_put_there(
    model_folder: Path, capsys
):
    (model_folder / "model.safetensors").write_bytes(b"weights")
    (model_folder / "README.md").write_text("card")
    engine.apply_patch(model_path=model_folder)
    (model_folder / "bench_baseline.json").write_text("{}")  # what an old bench wrote into the cwd
    (model_folder / "scratch").mkdir()
    code, status = json_cli(capsys, "status", "--model-path", str(model_folder))
    assert status["unexpected"] == ["bench_baseline.json", "scratch/"]
    code, restored = json_cli(capsys, "restore", "--model-path", str(model_folder))
    assert code == EXIT_OK and restored["unexpected"] == ["bench_baseline.json", "scratch/"]
    assert (model_folder / "bench_baseline.json").exists()  # named, never deleted
    code, status = json_cli(capsys, "status", "--model-path", str(model_folder))
    assert status["unexpected"] == ["bench_baseline.json", "scratch/"]
    (model_folder / "bench_baseline.json").unlink()
    (model_folder / "scratch").rmdir()
    assert json_cli(capsys, "status", "--model-path", str(model_folder))[1]["unexpected"] == []


def test_a_downloaded_folder_counts_its_recorded_files_as_the_checkpoint(model_folder: Path, capsys):
    (model_folder / "odd-shard.bin2").write_bytes(b"x")
    record = {"repo_id": "rootsautomation/GutenOCR-3B", "files": {"odd-shard.bin2": 1, "config.json": 1}}
    (model_folder / ".pto_patch_download.json").write_text(json.dumps(record))
    (model_folder / "notes.txt").write_text("mine")
    assert json_cli(capsys, "status", "--model-path", str(model_folder))[1]["unexpected"] == ["notes.txt"]


# --- restore twice --------------------------------------------------------------------------------


def test_restore_of_an_unpatched_folder_is_a_no_op_that_exits_0(model_folder: Path, capsys):
    before = snapshot(model_folder)
    assert restore_model(model_path=model_folder).not_patched
    capsys.readouterr()
    assert cli("restore", "--model-path", str(model_folder)) == EXIT_OK
    assert "is not patched; nothing to restore" in capsys.readouterr().out
    engine.apply_patch(model_path=model_folder)
    assert cli("restore", "--model-path", str(model_folder)) == EXIT_OK
    assert cli("restore", "--model-path", str(model_folder)) == EXIT_OK  # a trap's second restore
    assert snapshot(model_folder) == before
    code, document = json_cli(capsys, "restore", "--model-path", str(model_folder))
    assert code == EXIT_OK and document["not_patched"] is True and document["restored"] == []


def test_a_restore_of_no_model_folder_still_fails(tmp_path: Path, capsys):
    assert cli("restore", "--model-path", str(tmp_path / "nowhere")) == 1
    assert cli("restore", "--model-path", str(tmp_path)) == 1  # no config.json: not a model folder


# --- reports in a place of their own ------------------------------------------------------------------


def test_run_reports_go_to_the_users_cache_never_a_hub_cache(tmp_path: Path, monkeypatch):
    from pto_patch.errors import PtoPatchError
    from pto_patch.run.report_folder import reports_root, run_reports_place

    monkeypatch.setenv("PTO_PATCH_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "tiny"
    first = run_reports_place("bench", model, None, "--output-dir")
    assert first.path.parent == reports_root() == tmp_path / "cache" / "reports"
    made = first.make(), first.make()  # two runs in one second: two folders
    assert made[0] != made[1] and all(path.is_dir() and path.parent == reports_root() for path in made)
    assert run_reports_place("bench", model, model, "--output-dir").make() == model  # asked for: as asked
    snapshot_dir = tmp_path / "hub" / "models--o--n" / "snapshots" / "abc"
    snapshot_dir.mkdir(parents=True)
    with pytest.raises(PtoPatchError) as refused:
        run_reports_place("bench", snapshot_dir, snapshot_dir, "--output-dir")
    assert refused.value.exit_code == EXIT_USAGE and "inside the Hugging Face cache" in refused.value.message
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(PtoPatchError):
        run_reports_place("bench", model, tmp_path / "hub" / "elsewhere", "--output-dir")
    monkeypatch.setenv("PTO_PATCH_CACHE", str(tmp_path / "hub" / "mine"))  # a default there too
    with pytest.raises(PtoPatchError):
        run_reports_place("bench", model, None, "--output-dir")
