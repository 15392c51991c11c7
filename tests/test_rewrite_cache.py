"""The rewrite cache: reused only when every input is byte-identical, checked on reuse, never needed.

(Two applies at once and a killed or starved writer are in test_folder_lock.py and
test_fault_injection.py, with the other races and faults.)
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from pto_patch.model.spec import load_spec
from pto_patch.patching import codemods, engine, rewrite_cache
from pto_patch.patching.codemods import PatchContext
from pto_patch.patching.rewrite_cache import RewriteCache, cache_dir, rewrite_key
from tests.folder_snapshot import snapshot
from tests.helpers.cli import run_cli
from tests.helpers.folders import HUB_CONFIG, write_config


def model(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    write_config(folder, HUB_CONFIG)
    return folder


def entries(cache: Path) -> list[Path]:
    """The cache's entries, largest (the modeling file's) first."""
    found = [p for p in (cache / rewrite_cache.ENTRIES).glob("*") if not p.name.startswith(".")]
    return sorted(found, key=lambda p: -p.stat().st_size)


@pytest.fixture()
def reference(tmp_path: Path) -> dict:
    """What apply writes with no cache at all."""
    folder = model(tmp_path, "reference")
    engine.apply_patch(model_path=folder, use_cache=False)
    return snapshot(folder)


def _codemods_must_not_run(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the codemods ran although the cache holds this rewrite")

    monkeypatch.setattr(codemods, "rewrite_modeling", refuse)
    monkeypatch.setattr(codemods, "rewrite_configuration", refuse)


def test_an_already_seen_release_is_not_rewritten_again(tmp_path, rewrite_cache_dir, reference, monkeypatch):
    engine.apply_patch(model_path=model(tmp_path, "first"))
    assert len(entries(rewrite_cache_dir)) == 2  # the modeling and the configuration file
    _codemods_must_not_run(monkeypatch)
    second = model(tmp_path, "second")
    engine.apply_patch(model_path=second)
    assert snapshot(second) == reference
    with pytest.raises(AssertionError, match="the codemods ran"):  # other ops: another rewrite
        engine.apply_patch(model_path=model(tmp_path, "third"), ops="rms_norm")


def test_no_cache_neither_reads_nor_writes(tmp_path, rewrite_cache_dir, reference, monkeypatch, capsys):
    folder = model(tmp_path, "folder")
    assert run_cli("apply", "--no-cache", "--model-path", str(folder)) == 0
    assert entries(rewrite_cache_dir) == [] and snapshot(folder) == reference
    engine.apply_patch(model_path=model(tmp_path, "fills"))
    _codemods_must_not_run(monkeypatch)
    with pytest.raises(AssertionError, match="the codemods ran"):
        engine.apply_patch(model_path=model(tmp_path, "again"), use_cache=False)


def test_a_dry_run_reads_the_cache_but_writes_nothing(tmp_path, rewrite_cache_dir):
    assert run_cli("apply", "--dry-run", "--model-path", str(model(tmp_path, "dry"))) == 0
    assert entries(rewrite_cache_dir) == []


@pytest.mark.parametrize(
    "damage",
    ["flip-a-byte", "truncated", "empty", "garbage", "another-key", "another-format"],
)
def test_a_damaged_or_foreign_entry_is_ignored_with_one_warning(
    tmp_path, rewrite_cache_dir, reference, damage: str, capsys
):
    engine.apply_patch(model_path=model(tmp_path, "fills"))
    modeling, configuration = entries(rewrite_cache_dir)
    data = modeling.read_bytes()
    header, _, text = data.partition(b"\n")
    damaged = {
        "flip-a-byte": data[:-10] + bytes([data[-10] ^ 1]) + data[-9:],
        "truncated": data[: len(data) // 2],
        "empty": b"",
        "garbage": b"\x00\xff not an entry\n",
        "another-key": configuration.read_bytes(),  # a whole, valid entry, of another rewrite
        "another-format": header.replace(rewrite_cache.FORMAT, b"pto-patch-rewrite-0") + b"\n" + text,
    }[damage]
    modeling.write_bytes(damaged)
    capsys.readouterr()

    folder = model(tmp_path, "after")
    assert run_cli("apply", "--model-path", str(folder)) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and str(modeling) in warnings[0], captured.err
    assert ("damaged" in warnings[0]) == (damage in ("flip-a-byte", "truncated")), warnings
    assert snapshot(folder) == reference
    assert modeling.read_bytes() == data  # rewritten, and the entry replaced by a sound one
    assert run_cli("restore", "--model-path", str(folder)) == 0
    assert run_cli("apply", "--model-path", str(folder)) == 0 and "warning" not in capsys.readouterr().err


def test_every_input_is_part_of_the_key(tmp_path, monkeypatch):
    spec = load_spec("gutenocr_3b")
    context = PatchContext(spec=spec, release="5.24.0", source_sha256="ab" * 32)
    key = rewrite_key("modeling", b"source", context)
    assert key == rewrite_key("modeling", b"source", context)  # stable
    changed = {
        "kind": rewrite_key("configuration", b"source", context),
        "source": rewrite_key("modeling", b"source ", context),
        "ops": rewrite_key("modeling", b"source", dataclasses.replace(context, ops=("mrope",))),
        "release": rewrite_key("modeling", b"source", dataclasses.replace(context, release="5.16.1")),
        "spec": rewrite_key(
            "modeling",
            b"source",
            dataclasses.replace(context, spec=dataclasses.replace(spec, mrope_section=(16, 24, 23))),
        ),
        "tool": rewrite_key("modeling", b"source", dataclasses.replace(context, tool_version="9")),
    }
    monkeypatch.setattr(rewrite_cache, "__version__", "0.0.0-other")
    changed["version"] = rewrite_key("modeling", b"source", context)
    monkeypatch.undo()
    templates = tmp_path / "templates"
    shutil.copytree(rewrite_cache.templates_dir(), templates)
    monkeypatch.setattr(rewrite_cache, "templates_dir", lambda: templates)
    assert rewrite_key("modeling", b"source", context) == key  # the same templates, elsewhere
    guard = templates / "injections" / "rms_norm.py"
    guard.write_bytes(guard.read_bytes() + b"\n")
    changed["template"] = rewrite_key("modeling", b"source", context)
    assert len({key, *changed.values()}) == len(changed) + 1, changed


def test_the_cache_lives_where_the_hub_conventions_say(tmp_path, monkeypatch):
    monkeypatch.setenv("PTO_PATCH_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("PTO_PATCH_CACHE")
    assert cache_dir() == tmp_path / "xdg" / "pto-patch"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == tmp_path / "home" / ".cache" / "pto-patch"


def test_a_cache_that_cannot_be_written_costs_a_warning_not_the_apply(
    tmp_path, monkeypatch, reference, capsys
):
    blocker = tmp_path / "a-file"
    blocker.write_text("the cache folder cannot be made under a file")
    monkeypatch.setenv("PTO_PATCH_CACHE", str(blocker))
    folder = model(tmp_path, "folder")
    assert run_cli("apply", "--json", "--model-path", str(folder)) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["command"] == "apply"  # stdout keeps its one document
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and all("could not save the rewrite" in line for line in warnings)
    assert snapshot(folder) == reference


def test_store_and_load_round_trip_and_refuse_another_key(tmp_path):
    said: list[str] = []
    cache = RewriteCache(tmp_path, said.append)
    cache.store("a" * 64, "text\r\nwith line endings\n")
    assert cache.load("a" * 64) == "text\r\nwith line endings\n" and said == []
    assert cache.load("b" * 64) is None and said == []  # absent: no warning
    shutil.copy(cache.entry_path("a" * 64), cache.entry_path("b" * 64))
    assert cache.load("b" * 64) is None and len(said) == 1
