"""The weights identity saved answers record: every byte, cached by the file's identity."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pto_patch.model.input_files import UnreadableInput
from pto_patch.patching import weights_digest as wd


def _shard(folder: Path, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    header = b'{"w": {"dtype": "U8", "shape": [%d], "data_offsets": [0, %d]}}' % (len(data), len(data))
    path = folder / "model.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


def test_one_changed_byte_anywhere_changes_the_digest(tmp_path: Path):
    """A sample of 16 x 4 KiB (the former digest) never reads byte 5,000 of a 1 MiB tensor; this does."""
    data = bytearray(os.urandom(1 << 20))
    one = wd.weights_digest(_shard(tmp_path / "a", bytes(data)).parent)
    data[5000] ^= 0xFF
    assert wd.weights_digest(_shard(tmp_path / "b", bytes(data)).parent) != one
    assert wd.weights_digest(tmp_path / "empty") is None


def test_a_second_run_reads_the_cache_and_a_rewrite_is_hashed_again(tmp_path: Path, monkeypatch):
    path = _shard(tmp_path / "m", os.urandom(4096))
    first = wd.file_digest(path)
    reads = []
    real = wd.hashlib.sha256

    def counting(*args):
        reads.append(args)
        return real(*args)

    monkeypatch.setattr(wd.hashlib, "sha256", counting)
    assert wd.file_digest(path) == first
    assert all(args for args in reads)  # only the cache key was hashed: no file content
    _shard(tmp_path / "m", os.urandom(4096))  # same size, new bytes, new mtime
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert wd.file_digest(path) != first


def test_a_fifo_named_like_a_shard_is_refused_without_opening_it(tmp_path: Path):
    tmp_path.joinpath("model.safetensors").unlink(missing_ok=True)
    os.mkfifo(tmp_path / "model.safetensors")
    with pytest.raises(UnreadableInput, match="FIFO"):
        wd.weights_digest(tmp_path)
