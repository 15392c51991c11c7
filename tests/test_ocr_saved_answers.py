"""Saved OCR answers (`--save-outputs` / `--against-outputs`, run/ocr/outputs.py): every field checked on
read, and answers from other weights refused unless `--other-weights` asks for two checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pto_patch.errors import EXIT_USAGE, PtoPatchError
from pto_patch.run.ocr.outputs import check_weights, load_answers, save_answers, weights_digest
from pto_patch.run.ocr.pages import bundled_pages
from pto_patch.run.ocr.scoring import TASK_NAMES
from tests.spec_pipeline import run_in_process

PAGES = bundled_pages()


def _weights(
    folder: Path, seed: int, names=("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
):
    """Weight files shaped like safetensors (8-byte header length, JSON header, tensor bytes), all of one
    size and header for any seed: only the tensor bytes tell two checkpoints apart."""
    folder.mkdir(parents=True, exist_ok=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4096], "data_offsets": [0, 16384]}}).encode()
    for index, name in enumerate(names):
        body = bytes((seed * 31 + index * 7 + i) % 251 for i in range(16384))
        (folder / name).write_bytes(len(header).to_bytes(8, "little") + header + body)
    return folder


def _saved(tmp_path: Path, weights: Path, edit=None) -> Path:
    readings = [
        SimpleNamespace(
            page=page.name, task=task, mode="baseline", answer="text", new_tokens=3, truncated=False
        )
        for page in PAGES
        for task in TASK_NAMES
    ]
    path = tmp_path / "answers.json"
    save_answers(path, {"weights_digest": weights_digest(weights), "device": "cpu"}, PAGES, readings)
    if edit is not None:
        document = json.loads(path.read_text())
        edit(document)
        path.write_text(json.dumps(document))
    return path


def test_the_weights_digest_tells_checkpoints_of_one_shape_apart(tmp_path: Path):
    one, same, other = (_weights(tmp_path / name, seed) for name, seed in (("a", 1), ("b", 1), ("c", 2)))
    assert {p.name: p.stat().st_size for p in one.iterdir()} == {
        p.name: p.stat().st_size for p in other.iterdir()
    }
    assert weights_digest(one) == weights_digest(same) != weights_digest(other)
    assert weights_digest(tmp_path / "empty") is None


def test_answers_from_other_weights_are_refused_unless_asked(tmp_path: Path):
    trusted, other = _weights(tmp_path / "trusted", 1), _weights(tmp_path / "other", 2)
    saved = load_answers(_saved(tmp_path, trusted), PAGES)
    assert check_weights(saved, trusted, other_weights=False) is None
    with pytest.raises(PtoPatchError) as refused:
        check_weights(saved, other, other_weights=False)
    assert refused.value.exit_code == EXIT_USAGE and "read with other weights" in refused.value.message
    assert "--other-weights" in refused.value.hint
    warning = check_weights(saved, other, other_weights=True)
    assert warning is not None and "two checkpoints" in warning
    # A file saved before the digest existed (format 1) proves nothing about its weights.
    old = load_answers(
        _saved(tmp_path, trusted, lambda d: [d.pop("weights_digest"), d.update(format_version=1)]), PAGES
    )
    with pytest.raises(PtoPatchError, match="without a weights digest"):
        check_weights(old, trusted, other_weights=False)
    # A format 2 file holds a sampled digest, which other weights can match: named, never trusted.
    sampled = load_answers(_saved(tmp_path, trusted, lambda d: d.update(format_version=2)), PAGES)
    with pytest.raises(PtoPatchError, match="a sample of the bytes"):
        check_weights(sampled, trusted, other_weights=False)


def _first_answer(key, value):
    return lambda document: document["answers"][0].__setitem__(key, value)


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (_first_answer("new_tokens", -5), "answer 0 has new_tokens -5, not a count"),
        (_first_answer("new_tokens", True), "not a count"),
        (_first_answer("answer", 12), "answer 0 has no answer string"),
        (_first_answer("task", "TABLES"), "names a task 'TABLES'"),
        (_first_answer("mode", "fast"), "names a mode 'fast'"),
        (_first_answer("truncated", "no"), "not true or false"),
        (lambda d: d["answers"].append(dict(d["answers"][0])), "repeats page"),
        (lambda d: d.__setitem__("answers", {"a": 1}), "no list of answers"),
        (lambda d: d["answers"].__setitem__(0, [1]), "answer 0 is a list"),
    ],
)
def test_a_tampered_answers_file_is_refused_naming_the_entry(edit, said, tmp_path: Path):
    path = _saved(tmp_path, _weights(tmp_path / "w", 1), edit)
    with pytest.raises(PtoPatchError) as refused:
        load_answers(path, PAGES)
    assert said in refused.value.message and refused.value.exit_code == EXIT_USAGE


def test_an_answers_file_deeper_than_the_parser_or_with_a_bom_is_read_or_refused(tmp_path: Path):
    path = _saved(tmp_path, _weights(tmp_path / "w", 1))
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert len(load_answers(path, PAGES).answers) == len(PAGES) * len(TASK_NAMES)
    path.write_text("[" * 5000)
    with pytest.raises(PtoPatchError, match="nested too deep"):
        load_answers(path, PAGES)


def test_other_weights_needs_against_outputs(tmp_path: Path, capsys):
    code = run_in_process("verify", "--model-path", str(tmp_path / "none"), "--ocr", "--other-weights")
    assert (
        code == EXIT_USAGE
        and "--other-weights only applies with --against-outputs" in capsys.readouterr().err
    )
