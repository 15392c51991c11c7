"""Each new spec end to end: make-tiny (tiny, then full width with 2 layers) -> apply -> verify -> restore.

Full width is heavy on a 2-core CPU (a 7B-width model with 2 decoder layers and the whole 32-layer
vision tower is 1.15 B parameters), so specs with the same widths share one make-tiny build: make-tiny
writes the same bytes for them (checked below), and each spec patches its own hard-linked copy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pto_patch.model.spec import load_spec
from pto_patch.tiny.model import model_config, weight_shapes
from tests.spec_pipeline import SHORT_PROMPT, apply_verify_restore, run_in_process

pytest.importorskip("torch")
pytest.importorskip("transformers")

NEW_SPECS = (
    "gutenocr_7b",
    "qwen2_5_vl_3b_instruct",
    "qwen2_5_vl_7b_instruct",
    "nanonets_ocr_s",
    "olmocr_2_7b",
)


def width_class(name: str) -> str:
    """Specs whose full-width make-tiny output is the same share a build: keyed by the config written."""
    return json.dumps(model_config(name, full_width=True, layers=2), sort_keys=True)


def linked_copy(source: Path, destination: Path) -> Path:
    """A copy whose files are hard links: apply replaces files atomically, so the shared build stays intact."""
    for path in sorted(source.rglob("*")):
        target = destination / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, target)
    return destination


@pytest.mark.parametrize("name", NEW_SPECS)
def test_tiny_model_of_each_spec_patches_verifies_and_restores(name: str, tmp_path: Path, capsys) -> None:
    folder = tmp_path / name
    assert run_in_process("make-tiny", str(folder), "--model", name) == 0
    config = json.loads((folder / "config.json").read_text())
    assert config["tie_word_embeddings"] is load_spec(name).tie_word_embeddings
    report = apply_verify_restore(name, folder, tmp_path, ["--dtype", "fp32"], capsys=capsys)
    assert report["load_info"]["lm_head_tied"] is (True if load_spec(name).tie_word_embeddings else None)


def test_specs_sharing_a_full_width_build_write_the_same_model() -> None:
    groups: dict[str, list[str]] = {}
    for name in NEW_SPECS:
        groups.setdefault(width_class(name), []).append(name)
    assert len(groups) == 2  # the 3B widths and the 7B widths
    for names in groups.values():
        first = names[0]
        assert all(
            weight_shapes(n, full_width=True, layers=2) == weight_shapes(first, full_width=True, layers=2)
            for n in names
        )


@pytest.fixture(scope="module")
def full_width_builds(tmp_path_factory) -> dict[str, Path]:
    """make-tiny --full-width --layers 2, once per width class, built on first use."""
    root, built = tmp_path_factory.mktemp("full-width"), {}

    def get(name: str) -> Path:
        key = width_class(name)
        if key not in built:
            folder = root / f"build-{len(built)}-{name}"
            assert (
                run_in_process("make-tiny", str(folder), "--model", name, "--full-width", "--layers", "2")
                == 0
            )
            built[key] = folder
        return built[key]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("name", NEW_SPECS)
def test_full_width_two_layer_model_of_each_spec(
    name: str, full_width_builds, tmp_path: Path, capsys
) -> None:
    spec = load_spec(name)
    folder = linked_copy(full_width_builds(name), tmp_path / name)
    config = json.loads((folder / "config.json").read_text())
    assert (
        config["hidden_size"] == spec.checkpoint["text"]["hidden_size"] and config["num_hidden_layers"] == 2
    )
    report = apply_verify_restore(name, folder, tmp_path, SHORT_PROMPT, capsys=capsys)
    assert report["dtype"] == "bfloat16"
