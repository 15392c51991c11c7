"""`--json` everywhere: each command prints exactly one JSON document on stdout, and nothing else.

Every command runs in a subprocess (as an agent runs it), with HF_HOME in a temporary folder.
A document carries `schema_version` and `command`, and its keys are the ones documented in
skills/pto-patch/references/json-schemas.md. An error in JSON mode is exactly
{error, hint, exit_code}, with the process exiting with that code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pto_patch.errors import EXIT_DRIFTED, EXIT_ERROR, EXIT_OK, EXIT_USAGE, EXIT_VERIFY_FAILED
from pto_patch.model.spec import load_spec
from pto_patch.tiny.model import make_tiny
from tests.folder_snapshot import snapshot
from tests.helpers.json_documents import SCHEMAS, assert_document

REPO = Path(__file__).resolve().parents[1]
ERROR_KEYS = {"error", "hint", "exit_code", "command"}
# The smallest verify / bench that still runs both modes end to end.
TINY_RUN = ("--warmup", "0", "--iters", "1", "--output_length", "4", "--device", "cpu", "--dtype", "fp32")
SPEC = load_spec("gutenocr_3b")


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("hf_home")
    drop = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT", SPEC.model_path_env)
    values = {
        key: value for key, value in os.environ.items() if key not in drop and "proxy" not in key.lower()
    }
    # NO_PROXY: the local hub on 127.0.0.1 is never reached through a proxy.
    values.update(
        HF_HOME=str(home), PTO_PATCH_DEBUG="0", PYTHONPATH=str(REPO), NO_PROXY="127.0.0.1,localhost"
    )
    return values


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("pristine") / "model").path


@pytest.fixture()
def model(pristine: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(pristine, folder)
    return folder


def run(env: dict[str, str], *args: str, cwd: Path | None = None) -> tuple[int, dict, str]:
    """Run pto-patch; return (exit code, the one JSON document on stdout, stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "pto_patch", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd or REPO,
        timeout=300,
    )
    try:
        document = json.loads(done.stdout)  # fails on anything besides one document
    except json.JSONDecodeError as exc:
        raise AssertionError(
            f"stdout is not one JSON document ({exc}):\n{done.stdout}\n{done.stderr}"
        ) from exc
    assert isinstance(document, dict), done.stdout
    return done.returncode, document, done.stderr


def assert_error(code: int, document: dict, expected_code: int) -> None:
    assert set(document) == ERROR_KEYS, document
    assert code == document["exit_code"] == expected_code, (code, document)
    assert document["error"] and document["hint"]
    assert "\n" not in document["error"]


# --- models -----------------------------------------------------------------------------------------


def entry_keys() -> set[str]:
    """The first column of the 'entry key' table under `## models` in json-schemas.md."""
    text = SCHEMAS.read_text(encoding="utf-8")
    section = re.search(r"^## models\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    table = section.split("| entry key |", 1)[1]
    return set(re.findall(r"^\| ([a-z_]+) \|", table, re.M))


def test_models(env):
    code, document, _ = run(env, "models", "--json")
    assert code == EXIT_OK
    assert_document(document, "models")
    assert document["models"] and all(set(entry) == entry_keys() for entry in document["models"])
    code, error, _ = run(env, "models", "--model", "no_such_model", "--json")
    assert_error(code, error, EXIT_USAGE)  # an unknown --model is a bad option value


# --- make-tiny, apply, status, restore --------------------------------------------------------------


def test_make_tiny(env, tmp_path: Path):
    code, document, _ = run(env, "make-tiny", str(tmp_path / "tiny"), "--layers", "1", "--json")
    assert code == EXIT_OK
    assert_document(document, "make-tiny")
    assert document["layers"] == 1
    assert sorted(document["files"]) == sorted(p.name for p in (tmp_path / "tiny").iterdir())


def test_apply_dry_run_names_files_and_ops_and_writes_nothing(env, model: Path):
    before = snapshot(model)
    code, document, _ = run(
        env, "apply", "--model-path", str(model), "--ops", "swiglu_mlp,mrope", "--dry-run", "--json"
    )
    assert code == EXIT_OK
    assert_document(document, "apply")
    assert document["dry_run"] is True
    assert set(document["ops"]) == {"mrope", "swiglu_mlp"}
    actions = {entry["path"]: entry["action"] for entry in document["files"]}
    assert actions["config.json"] == "modified"
    assert actions["modeling_qwen2_5_vl.py"] == "added"
    assert "pto_kernels/__init__.py" in actions
    assert "+++ b/modeling_qwen2_5_vl.py" in document["diff"]
    assert snapshot(model) == before


def test_apply_status_restore(env, model: Path):
    _, planned, _ = run(env, "apply", "--model-path", str(model), "--dry-run", "--json")
    code, applied, _ = run(env, "apply", "--model-path", str(model), "--json")
    assert code == EXIT_OK
    assert_document(applied, "apply")
    assert applied["dry_run"] is False and applied["already_applied"] is False
    assert applied["files"] == planned["files"]
    assert all((model / entry["path"]).is_file() for entry in applied["files"])

    code, again, _ = run(env, "apply", "--model-path", str(model), "--json")
    assert code == EXIT_OK and again["already_applied"] is True

    code, status, _ = run(env, "status", "--model-path", str(model), "--json")
    assert code == EXIT_OK
    assert_document(status, "status")
    assert status["patched"] is True and status["state"] == "complete" and status["drifted"] == []
    assert set(status["ops_found"]) == set(status["ops"]) == set(applied["ops"])

    code, restored, _ = run(env, "restore", "--model-path", str(model), "--json")
    assert code == EXIT_OK
    assert_document(restored, "restore")
    assert restored["restored"] == ["config.json"]
    assert "modeling_qwen2_5_vl.py" in restored["removed"]

    code, status, _ = run(env, "status", "--model-path", str(model), "--json")
    assert code == EXIT_OK and status["patched"] is False and status["state"] is None


def test_restore_of_an_edited_folder_is_a_drift_error_then_force_keeps_the_edit(env, model: Path):
    assert run(env, "apply", "--model-path", str(model), "--json")[0] == EXIT_OK
    with open(model / "modeling_qwen2_5_vl.py", "a", encoding="utf-8") as handle:
        handle.write("# edited\n")
    code, status, _ = run(env, "status", "--model-path", str(model), "--json")
    assert status["drifted"] == ["modeling_qwen2_5_vl.py"]

    code, error, _ = run(env, "restore", "--model-path", str(model), "--json")
    assert_error(code, error, EXIT_DRIFTED)
    assert "modeling_qwen2_5_vl.py" in error["error"] and "--force" in error["hint"]

    code, restored, _ = run(env, "restore", "--model-path", str(model), "--force", "--json")
    assert code == EXIT_OK
    assert restored["kept_edited"] == ["modeling_qwen2_5_vl.py.edited"]


def test_errors_are_one_object(env, model: Path, tmp_path: Path):
    code, error, _ = run(env, "status", "--model-path", str(tmp_path / "nowhere"), "--json")
    assert_error(code, error, EXIT_ERROR)
    assert str(tmp_path / "nowhere") in error["error"]

    assert error["command"] == "status"

    code, error, _ = run(env, "apply", "--model-path", str(model), "--ops", "layernorm", "--json")
    assert_error(code, error, EXIT_USAGE)  # a bad option value, as a bad --dtype is
    assert "layernorm" in error["error"] and error["command"] == "apply"


def test_usage_errors_are_one_object_with_exit_code_2(env, model: Path):
    code, error, _ = run(env, "apply", "--model-dir", str(model), "--json")
    assert_error(code, error, EXIT_USAGE)
    assert "--model-dir" in error["error"]
    code, error, _ = run(env, "make-tiny", str(model.parent / "t"), "--layers", "0", "--json")
    assert_error(code, error, EXIT_USAGE)


# --- download -------------------------------------------------------------------------------------


def test_download(env, pristine: Path, tmp_path: Path):
    from tests.local_hub import LocalHub

    with LocalHub() as hub:
        hub.add_repo(SPEC.hub_repo_id, {"main": pristine})
        hub_env = {**env, "HF_ENDPOINT": hub.url}
        target = tmp_path / "downloaded"
        code, document, _ = run(hub_env, "download", "--output-dir", str(target), "--json")
        assert code == EXIT_OK
        assert_document(document, "download")
        snapshot_main = hub.repos[SPEC.hub_repo_id].revisions["main"]
        assert document["commit"] == snapshot_main.commit and document["revision"] == "main"
        assert document["complete"] is True and document["files"] == len(snapshot_main.files)
        assert document["total_size"] == sum(len(data) for data in snapshot_main.files.values())

        code, error, _ = run(
            hub_env, "download", "--output-dir", str(tmp_path / "x"), "--model-id", "no/one", "--json"
        )
        assert_error(code, error, EXIT_ERROR)


# --- verify and bench ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_verify_report(env, model: Path, tmp_path: Path):
    assert run(env, "apply", "--model-path", str(model), "--json")[0] == EXIT_OK
    report_file = tmp_path / "verify.json"
    code, document, _ = run(
        env,
        "verify",
        "--model-path",
        str(model),
        "--use_pto",
        *TINY_RUN,
        "--report-file",
        str(report_file),
        "--json",
    )
    assert code == EXIT_OK, document["failures"]
    assert_document(document, "verify")
    assert document["passed"] is True and document["failures"] == []
    for op, entry in document["pto"]["ops"].items():  # a run's default: the reference's three ops
        switched_on = op in ("rms_norm", "mrope", "swiglu_mlp")
        assert entry["switched_on"] == switched_on and (entry["calls"] > 0) == switched_on, op
    assert json.loads(report_file.read_text(encoding="utf-8"))["passed"] is True

    checker = REPO / "skills" / "pto-patch" / "scripts" / "check_report.py"
    checked = subprocess.run([sys.executable, str(checker), str(report_file)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "FAIL " not in checked.stdout and "PASSED" in checked.stdout


def _drop_a_checkpoint_key(folder: Path) -> str:
    from safetensors.torch import load_file, save_file

    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    key = sorted(k for k in index["weight_map"] if "mlp" in k)[0]
    shard = folder / index["weight_map"].pop(key)
    tensors = load_file(shard)
    del tensors[key]
    save_file(tensors, shard, metadata={"format": "pt"})
    index_path.write_text(json.dumps(index, indent=2), encoding="utf-8")
    return key


@pytest.mark.slow
def test_verify_failure_is_a_report_with_exit_code_3(env, model: Path, tmp_path: Path):
    _drop_a_checkpoint_key(model)
    report_file = tmp_path / "verify.json"
    code, document, _ = run(
        env,
        "verify",
        "--model-path",
        str(model),
        "--baseline-only",
        *TINY_RUN,
        "--report-file",
        str(report_file),
        "--json",
    )
    assert code == EXIT_VERIFY_FAILED
    assert not ERROR_KEYS <= set(document)
    assert_document(document, "verify")
    assert document["passed"] is False and any("missing" in failure for failure in document["failures"])

    checker = REPO / "skills" / "pto-patch" / "scripts" / "check_report.py"
    checked = subprocess.run([sys.executable, str(checker), str(report_file)], capture_output=True, text=True)
    assert checked.returncode == EXIT_VERIFY_FAILED, checked.stdout + checked.stderr
    assert "FAIL  no missing keys" in checked.stdout


@pytest.mark.slow
def test_bench_report(env, model: Path, tmp_path: Path):
    assert run(env, "apply", "--model-path", str(model), "--json")[0] == EXIT_OK
    out = tmp_path / "bench"
    code, document, _ = run(
        env,
        "bench",
        "--model-path",
        str(model),
        "--batches",
        "1",
        *TINY_RUN,
        "--output-dir",
        str(out),
        "--json",
    )
    assert code == EXIT_OK, document.get("failures")
    assert_document(document, "bench")
    assert [entry["batch"] for entry in document["runs"]] == [1]
    assert sorted(Path(path).name for path in document["files"]) == [
        "bench_baseline.json",
        "bench_pypto.json",
    ]
    assert all(Path(path).is_file() for path in document["files"])


# --- skill --------------------------------------------------------------------------------------------


def test_skill_install(env, tmp_path: Path):
    code, document, _ = run(env, "skill", "install", "--json", cwd=tmp_path)
    assert code == EXIT_OK
    assert_document(document, "skill install")
    assert document["action"] == "installed"
    assert Path(document["destination"]) == tmp_path / ".agents" / "skills" / "pto-patch"

    code, document, _ = run(env, "skill", "install", "--json", cwd=tmp_path)
    assert code == EXIT_OK and document["action"] == "unchanged"

    (tmp_path / ".agents" / "skills" / "pto-patch" / "SKILL.md").write_text("edited\n", encoding="utf-8")
    code, error, _ = run(env, "skill", "install", "--json", cwd=tmp_path)
    assert_error(code, error, EXIT_ERROR)
    assert "SKILL.md" in error["error"] and "--force" in error["hint"]
