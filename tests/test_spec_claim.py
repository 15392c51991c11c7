"""The README's claim, tested: another Qwen2.5-VL fine-tune is supported by a spec file alone.

The spec below describes a made-up fine-tune with its own class prefix, widths, head layout, hub id
and folder variable. It lives outside pto-patch (in the test's temporary folder) and is passed to every
command by path; nothing in pto-patch names it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pto_patch.model.spec import known_specs, load_spec, specs_dir
from tests.spec_pipeline import apply_verify_restore, run_in_process

pytest.importorskip("torch")
pytest.importorskip("transformers")

PREFIX = "AcmeReceipts"
MADE_UP_SPEC = {
    "name": "acme_receipts_ocr",
    "description": "a made-up receipt-reading fine-tune of Qwen2.5-VL, for the spec-only test",
    "hub_repo_id": "acme-example/receipts-ocr",
    "model_path_env": "ACME_RECEIPTS_MODEL_PATH",
    "sources": [{"url": "https://example.invalid/acme/receipts-ocr", "what": "invented for this test"}],
    "model_type": "qwen2_5_vl",
    "transformers_model_dir": "qwen2_5_vl",
    "modeling_file": "modeling_qwen2_5_vl.py",
    "configuration_file": "configuration_qwen2_5_vl.py",
    "class_renames": [
        ["Qwen2_5_VL", f"{PREFIX}VL"],
        ["Qwen2_5_Vision", f"{PREFIX}Vision"],
        ["Qwen2", PREFIX],
    ],
    "auto_map": {
        "AutoConfig": "configuration_qwen2_5_vl.Qwen2_5_VLConfig",
        "AutoModel": "modeling_qwen2_5_vl.Qwen2_5_VLModel",
        "AutoModelForCausalLM": "modeling_qwen2_5_vl.Qwen2_5_VLForConditionalGeneration",
        "AutoModelForImageTextToText": "modeling_qwen2_5_vl.Qwen2_5_VLForConditionalGeneration",
    },
    "injections": {
        "rms_norm": {"switch": "USE_PTO_RMS_NORM", "classes": ["Qwen2_5_VLRMSNorm", "Qwen2RMSNorm"]},
        "swiglu_mlp": {"switch": "USE_PTO_SWIGLU_MLP", "classes": ["Qwen2MLP"]},
        "mrope": {
            "switch": "USE_PTO_MROPE",
            "functions": ["apply_multimodal_rotary_pos_emb", "apply_rotary_pos_emb"],
        },
    },
    "mrope_section": [4, 6, 6],
    "tie_word_embeddings": False,
    # Widths no built-in spec has: 6 query heads over 3 kv heads of 32, vision heads of 12.
    "tiny": {
        "text": {
            "hidden_size": 192,
            "intermediate_size": 320,
            "num_hidden_layers": 2,
            "num_attention_heads": 6,
            "num_key_value_heads": 3,
            "mrope_section": [4, 6, 6],
        },
        "vision": {
            "depth": 3,
            "hidden_size": 48,
            "intermediate_size": 80,
            "num_heads": 4,
            "fullatt_block_indexes": [2],
        },
    },
}


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "specs" / "acme_receipts_ocr.json"
    path.parent.mkdir()
    path.write_text(json.dumps(MADE_UP_SPEC, indent=2), encoding="utf-8")
    return path


def test_a_new_fine_tune_by_spec_file_alone(spec_file: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    assert MADE_UP_SPEC["name"] not in known_specs()
    assert not list(specs_dir().glob("*acme*")), "the spec must not be one pto-patch ships"
    model, folder = str(spec_file), tmp_path / "receipts-ocr"

    assert run_in_process("make-tiny", str(folder), "--model", model) == 0
    config = json.loads((folder / "config.json").read_text())
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]) == (
        192,
        6,
        3,
    )
    assert config["vision_config"]["depth"] == 3 and config["tie_word_embeddings"] is False

    report = apply_verify_restore(model, folder, tmp_path, ["--dtype", "fp32"], capsys=capsys)
    assert set(report["switched_on"]) == {"rms_norm", "mrope", "swiglu_mlp"}  # the spec's three ops
    assert report["load_info"]["lm_head_tied"] is None  # untied, as the spec says

    # The spec's own folder variable is honoured too: status finds the folder through it.
    monkeypatch.setenv(MADE_UP_SPEC["model_path_env"], str(folder))
    assert run_in_process("apply", "--model", model) == 0
    modeling = (folder / "modeling_qwen2_5_vl.py").read_text(encoding="utf-8")
    assert f"class {PREFIX}VLForConditionalGeneration(" in modeling and "class Qwen2_5_VL" not in modeling
    assert json.loads((folder / "config.json").read_text())["auto_map"]["AutoModelForImageTextToText"] == (
        f"modeling_qwen2_5_vl.{PREFIX}VLForConditionalGeneration"
    )
    capsys.readouterr()
    assert run_in_process("status", "--model", model, "--json") == 0
    status = json.loads(capsys.readouterr().out)
    assert status["patched"] and status["spec"] == MADE_UP_SPEC["name"]
    assert run_in_process("restore", "--model", model) == 0


def test_the_made_up_spec_is_listed_by_models(spec_file: Path, capsys) -> None:
    assert run_in_process("models", "--model", str(spec_file), "--json") == 0
    (entry,) = json.loads(capsys.readouterr().out)["models"]
    assert entry["name"] == "acme_receipts_ocr" and entry["class_prefixes"][-1] == PREFIX
    assert load_spec(str(spec_file)).renamed("Qwen2MLP") == f"{PREFIX}MLP"
