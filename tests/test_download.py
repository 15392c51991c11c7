"""pto-patch download against a local hub: the real huggingface_hub client talks to tests/local_hub.py."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest

from pto_patch.errors import DownloadError
from pto_patch.hub import download as download_engine
from pto_patch.hub import hub_errors
from pto_patch.hub.download import DOWNLOAD_RECORD, download_model
from pto_patch.model.spec import load_spec
from pto_patch.tiny.model import make_tiny
from tests.folder_snapshot import snapshot
from tests.helpers.cli import run_cli
from tests.local_hub import LocalHub, read_folder

REPO = load_spec("gutenocr_3b").hub_repo_id
# tests/test_download_hubs.py runs this file under huggingface_hub 0.x and 1.x too; the venv has 2.x.
HUB_MAJOR = int(huggingface_hub.__version__.split(".")[0])
SHARD = "model-00001-of-00002.safetensors"
BIG = "extra/big.safetensors"
TOKEN = "hf_local_test_token"


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    main_folder = make_tiny(root / "main", seed=0).path
    v1_folder = make_tiny(root / "v1", seed=1, layers=1).path
    big_folder = root / "big"
    shutil.copytree(main_folder, big_folder)
    # Larger than huggingface_hub's 10 MiB read chunk, so a transfer cut past it resumes with a Range request.
    (big_folder / BIG).parent.mkdir()
    (big_folder / BIG).write_bytes(os.urandom(12 * 1024 * 1024))
    no_tokenizer = root / "no_tokenizer"
    shutil.copytree(main_folder, no_tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json"):
        (no_tokenizer / name).unlink(missing_ok=True)
    return {"main": main_folder, "v1": v1_folder, "big": big_folder, "no_tokenizer": no_tokenizer}


@pytest.fixture()
def hub(sources, tmp_path: Path, monkeypatch) -> LocalHub:
    for name in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_CACHE",
    ):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")  # the local hub is never reached through a proxy
    monkeypatch.delenv(load_spec("gutenocr_3b").model_path_env, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    with LocalHub() as server:
        server.add_repo(REPO, {"main": sources["main"], "v1": sources["v1"]})
        server.add_repo("local/big", {"main": sources["big"]})
        server.add_repo("local/private", {"main": sources["main"]}, token=TOKEN)
        server.add_repo("local/gated", {"main": sources["main"]}, gated=True)
        server.add_repo("local/no-tokenizer", {"main": sources["no_tokenizer"]})
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def model_files(folder: Path) -> dict[str, bytes]:
    """The folder's files without the bookkeeping (huggingface_hub's .cache, our record)."""
    return read_folder(folder)


def leftovers(folder: Path) -> list[str]:
    return [
        p.name
        for p in folder.rglob("*")
        if p.name.endswith((".incomplete", ".tmp", ".lock")) and p.stat().st_size
    ]


# --- transfers ------------------------------------------------------------------------------------


def test_download_is_byte_identical_and_recorded(hub: LocalHub, sources, tmp_path: Path) -> None:
    result = download_model(output_dir=tmp_path / "model")
    snapshot_main = hub.repos[REPO].revisions["main"]
    assert model_files(result.folder) == snapshot_main.files == read_folder(sources["main"])
    assert result.complete and result.commit == snapshot_main.commit
    assert result.files == len(snapshot_main.files)
    assert result.total_size == sum(len(data) for data in snapshot_main.files.values())
    assert sorted(result.fetched) == sorted(snapshot_main.files)
    record = json.loads((result.folder / DOWNLOAD_RECORD).read_text())
    assert record["repo_id"] == REPO and record["commit"] == snapshot_main.commit
    assert record["files"] == {name: len(data) for name, data in snapshot_main.files.items()}


def test_second_run_only_checks(hub: LocalHub, tmp_path: Path) -> None:
    download_model(output_dir=tmp_path / "model")
    before = snapshot(tmp_path / "model")
    transfers = len(hub.gets())
    again = download_model(output_dir=tmp_path / "model")
    assert again.checked_only and again.complete
    assert len(hub.gets()) == transfers, "a complete folder was transferred again"
    assert snapshot(tmp_path / "model") == before


def test_model_id_output_dir_from_env_and_status_shows_commit(
    hub: LocalHub, tmp_path: Path, monkeypatch
) -> None:
    spec = load_spec("gutenocr_3b")
    monkeypatch.setenv(spec.model_path_env, str(tmp_path / "from_env"))
    result = download_model(model_id="local/big", include=("*.json",))
    assert result.folder == (tmp_path / "from_env").resolve()
    assert result.repo_id == "local/big"

    from pto_patch.patching import engine

    status = engine.model_status(model_path=result.folder)
    assert status.download is not None and status.download["commit"] == result.commit


def test_include_and_exclude_select_files(hub: LocalHub, tmp_path: Path) -> None:
    only_json = download_model(output_dir=tmp_path / "json", include=("*.json",))
    names = set(model_files(only_json.folder))
    assert names and all(name.endswith(".json") for name in names)
    assert not only_json.complete  # no weights: a partial folder, and said so

    no_weights = download_model(output_dir=tmp_path / "noweights", exclude=("*.safetensors",))
    expected = {n for n in hub.repos[REPO].revisions["main"].files if not n.endswith(".safetensors")}
    assert set(model_files(no_weights.folder)) == expected

    # Completing the partial folder later fetches only what is missing.
    completed = download_model(output_dir=tmp_path / "json")
    assert completed.complete
    assert set(completed.fetched) == {
        n for n in hub.repos[REPO].revisions["main"].files if not n.endswith(".json")
    }


def test_patterns_that_match_nothing_are_an_error(hub: LocalHub, tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match="no file"):
        download_model(output_dir=tmp_path / "m", include=("*.gguf",))


def test_revision_by_tag_and_by_commit(hub: LocalHub, sources, tmp_path: Path) -> None:
    tagged = download_model(output_dir=tmp_path / "tag", revision="v1")
    v1 = hub.repos[REPO].revisions["v1"]
    assert tagged.commit == v1.commit != hub.repos[REPO].revisions["main"].commit
    assert model_files(tagged.folder) == read_folder(sources["v1"])
    by_commit = download_model(output_dir=tmp_path / "commit", revision=v1.commit)
    assert model_files(by_commit.folder) == read_folder(sources["v1"])


def test_switching_revision_in_place_replaces_the_files(hub: LocalHub, sources, tmp_path: Path) -> None:
    download_model(output_dir=tmp_path / "m")
    switched = download_model(output_dir=tmp_path / "m", revision="v1")
    assert model_files(switched.folder) == read_folder(sources["v1"])
    assert json.loads((switched.folder / DOWNLOAD_RECORD).read_text())["commit"] == switched.commit


def test_token_the_server_requires(hub: LocalHub, tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(DownloadError, match="not found") as missing:
        download_model(model_id="local/private", output_dir=tmp_path / "none")
    assert "token" in missing.value.hint
    result = download_model(model_id="local/private", output_dir=tmp_path / "flag", token=TOKEN)
    assert result.complete
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert download_model(model_id="local/private", output_dir=tmp_path / "env").complete
    sent = {r.authorization for r in hub.requests if "private" in r.path}
    assert f"Bearer {TOKEN}" in sent


def test_transfer_cut_midway_resumes_with_a_range_request(hub: LocalHub, sources, tmp_path: Path) -> None:
    cut_at = 11 * 1024 * 1024
    hub.cut[BIG] = cut_at
    if HUB_MAJOR == 0:  # hub 0.x does not resume within a run: the run stops, and the rerun resumes
        with pytest.raises(DownloadError, match="broke off") as broke:
            download_model(model_id="local/big", output_dir=tmp_path / "m")
        assert "run the same command again" in broke.value.hint
    result = download_model(model_id="local/big", output_dir=tmp_path / "m")
    assert model_files(result.folder) == read_folder(sources["big"])
    ranges = [r.range for r in hub.gets() if r.range]
    assert len(ranges) == 1, ranges
    resumed_from = int(ranges[0].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_from <= cut_at  # not from zero: the bytes that arrived were kept


def test_interrupted_run_keeps_finished_files_and_the_rerun_fetches_the_rest(
    hub: LocalHub, tmp_path: Path
) -> None:
    hub.fail[SHARD] = 500
    folder = tmp_path / "m"
    if HUB_MAJOR == 0:  # hub 0.x retries a 5xx answer itself, so the run completes
        assert download_model(output_dir=folder).complete
        assert SHARD not in hub.fail, "the failure was never served"
        assert model_files(folder) == hub.repos[REPO].revisions["main"].files
        return
    with pytest.raises(DownloadError, match="500"):
        download_model(output_dir=folder)
    assert not (folder / SHARD).exists(), "a half-written shard was left under its final name"
    assert not (folder / DOWNLOAD_RECORD).exists()
    assert leftovers(folder) == []
    finished = set(model_files(folder))
    assert finished, "nothing was kept from the interrupted run"

    gets_before = len(hub.gets())
    result = download_model(output_dir=folder)
    assert result.complete
    refetched = {r.path for r in hub.gets()[gets_before:]}
    assert len(refetched) == 1 and "/blobs/" in next(iter(refetched))  # only the failed shard's blob
    assert set(result.fetched) == {SHARD}
    assert model_files(folder) == hub.repos[REPO].revisions["main"].files


def test_a_shard_of_the_wrong_size_is_refetched(hub: LocalHub, tmp_path: Path) -> None:
    result = download_model(output_dir=tmp_path / "m")
    shard = result.folder / SHARD
    shard.write_bytes(shard.read_bytes()[:-100])
    fixed = download_model(output_dir=tmp_path / "m")
    assert SHARD in fixed.fetched
    assert model_files(fixed.folder) == hub.repos[REPO].revisions["main"].files


# --- refusals and errors -----------------------------------------------------------------------------


def test_refuses_a_folder_with_an_applied_patch(hub: LocalHub, tmp_path: Path) -> None:
    folder = tmp_path / "patched"
    (folder / ".pto_patch").mkdir(parents=True)
    (folder / ".pto_patch" / "manifest.json").write_text("{}")
    with pytest.raises(DownloadError, match="applied") as refused:
        download_model(output_dir=folder)
    assert "pto-patch restore" in refused.value.hint
    assert hub.requests == [] or all("agent-harnesses" in r.path for r in hub.requests)


def test_refuses_a_folder_holding_only_the_backups_of_an_interrupted_apply(
    hub: LocalHub, tmp_path: Path
) -> None:
    """An apply killed after its backups, before its manifest: `.pto_patch/` holds only backups."""
    folder = tmp_path / "half-patched"
    (folder / ".pto_patch" / "backup").mkdir(parents=True)
    (folder / ".pto_patch" / "backup" / "config.json").write_text("{}")
    before = snapshot(folder)
    with pytest.raises(DownloadError, match="interrupted pto-patch apply") as refused:
        download_model(output_dir=folder)
    assert "pto-patch restore" in refused.value.hint
    assert snapshot(folder) == before
    assert hub.requests == [] or all("agent-harnesses" in r.path for r in hub.requests)


def test_no_output_dir_names_the_flag_and_the_variable(hub: LocalHub, capsys) -> None:
    assert run_cli("download") == 2
    err = capsys.readouterr().err
    assert "--output-dir" in err and load_spec("gutenocr_3b").model_path_env in err


@pytest.mark.parametrize(
    ("kwargs", "message", "hint"),
    [
        ({"model_id": "nobody/nothing"}, "not found", "--model-id"),
        ({"model_id": "local/gated"}, "gated", "conditions"),
        ({"revision": "no-such-branch"}, "revision 'no-such-branch' not found", "--revision"),
        ({"model_id": "local/private", "token": "hf_wrong"}, "rejected the token", "HF_TOKEN"),
    ],
    ids=["repo-not-found", "gated", "revision-not-found", "bad-token"],
)
def test_hub_errors_are_one_line_with_a_hint(hub: LocalHub, tmp_path: Path, kwargs, message, hint) -> None:
    folder = tmp_path / "m"
    with pytest.raises(DownloadError, match=message) as error:
        download_model(output_dir=folder, **kwargs)
    assert "\n" not in error.value.message and hint in error.value.hint
    assert error.value.exit_code == 1
    assert not folder.exists() or model_files(folder) == {}


def test_a_repo_without_a_tokenizer_says_what_it_lacks(hub: LocalHub, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    with pytest.raises(DownloadError, match="has no tokenizer file tokenizer_config.json") as lacking:
        download_model(model_id="local/no-tokenizer", output_dir=folder)
    assert "tokenizer.json or vocab.json" in lacking.value.message
    assert "rerunning cannot fetch what the repository lacks" in lacking.value.hint
    assert not folder.exists() and not hub.gets(), "bytes were fetched for a folder that cannot be complete"
    # what it does hold can still be fetched, on purpose, with --include
    partial = download_model(model_id="local/no-tokenizer", output_dir=folder, include=("*.json",))
    assert not partial.complete


def test_offline_mode(hub: LocalHub, tmp_path: Path, monkeypatch) -> None:
    download_model(output_dir=tmp_path / "done")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    count = len(hub.requests)
    with pytest.raises(DownloadError, match="offline") as error:
        download_model(output_dir=tmp_path / "empty")
    assert "GUTENOCR_MODEL_PATH" in error.value.hint
    checked = download_model(output_dir=tmp_path / "done")
    assert checked.offline and checked.complete and checked.commit == hub.repos[REPO].revisions["main"].commit
    assert len(hub.requests) == count, "offline mode talked to the hub"


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_unreachable_hub(hub: LocalHub, tmp_path: Path, monkeypatch) -> None:
    download_model(output_dir=tmp_path / "done")
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    with pytest.raises(DownloadError, match="cannot reach") as error:
        download_model(output_dir=tmp_path / "empty")
    assert "GUTENOCR_MODEL_PATH" in error.value.hint
    # A finished download still checks out without the hub.
    assert download_model(output_dir=tmp_path / "done").offline


def test_not_enough_disk_space_stops_before_any_transfer(hub: LocalHub, tmp_path: Path, monkeypatch) -> None:
    real = shutil.disk_usage

    def tiny_disk(path):
        usage = real(path)
        return type(usage)(usage.total, usage.total - 1000, 1000)

    monkeypatch.setattr(download_engine.shutil, "disk_usage", tiny_disk)
    with pytest.raises(DownloadError, match="disk space"):
        download_model(output_dir=tmp_path / "m")
    assert hub.gets() == []


def test_disk_full_during_the_transfer_is_one_line() -> None:
    spec = load_spec("gutenocr_3b")
    mapped = hub_errors.translate(
        OSError(errno.ENOSPC, "No space left on device"), REPO, None, Path("/x"), spec, "http://hub"
    )
    assert mapped is not None and "disk full" in mapped.message and "space" in mapped.hint


# --- command line and end to end -----------------------------------------------------------------------


def test_cli_json_and_error_exit_codes(hub: LocalHub, tmp_path: Path, capsys) -> None:
    assert run_cli("download", "--output-dir", str(tmp_path / "m"), "--json") == 0
    document = json.loads(capsys.readouterr().out)
    assert document["command"] == "download" and document["complete"] is True
    assert document["commit"] == hub.repos[REPO].revisions["main"].commit
    assert (
        run_cli("download", "--output-dir", str(tmp_path / "x"), "--model-id", "nobody/none", "--json") == 1
    )
    error = json.loads(capsys.readouterr().out)
    assert "not found" in error["error"] and error["hint"]


def test_cli_text_output_and_include(hub: LocalHub, tmp_path: Path, capsys) -> None:
    code = run_cli(
        "download", "--output-dir", str(tmp_path / "m"), "--include", "*.json", "--include", "tokenizer*"
    )
    assert code == 0
    assert "partial" in capsys.readouterr().out
    assert set(model_files(tmp_path / "m")) == {
        n for n in hub.repos[REPO].revisions["main"].files if n.endswith(".json") or n.startswith("tokenizer")
    }


def test_download_apply_verify_restore_end_to_end(hub: LocalHub, tmp_path: Path) -> None:
    from pto_patch.patching import engine

    result = download_model(output_dir=tmp_path / "model")
    downloaded = snapshot(result.folder)
    applied = engine.apply_patch(model_path=result.folder)
    assert applied.ops
    assert snapshot(result.folder) != downloaded
    with pytest.raises(DownloadError, match="applied"):
        download_model(output_dir=result.folder)

    # verify loads remote code: a fresh process, offline, so it cannot reach for the hub.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    env.pop("PTO_KERNELS_BACKEND", None)
    verify_args = ["--warmup", "0", "--iters", "1", "--output_length", "8", "--json"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pto_patch",
            "verify",
            "--model-path",
            str(result.folder),
            "--use_pto",
            *verify_args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = json.loads(done.stdout)
    assert not report["failures"]
    assert not report["load_info"]["missing_keys"]

    engine.restore_model(model_path=result.folder)
    restored = snapshot(result.folder)
    assert restored == downloaded, set(restored) ^ set(downloaded)
    assert download_model(output_dir=result.folder).checked_only


def test_an_output_dir_under_a_file_is_one_line_and_a_hint(hub: LocalHub, tmp_path: Path, capsys) -> None:
    (tmp_path / "afile").write_text("not a folder")
    assert run_cli("download", "--output-dir", str(tmp_path / "afile" / "sub")) == 1
    stderr = capsys.readouterr().err
    assert "is a file, not a folder" in stderr and "unexpected" not in stderr
    assert len(stderr.strip().splitlines()) == 2
    assert not hub.gets()


def test_a_folder_another_pto_patch_works_on_is_refused_at_once(hub: LocalHub, tmp_path: Path) -> None:
    from pto_patch.errors import FolderBusyError
    from pto_patch.patching import folder_lock
    from tests.helpers.lock_holder import Holder

    folder = tmp_path / "m"
    folder.mkdir()
    holder = Holder(folder, folder_lock.EXCLUSIVE)
    try:
        with pytest.raises(FolderBusyError, match=f"pid {holder.process.pid}"):
            download_model(output_dir=folder)
        assert not hub.gets() and not any(folder.iterdir())
    finally:
        holder.release()
    assert download_model(output_dir=folder).complete
