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


# --- first mistakes answered ----------------------------------------------------------------------


def test_the_hub_id_the_readme_names_is_the_spec(model_folder: Path, capsys):
    code, status = json_cli(
        capsys, "status", "--model", "rootsautomation/GutenOCR-3B", "--model-path", str(model_folder)
    )
    assert code == EXIT_OK and status["spec"] == "gutenocr_3b"
    code, error = json_cli(capsys, "status", "--model", "nobody/nothing", "--model-path", str(model_folder))
    assert code == EXIT_USAGE and "hub id" in error["hint"]


def test_a_folder_given_to_model_names_model_path(model_folder: Path, capsys, monkeypatch):
    code, error = json_cli(capsys, "status", "--model", str(model_folder))
    assert code == EXIT_USAGE and "is a folder" in error["error"]
    assert error["hint"] == f"pass the model folder as --model-path {model_folder}"
    monkeypatch.chdir(model_folder.parent)  # the bare name of a folder here, too
    code, error = json_cli(capsys, "status", "--model", model_folder.name)
    assert code == EXIT_USAGE and f"--model-path {model_folder.name}" in error["hint"]


def test_config_json_given_as_the_model_path_names_its_folder(model_folder: Path, capsys):
    code, error = json_cli(capsys, "status", "--model-path", str(model_folder / "config.json"))
    assert code == 1 and "is a file" in error["error"]
    assert error["hint"] == f"pass its folder: --model-path {model_folder}"


def test_a_hub_cache_repo_folder_points_to_its_snapshot(tmp_path: Path, capsys):
    repo = tmp_path / "hub" / "models--rootsautomation--GutenOCR-3B"
    snapshot_dir = repo / "snapshots" / "0123abc"
    snapshot_dir.mkdir(parents=True)
    (repo / "blobs").mkdir()
    write_config(snapshot_dir, HUB_CONFIG)
    code, error = json_cli(capsys, "status", "--model-path", str(repo))
    assert code == 1 and "cache repo folder" in error["error"]
    assert error["hint"] == f"pass one of its snapshots: --model-path {snapshot_dir}"


def test_an_in_place_apply_on_a_cache_snapshot_suggests_overlay(tmp_path: Path, capsys):
    snapshot_dir = tmp_path / "hub" / "models--o--n" / "snapshots" / "0123abc"
    snapshot_dir.mkdir(parents=True)
    write_config(snapshot_dir, HUB_CONFIG)
    capsys.readouterr()
    assert cli("apply", "--model-path", str(snapshot_dir)) == EXIT_OK
    err = " ".join(capsys.readouterr().err.split())
    assert "is a Hugging Face cache snapshot" in err and "--overlay DIR" in err
    cli("restore", "--model-path", str(snapshot_dir))
    plain = tmp_path / "plain"
    plain.mkdir()
    write_config(plain, HUB_CONFIG)
    capsys.readouterr()
    assert cli("apply", "--model-path", str(plain)) == EXIT_OK
    assert "--overlay" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (("apply", "./tiny"), "pass the model folder as --model-path ./tiny"),
        (("status", "./tiny"), "pass the model folder as --model-path ./tiny"),
        (("bench", "--use_pto"), "bench always runs the kernels off and on: drop --use_pto"),
        (("verify", "--batches", "1,4"), "verify runs one batch size: --batch N"),
    ],
)
def test_a_first_usage_mistake_gets_a_hint(args, hint, capsys):
    assert cli(*args) == EXIT_USAGE
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("hint: ") and hint in last
    code, error = json_cli(capsys, *args)
    assert code == EXIT_USAGE and hint in error["hint"] and error["command"] == args[0]


def test_dash_h_is_help_everywhere(capsys):
    for args in ((), ("apply",), ("verify",), ("skill", "install")):
        with pytest.raises(SystemExit) as done:
            main([*args, "-h"])
        assert done.value.code in (0, None), args
        assert capsys.readouterr().out.startswith("Usage: pto-patch"), args


def test_help_lists_each_command_by_its_whole_first_sentence(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = " ".join(capsys.readouterr().out.split("Commands:")[1].split())
    assert "..." not in listing
    assert (
        "Run the patched model with the kernels off, then on; check it computes the same, and time it."
        in listing
    )


def test_the_edit_hints_name_restore_force_and_the_kept_copy(model_folder: Path, capsys):
    from pto_patch.errors import PtoPatchError
    from pto_patch.run.folder import check_folder

    engine.apply_patch(model_path=model_folder)
    edit(model_folder, "mine")
    with pytest.raises(PtoPatchError) as refused:
        check_folder(model_folder, use_pto=True, allow_modified=False)
    assert f"pto-patch restore --model-path {model_folder} --force" in refused.value.hint
    assert "modeling_qwen2_5_vl.py.edited" in refused.value.hint
    (model_folder / "modeling_qwen2_5_vl.py.edited").write_text("an earlier kept copy")
    code, error = json_cli(capsys, "apply", "--model-path", str(model_folder))
    assert code == 4 and "--force" in error["hint"] and "modeling_qwen2_5_vl.py.edited.2" in error["hint"]


# --- one exit code per kind of mistake ------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("verify", "--dtype", "fp8"),
        ("verify", "--kernel-backend", "cuda"),
        ("verify", "--ops", "layernorm"),
        ("bench", "--ops", "layernorm"),
        ("apply", "--ops", "layernorm"),
        ("apply", "--model", "qwen9"),
    ],
)
def test_a_bad_option_value_exits_2(model_folder: Path, args, capsys):
    code, error = json_cli(capsys, *args, "--model-path", str(model_folder))
    assert code == EXIT_USAGE == error["exit_code"], error


# --- smaller ------------------------------------------------------------------------------------------


def test_a_dry_run_of_a_patched_folder_says_dry_run(model_folder: Path, capsys):
    engine.apply_patch(model_path=model_folder)
    code, document = json_cli(capsys, "apply", "--model-path", str(model_folder), "--dry-run")
    assert code == EXIT_OK and document["already_applied"] and document["dry_run"] is True


def test_a_dry_run_diffs_an_added_modeling_file_against_its_source(model_folder: Path, capsys):
    from pto_patch.model.locate import installed_transformers_dir

    source = installed_transformers_dir() / "models" / "qwen2_5_vl" / "modeling_qwen2_5_vl.py"
    capsys.readouterr()
    assert cli("apply", "--model-path", str(model_folder), "--dry-run") == EXIT_OK
    diff = capsys.readouterr().out
    assert f"--- {source}\n+++ b/modeling_qwen2_5_vl.py" in diff and "--- /dev/null" not in diff
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert len(added) < len(source.read_text().splitlines()) / 2  # the rewrite's lines, not the whole file


def test_status_text_says_the_state_its_json_says(model_folder: Path, capsys):
    engine.apply_patch(model_path=model_folder)
    code, document = json_cli(capsys, "status", "--model-path", str(model_folder))
    cli("status", "--model-path", str(model_folder))
    assert document["state"] == "complete" and f"patched ({document['state']})" in capsys.readouterr().out


def test_an_interrupted_json_run_still_prints_one_document(model_folder: Path, capsys, monkeypatch):
    from pto_patch.patching import folder_status

    def interrupted(**_):
        raise KeyboardInterrupt

    monkeypatch.setattr(folder_status, "model_status", interrupted)
    code, document = json_cli(capsys, "status", "--model-path", str(model_folder))
    assert code == 130 == document["exit_code"] and document["error"] == "interrupted"
    assert document["command"] == "status"


def test_make_tiny_weights_are_as_readable_as_its_other_files(tmp_path: Path):
    from pto_patch.hub.tiny_model import make_tiny

    make_tiny(tmp_path / "tiny")
    config_mode = (tmp_path / "tiny" / "config.json").stat().st_mode & 0o777
    shards = sorted((tmp_path / "tiny").glob("*.safetensors"))
    assert shards and {shard.stat().st_mode & 0o777 for shard in shards} == {config_mode}
