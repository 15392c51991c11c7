"""The one folder-hash helper (skill install, demo, the tests' snapshots)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pto_patch.patching.fileio import sha256_bytes
from pto_patch.patching.folder_hashes import folder_hashes, tree_hash


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "f"
    (root / "sub" / "__pycache__").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"a\r\n")
    (root / "sub" / "b.bin").write_bytes(b"\x00b")
    (root / "sub" / "__pycache__" / "x.pyc").write_bytes(b"c")
    os.symlink("a.txt", root / "link")
    return root


def test_files_by_content_links_by_target(folder: Path):
    hashes = folder_hashes(folder)
    assert hashes == {
        "a.txt": sha256_bytes(b"a\r\n"),
        "link": "link:a.txt",
        "sub/__pycache__/x.pyc": sha256_bytes(b"c"),
        "sub/b.bin": sha256_bytes(b"\x00b"),
    }
    (folder / "sub" / "b.bin").write_bytes(b"\x00B")
    assert folder_hashes(folder)["sub/b.bin"] != hashes["sub/b.bin"]


def test_ignored_folders_are_left_out_whole(folder: Path):
    hashes = folder_hashes(folder, ignore=lambda relative: relative.name == "__pycache__")
    assert sorted(hashes) == ["a.txt", "link", "sub/b.bin"]


def test_modes_and_folders_when_asked(folder: Path):
    before = folder_hashes(folder, modes=True, folders=True)
    assert before["sub"] == "dir" and before["sub/__pycache__"] == "dir"
    os.chmod(folder / "a.txt", 0o600)
    after = folder_hashes(folder, modes=True, folders=True)
    assert after["a.txt"] != before["a.txt"] and after["a.txt"].endswith(" 600")
    assert folder_hashes(folder)["a.txt"] == sha256_bytes(b"a\r\n")  # content only by default
    (folder / "empty").mkdir()
    assert "empty" in folder_hashes(folder, folders=True) and "empty" not in folder_hashes(folder)


def test_tree_hash_changes_with_any_path_or_content():
    base = tree_hash({"a": "1", "b": "2"})
    assert base == tree_hash({"b": "2", "a": "1"})
    assert base != tree_hash({"a": "1", "b": "3"}) and base != tree_hash({"a": "1", "c": "2"})
