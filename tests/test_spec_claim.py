"""The README's claim, tested: another Qwen2.5-VL or Qwen3-VL fine-tune is supported by a spec file alone.

Each spec below describes a made-up fine-tune with its own class prefix, widths, head layout, hub id
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


QWEN3_PREFIX = "AcmeLedgers"
# A made-up Qwen3-VL fine-tune: widths, heads (6 over 2 kv heads of head_dim 48), MRoPE section, vision depth
# and deepstack layers no built-in spec has, its own lm_head.
MADE_UP_QWEN3_VL_SPEC = {
    "name": "acme_ledgers_ocr",
    "description": "a made-up ledger-reading fine-tune of Qwen3-VL, for the spec-only test",
    "hub_repo_id": "acme-example/ledgers-ocr",
    "model_path_env": "ACME_LEDGERS_MODEL_PATH",
    "sources": [{"url": "https://example.invalid/acme/ledgers-ocr", "what": "invented for this test"}],
    "family": "qwen3_vl",
    "model_type": "qwen3_vl",
    "transformers_model_dir": "qwen3_vl",
    "modeling_file": "modeling_qwen3_vl.py",
    "configuration_file": "configuration_qwen3_vl.py",
    "class_renames": [
        ["Qwen3VL", QWEN3_PREFIX],
        ["BaseModelOutputWithDeepstack", f"{QWEN3_PREFIX}DeepstackOutput"],
    ],
    "auto_map": {
        "AutoConfig": "configuration_qwen3_vl.Qwen3VLConfig",
        "AutoModel": "modeling_qwen3_vl.Qwen3VLModel",
        "AutoModelForCausalLM": "modeling_qwen3_vl.Qwen3VLForConditionalGeneration",
        "AutoModelForImageTextToText": "modeling_qwen3_vl.Qwen3VLForConditionalGeneration",
    },
    "injections": {
        "rms_norm": {"switch": "USE_PTO_RMS_NORM", "classes": ["Qwen3VLTextRMSNorm"]},
        "swiglu_mlp": {"switch": "USE_PTO_SWIGLU_MLP", "classes": ["Qwen3VLTextMLP"]},
        "mrope": {"switch": "USE_PTO_MROPE", "functions": ["apply_rotary_pos_emb"]},
    },
    "mrope_section": [8, 8, 8],
    "tie_word_embeddings": False,
    "tiny": {
        "text": {
            "hidden_size": 96,
            "intermediate_size": 176,
            "num_hidden_layers": 2,
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            "head_dim": 48,
            "mrope_section": [8, 8, 8],
        },
        "vision": {
            "depth": 3,
            "hidden_size": 48,
            "intermediate_size": 80,
            "num_heads": 4,
            "deepstack_visual_indexes": [1, 2],
            "num_position_embeddings": 144,
        },
    },
}


def test_a_new_qwen3_vl_fine_tune_by_spec_file_alone(tmp_path: Path, capsys) -> None:
    spec_file = tmp_path / "specs" / "acme_ledgers_ocr.json"
    spec_file.parent.mkdir()
    spec_file.write_text(json.dumps(MADE_UP_QWEN3_VL_SPEC, indent=2), encoding="utf-8")
    assert MADE_UP_QWEN3_VL_SPEC["name"] not in known_specs()
    model, folder = str(spec_file), tmp_path / "ledgers-ocr"

    assert run_in_process("make-tiny", str(folder), "--model", model) == 0
    text = json.loads((folder / "config.json").read_text())["text_config"]
    assert (
        text["hidden_size"],
        text["num_attention_heads"],
        text["num_key_value_heads"],
        text["head_dim"],
    ) == (
        96,
        6,
        2,
        48,
    )
    report = apply_verify_restore(model, folder, tmp_path, ["--dtype", "fp32"], capsys=capsys)
    assert set(report["switched_on"]) == {"rms_norm", "mrope", "swiglu_mlp"}
    assert report["load_info"]["lm_head_tied"] is None
    assert load_spec(model).renamed("Qwen3VLTextRMSNorm") == f"{QWEN3_PREFIX}TextRMSNorm"
