"""The weights digest sees what a sample missed (issue 51, item 5): two tensors of one shape swapped (every
answer differs, every size and header the same) and most of the weight bytes changed, each laid out where
the former digest (16 samples of 4 KiB over the tensor bytes, kept here as `sampled_digest`) never reads,
so the cases are the ones that fooled it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pto_patch.patching.weights_digest import weights_digest

SAMPLES, SAMPLE_BYTES = 16, 4096
DATA_BYTES = 1 << 20


def sampled_digest(folder: Path) -> str:
    """The digest answers files held before format 3: names, sizes, headers and 16 x 4 KiB of the bytes."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        data = path.read_bytes()
        length = int.from_bytes(data[:8], "little")
        digest.update(f"{path.name}\0{len(data)}\0".encode() + data[8 : 8 + length])
        start, span = 8 + length, len(data) - 8 - length
        for index in range(SAMPLES):
            at = start + span * index // SAMPLES
            digest.update(data[at : at + SAMPLE_BYTES])
    return digest.hexdigest()


def _shard(folder: Path, data: bytes) -> Path:
    """One safetensors file: two 16 KiB tensors between the first two samples, the rest one filler tensor."""
    header = {
        "a.v_proj.weight": {"dtype": "U8", "shape": [16384], "data_offsets": [8192, 24576]},
        "b.v_proj.weight": {"dtype": "U8", "shape": [16384], "data_offsets": [24576, 40960]},
        "head": {"dtype": "U8", "shape": [8192], "data_offsets": [0, 8192]},
        "rest": {"dtype": "U8", "shape": [DATA_BYTES - 40960], "data_offsets": [40960, DATA_BYTES]},
    }
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + data)
    return folder


def _sampled_windows() -> list[range]:
    return [
        range(DATA_BYTES * i // SAMPLES, DATA_BYTES * i // SAMPLES + SAMPLE_BYTES) for i in range(SAMPLES)
    ]


def test_two_tensors_swapped_are_other_weights(tmp_path: Path):
    data = bytearray(os.urandom(DATA_BYTES))
    one = _shard(tmp_path / "one", bytes(data))
    data[8192:24576], data[24576:40960] = data[24576:40960], data[8192:24576]
    swapped = _shard(tmp_path / "swapped", bytes(data))
    assert sampled_digest(one) == sampled_digest(swapped)  # the case that fooled the sample
    assert weights_digest(one) != weights_digest(swapped)


def test_most_of_the_bytes_changed_are_other_weights(tmp_path: Path):
    data = bytearray(os.urandom(DATA_BYTES))
    one = _shard(tmp_path / "one", bytes(data))
    sampled = {i for window in _sampled_windows() for i in window}
    changed = bytearray(b ^ 0xFF if i not in sampled else b for i, b in enumerate(data))
    assert sum(a != b for a, b in zip(data, changed, strict=True)) >= 0.65 * DATA_BYTES
    other = _shard(tmp_path / "changed", bytes(changed))
    assert sampled_digest(one) == sampled_digest(other)
    assert weights_digest(one) != weights_digest(other)
