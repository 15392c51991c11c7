"""apply / restore / status on small model folders: byte-exact undo, errors, interrupted applies."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest

from pto_patch.errors import DriftError, ModelFolderError, PtoPatchError, SpecError
from pto_patch.model.spec import OPS
from pto_patch.patching import engine, fileio
from pto_patch.patching.manifest import Manifest, drifted_files
from tests.folder_snapshot import snapshot
from tests.helpers.cli import run_cli
from tests.helpers.folders import HUB_CONFIG, write_config


def test_apply_then_restore_is_byte_identical(model_folder: Path):
    before = snapshot(model_folder)
    result = engine.apply_patch(model_path=model_folder)
    assert result.ops == OPS  # every op by default, the decoder-layer blocks included
    assert snapshot(model_folder) != before
    config = json.loads((model_folder / "config.json").read_text())
    assert (
        config["auto_map"]["AutoModelForCausalLM"]
        == "modeling_qwen2_5_vl.GutenOcr3BVLForConditionalGeneration"
    )
    assert config["auto_map"]["AutoConfig"] == "configuration_qwen2_5_vl.GutenOcr3BVLConfig"
    assert config["rope_scaling"] == {"type": "mrope", "mrope_section": [16, 24, 24]}
    assert list(config)[: len(HUB_CONFIG)] == list(HUB_CONFIG)  # key order kept
    assert (model_folder / "pto_kernels" / "__init__.py").is_file()
    assert (model_folder / "modeling_qwen2_5_vl.py").is_file()
    assert drifted_files(model_folder) == []
    engine.restore_model(model_path=model_folder)
    assert snapshot(model_folder) == before


def test_crlf_files_and_symbolic_links_survive(tmp_path: Path):
    # Hugging Face cache layout: snapshot files are links to shared blobs.
    blobs, folder = tmp_path / "blobs", tmp_path / "snapshots" / "abc123"
    blobs.mkdir()
    folder.mkdir(parents=True)
    blob = write_config(blobs, HUB_CONFIG, newline="\r\n").rename(blobs / "0f1e2d")
    os.symlink(os.path.relpath(blob, folder), folder / "config.json")
    blob_bytes = blob.read_bytes()
    before = snapshot(folder)
    engine.apply_patch(model_path=folder)
    assert not (folder / "config.json").is_symlink()
    assert blob.read_bytes() == blob_bytes  # never written through the link
    assert b"\r\n" in (folder / "config.json").read_bytes()
    engine.restore_model(model_path=folder)
    assert snapshot(folder) == before
    assert blob.read_bytes() == blob_bytes


def test_folder_shipping_its_own_crlf_modeling_file(model_folder: Path):
    from pto_patch.model.locate import installed_transformers_dir

    source = installed_transformers_dir() / "models" / "qwen2_5_vl" / "modeling_qwen2_5_vl.py"
    crlf = source.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    (model_folder / "modeling_qwen2_5_vl.py").write_bytes(crlf)
    before = snapshot(model_folder)
    result = engine.apply_patch(model_path=model_folder)
    assert ("modeling_qwen2_5_vl.py", "modified") in result.files
    patched = (model_folder / "modeling_qwen2_5_vl.py").read_bytes()
    assert patched.count(b"\r\n") == patched.count(b"\n")  # still CRLF throughout
    engine.restore_model(model_path=model_folder)
    assert snapshot(model_folder) == before


def test_second_apply_is_a_noop(model_folder: Path):
    engine.apply_patch(model_path=model_folder)
    after_first = snapshot(model_folder)
    again = engine.apply_patch(model_path=model_folder)
    assert again.already_applied
    assert snapshot(model_folder) == after_first


def test_apply_with_other_ops_on_a_patched_folder_is_refused(model_folder: Path):
    engine.apply_patch(model_path=model_folder, ops="rms_norm")
    with pytest.raises(ModelFolderError, match="already patched"):
        engine.apply_patch(model_path=model_folder, ops="mrope")


@pytest.mark.parametrize("ops", ["", " , ", "rms_norm,softmax"])
def test_ops_that_name_nothing_or_an_unknown_op_are_refused(model_folder: Path, ops):
    before = snapshot(model_folder)
    with pytest.raises(SpecError):
        engine.apply_patch(model_path=model_folder, ops=ops)
    assert snapshot(model_folder) == before


def test_ops_subset_is_recorded(model_folder: Path):
    result = engine.apply_patch(model_path=model_folder, ops="swiglu_mlp,rms_norm")
    assert result.ops == ("rms_norm", "swiglu_mlp")
    assert Manifest.load(model_folder).ops == ("rms_norm", "swiglu_mlp")
    status = engine.model_status(model_path=model_folder)
    assert set(status.ops_found) == {"rms_norm", "swiglu_mlp"}


def test_dry_run_writes_nothing_and_shows_a_diff(model_folder: Path, capsys):
    before = snapshot(model_folder)
    assert run_cli("apply", "--model-path", str(model_folder), "--dry-run") == 0
    assert snapshot(model_folder) == before
    diff = capsys.readouterr().out
    assert "+++ b/modeling_qwen2_5_vl.py" in diff
    assert '+  "auto_map": {' in diff
    assert "pto_kernels/__init__.py" in diff


def test_restore_refuses_a_file_edited_since_apply(model_folder: Path, capsys):
    engine.apply_patch(model_path=model_folder)
    modeling = model_folder / "modeling_qwen2_5_vl.py"
    modeling.write_text(modeling.read_text() + "\n# my edit\n")
    with pytest.raises(DriftError):
        engine.restore_model(model_path=model_folder)
    assert run_cli("restore", "--model-path", str(model_folder)) == 4
    assert "changed since apply" in capsys.readouterr().err
    modeling.chmod(0o640)
    result = engine.restore_model(model_path=model_folder, force=True)
    assert (model_folder / "modeling_qwen2_5_vl.py.edited").stat().st_mode & 0o777 == 0o640
    assert result.kept_edited == ("modeling_qwen2_5_vl.py.edited",)
    assert "# my edit" in (model_folder / "modeling_qwen2_5_vl.py.edited").read_text()
    assert not (model_folder / "modeling_qwen2_5_vl.py").exists()
    assert not (model_folder / ".pto_patch").exists()


@pytest.mark.parametrize("fail_at", [0, 1, 2, 4, 8])
def test_a_failed_write_rolls_the_apply_back_at_once(model_folder: Path, monkeypatch, capsys, fail_at):
    before = snapshot(model_folder)
    real_write = engine.atomic_write_bytes
    writes = {"n": 0}

    def write_failing_once(path, data, **kwargs):
        writes["n"] += 1
        if writes["n"] == fail_at + 1:
            raise OSError(28, "No space left on device")
        real_write(path, data, **kwargs)

    monkeypatch.setattr(engine, "atomic_write_bytes", write_failing_once)
    assert run_cli("apply", "--model-path", str(model_folder)) == 1
    stderr = capsys.readouterr().err
    assert "No space left on device" in stderr and "rolled back" in stderr
    assert "Traceback" not in stderr
    assert snapshot(model_folder) == before


# Every file operation from the Nth on fails, so the immediate rollback fails too (as if the process
# died): the message says so, and the next command finds the manifest in progress and rolls back.
@pytest.mark.parametrize("nth", [2, 4, 8, 16])
def test_interrupted_apply_is_rolled_back_by_the_next_command(model_folder: Path, nth):
    before = snapshot(model_folder)
    with fileio.injected_faults(fileio.FaultPlan(nth=nth, error=errno.EIO, persistent=True)):
        with pytest.raises(PtoPatchError, match="rolling it back failed too") as failed:
            engine.apply_patch(model_path=model_folder)
    assert "left: " in failed.value.message and "pto-patch restore" in failed.value.hint
    assert snapshot(model_folder) != before
    status = engine.model_status(model_path=model_folder)
    assert not status.patched
    restored = engine.restore_model(model_path=model_folder)
    assert restored.was_interrupted
    assert snapshot(model_folder) == before


def test_interrupted_apply_is_completed_by_the_next_apply(model_folder: Path):
    before = snapshot(model_folder)
    with fileio.injected_faults(fileio.FaultPlan(nth=10, error=errno.ENOSPC, persistent=True)):
        with pytest.raises(PtoPatchError, match="No space left on device"):
            engine.apply_patch(model_path=model_folder)
    result = engine.apply_patch(model_path=model_folder)
    assert result.rolled_back_interrupted
    assert engine.model_status(model_path=model_folder).patched
    engine.restore_model(model_path=model_folder)
    assert snapshot(model_folder) == before


def test_model_path_falls_back_to_env_then_cwd(model_folder: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("GUTENOCR_MODEL_PATH", str(model_folder))
    assert engine.apply_patch().folder == model_folder.resolve()
    engine.restore_model()
    monkeypatch.delenv("GUTENOCR_MODEL_PATH")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    with pytest.raises(ModelFolderError, match="has no config.json"):
        engine.apply_patch()
    monkeypatch.chdir(model_folder)
    assert engine.apply_patch().folder == model_folder.resolve()


def _bad_folders(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    cases = {}
    missing = tmp_path / "missing"
    cases["missing folder"] = (missing, "does not exist")
    no_config = tmp_path / "no_config"
    no_config.mkdir()
    cases["no config.json"] = (no_config, "has no config.json")
    malformed = tmp_path / "malformed"
    malformed.mkdir()
    (malformed / "config.json").write_text('{"model_type": "qwen2_5_vl",')
    cases["malformed config.json"] = (malformed, "is not valid JSON")
    other = tmp_path / "llama"
    other.mkdir()
    write_config(other, {**HUB_CONFIG, "model_type": "llama"})
    cases["other model_type"] = (other, "model_type 'llama'")
    return cases


@pytest.mark.parametrize(
    "case", ["missing folder", "no config.json", "malformed config.json", "other model_type"]
)
def test_bad_folders_get_one_line_a_hint_and_exit_1(tmp_path: Path, capsys, case):
    folder, message = _bad_folders(tmp_path)[case]
    before = snapshot(folder) if folder.exists() else None
    # a file the tool reads that is not what it must be is the user's input: exit 2 (issue 51)
    assert run_cli("apply", "--model-path", str(folder)) == (2 if case == "malformed config.json" else 1)
    stderr = capsys.readouterr().err
    lines = stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error:") and lines[1].startswith("hint:")
    assert message in lines[0]
    assert "Traceback" not in stderr
    if before is not None:
        assert snapshot(folder) == before


def test_unknown_model_lists_the_known_ones(model_folder: Path, capsys):
    with pytest.raises(SpecError):
        engine.apply_patch(model="qwen9", model_path=model_folder)
    assert run_cli("apply", "--model", "qwen9", "--model-path", str(model_folder)) == 2  # a bad option value
    hint = capsys.readouterr().err.splitlines()[-1]
    assert hint.startswith("hint: known models: ") and "gutenocr_3b, " in hint and "qwen9" not in hint


def test_missing_transformers_is_an_error_and_writes_nothing(model_folder: Path, monkeypatch, capsys):
    import pto_patch.model.locate as locate

    monkeypatch.setattr(locate, "installed_transformers_release", lambda: None)
    before = snapshot(model_folder)
    assert run_cli("apply", "--model-path", str(model_folder)) == 1
    assert "transformers is not installed" in capsys.readouterr().err
    assert snapshot(model_folder) == before


def test_the_installed_release_is_read_as_importlib_metadata_reads_it(tmp_path: Path, monkeypatch):
    import importlib.metadata

    from pto_patch.model.locate import installed_transformers_release

    assert installed_transformers_release() == importlib.metadata.version("transformers")
    for kind, file_name in ((".egg-info", "PKG-INFO"), (".dist-info", "METADATA")):
        site = tmp_path / kind.strip(".")
        info = site / f"transformers-9.9.9{kind}"
        info.mkdir(parents=True)
        (info / file_name).write_text(
            "Metadata-Version: 2.1\nName: transformers\nVersion: 9.9.9\n\nVersion: 1\n"
        )
        monkeypatch.syspath_prepend(str(site))
        assert installed_transformers_release() == "9.9.9" == importlib.metadata.version("transformers")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "empty")])
    assert installed_transformers_release() is None


def test_missing_anchor_leaves_the_folder_untouched(model_folder: Path, capsys):
    source = model_folder / "modeling_qwen2_5_vl.py"
    source.write_text("import torch\n\nclass Unrelated:\n    pass\n")
    before = snapshot(model_folder)
    assert run_cli("apply", "--model-path", str(model_folder)) == 1
    assert snapshot(model_folder) == before
    assert "Traceback" not in capsys.readouterr().err


def test_debug_variable_shows_the_traceback(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("PTO_PATCH_DEBUG", "1")
    assert run_cli("apply", "--model-path", str(tmp_path / "nope")) == 1
    assert "Traceback" in capsys.readouterr().err


def test_status_reports_release_change_and_drift(model_folder: Path, monkeypatch, capsys):
    assert not engine.model_status(model_path=model_folder).patched
    engine.apply_patch(model_path=model_folder)
    status = engine.model_status(model_path=model_folder)
    assert status.patched and not status.drifted and not status.needs_reapply
    assert set(status.ops_found) == set(OPS)
    (model_folder / "pto_kernels" / "__init__.py").write_text("# replaced\n")
    from pto_patch.patching import folder_status

    monkeypatch.setattr(folder_status, "installed_transformers_release", lambda: "9.9.9")
    status = engine.model_status(model_path=model_folder)
    assert status.drifted == ("pto_kernels/__init__.py",)
    assert status.needs_reapply
    assert run_cli("status", "--model-path", str(model_folder), "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 1 and doc["needs_reapply"] is True
    assert doc["drifted"] == ["pto_kernels/__init__.py"]


def test_restore_removes_kernel_bytecode_and_purges_module_cache(model_folder: Path, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    before = snapshot(model_folder)
    engine.apply_patch(model_path=model_folder)
    cache = tmp_path / "modules" / "transformers_modules" / "GutenOCR_hyphen_3B" / "0123"
    cache.mkdir(parents=True)
    (cache / "modeling_qwen2_5_vl.py").write_bytes((model_folder / "modeling_qwen2_5_vl.py").read_bytes())
    other = cache.parent / "4567"  # another folder of the same name, with its own code
    other.mkdir()
    (other / "modeling_qwen2_5_vl.py").write_text("# someone else's remote code\n")
    pycache = model_folder / "pto_kernels" / "__pycache__"
    pycache.mkdir()
    (pycache / "__init__.cpython-311.pyc").write_bytes(b"\0")
    result = engine.restore_model(model_path=model_folder)
    assert snapshot(model_folder) == before
    assert result.purged_module_caches == (str(cache),) and not cache.exists()
    assert (other / "modeling_qwen2_5_vl.py").is_file()
