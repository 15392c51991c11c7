"""make-tiny: a hub-style random-weight folder that the stock transformers class loads completely."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pto_patch.errors import ModelFolderError, SpecError
from pto_patch.model.spec import load_spec
from pto_patch.run.image_inputs import build_inputs, sample_image, wants_mm_token_type_ids
from pto_patch.tiny.model import QWEN_SPECIAL_TOKENS, make_tiny, model_config, weight_shapes
from tests.folder_snapshot import snapshot
from tests.helpers.cli import run_cli

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("tiny") / "model").path


@pytest.fixture(scope="module")
def loaded(tiny: Path):
    model, info = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        str(tiny), output_loading_info=True, dtype=torch.float32
    )
    return model.eval(), info


@pytest.fixture(scope="module")
def tokenizer(tiny: Path):
    return transformers.AutoTokenizer.from_pretrained(str(tiny))


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def all_tensors(folder: Path) -> dict:
    tensors = {}
    for shard in sorted(folder.glob("model-*.safetensors")):
        tensors.update(safetensors_torch.load_file(str(shard)))
    return tensors


# --- files and layout ----------------------------------------------------------------------------


def test_config_is_flat_hub_style_with_token_ids_from_the_tokenizer(tiny: Path, tokenizer) -> None:
    config = read_json(tiny / "config.json")
    spec = load_spec("gutenocr_3b")
    assert config["model_type"] == "qwen2_5_vl"
    assert config["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    assert "text_config" not in config and "rope_parameters" not in config
    assert config["hidden_size"] == spec.tiny["text"]["hidden_size"]
    assert config["num_hidden_layers"] == spec.tiny["text"]["num_hidden_layers"]
    assert config["rope_scaling"] == {"type": "mrope", "mrope_section": spec.tiny["text"]["mrope_section"]}
    assert config["tie_word_embeddings"] is True
    assert config["torch_dtype"] == "bfloat16"
    assert config["vision_config"]["depth"] == spec.tiny["vision"]["depth"]
    assert config["vision_config"]["out_hidden_size"] == config["hidden_size"]
    pairs = {
        "image_token_id": "<|image_pad|>",
        "video_token_id": "<|video_pad|>",
        "vision_start_token_id": "<|vision_start|>",
        "vision_end_token_id": "<|vision_end|>",
        "vision_token_id": "<|vision_pad|>",
        "eos_token_id": "<|im_end|>",
    }
    for key, token in pairs.items():
        assert config[key] == tokenizer.convert_tokens_to_ids(token), key
    assert config["vocab_size"] >= len(tokenizer)


def test_weights_are_two_shards_in_the_hub_legacy_layout(tiny: Path) -> None:
    index = read_json(tiny / "model.safetensors.index.json")
    shards = sorted(set(index["weight_map"].values()))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    tensors = {}
    for shard in shards:
        part = safetensors_torch.load_file(str(tiny / shard))
        assert part, f"{shard} is empty"
        assert all(index["weight_map"][key] == shard for key in part)
        tensors.update(part)
    assert set(tensors) == set(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert all(re.match(r"^(model\.(embed_tokens|layers\.\d+|norm)|visual\.)", key) for key in tensors)
    assert not any(key.startswith("lm_head") or "language_model" in key for key in tensors)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}


def test_weights_are_random_not_constant(tiny: Path) -> None:
    tensors = all_tensors(tiny)
    for key, tensor in tensors.items():
        assert tensor.float().std() > 0, f"{key} is constant"
    norms = [t for key, t in tensors.items() if key.endswith(("norm.weight", "norm1.weight", "ln_q.weight"))]
    assert norms and all(not torch.all(t == 1) for t in norms)


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path, tiny: Path) -> None:
    again = make_tiny(tmp_path / "again", seed=0).path
    other = make_tiny(tmp_path / "other", seed=1).path
    assert snapshot(again) == snapshot(tiny)
    first, second = all_tensors(tiny), all_tensors(other)
    assert first.keys() == second.keys()
    assert all(not torch.equal(first[key], second[key]) for key in first)
    assert (other / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()


def test_layers_option_sets_decoder_depth(tmp_path: Path) -> None:
    result = make_tiny(tmp_path / "three", layers=3)
    assert result.layers == 3
    assert read_json(result.path / "config.json")["num_hidden_layers"] == 3
    keys = read_json(result.path / "model.safetensors.index.json")["weight_map"]
    assert {int(m.group(1)) for k in keys if (m := re.match(r"model\.layers\.(\d+)\.", k))} == {0, 1, 2}


# --- loading with the stock class -----------------------------------------------------------------


def test_stock_class_loads_every_key(loaded) -> None:
    _, info = loaded
    assert not info["missing_keys"], info["missing_keys"]
    assert not info["unexpected_keys"], info["unexpected_keys"]
    assert not info["mismatched_keys"], info["mismatched_keys"]


def test_loaded_weights_are_the_files_weights_and_lm_head_is_tied(tiny: Path, loaded) -> None:
    model, _ = loaded
    tensors = all_tensors(tiny)
    embed = tensors["model.embed_tokens.weight"].float()
    assert torch.equal(model.get_input_embeddings().weight, embed)
    assert torch.equal(model.lm_head.weight, embed)
    assert torch.equal(
        model.model.visual.blocks[0].attn.qkv.weight, tensors["visual.blocks.0.attn.qkv.weight"].float()
    )
    ids = torch.tensor([[5, 17, 42, 99]])
    with torch.no_grad():
        outputs = model(input_ids=ids, output_hidden_states=True)
    projected = outputs.hidden_states[-1] @ embed.T
    torch.testing.assert_close(outputs.logits, projected)


def test_tokenizer_round_trips_text_and_special_tokens(tokenizer) -> None:
    assert type(tokenizer).__name__.startswith("Qwen2Tokenizer")
    text = (
        "<|im_start|>user\nInvoice 2024-0117: tötal € 1,284.50"
        "<|vision_start|><|image_pad|><|vision_end|><|im_end|>"
    )
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    for token in QWEN_SPECIAL_TOKENS:
        token_ids = tokenizer(token)["input_ids"]
        assert token_ids == [tokenizer.convert_tokens_to_ids(token)], token
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_chat_template_places_one_image_between_vision_markers(tokenizer) -> None:
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Read it."}]}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    user_turn = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Read it.<|im_end|>\n"
    assert text.endswith(user_turn + "<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\n")


# --- image inputs and generation ------------------------------------------------------------------


def test_build_inputs_expands_the_image_to_merged_patches(tiny: Path, tokenizer) -> None:
    inputs = build_inputs(tiny, "Read the text.", sample_image(56, 56))
    grid = inputs["image_grid_thw"]
    assert grid.tolist() == [[1, 4, 4]]  # 56 px / 14 px patches; one temporal patch for a still image
    assert inputs["pixel_values"].shape == (16, 3 * 2 * 14 * 14)
    image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((inputs["input_ids"] == image_id).sum()) == 16 // 4
    if wants_mm_token_type_ids():
        assert torch.equal(inputs["mm_token_type_ids"], (inputs["input_ids"] == image_id).long())
    else:
        assert "mm_token_type_ids" not in inputs


def test_build_inputs_without_image_has_no_vision_tensors(tiny: Path) -> None:
    inputs = build_inputs(tiny, "Hello")
    assert "pixel_values" not in inputs and "image_grid_thw" not in inputs
    assert inputs["input_ids"].shape == inputs["attention_mask"].shape


def test_greedy_generate_with_an_image_runs_and_sees_the_image(tiny: Path, loaded) -> None:
    model, _ = loaded
    inputs = build_inputs(tiny, "Read the text.", sample_image(56, 56, seed=0))
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=10, min_new_tokens=10, do_sample=False)
    new_tokens = generated[0, inputs["input_ids"].shape[1] :].tolist()
    assert len(new_tokens) == 10
    assert len(set(new_tokens)) > 1, f"degenerate output {new_tokens}"
    other = build_inputs(tiny, "Read the text.", sample_image(56, 56, seed=3))
    with torch.no_grad():
        first = model(**inputs).logits[0, -1]
        second = model(**other).logits[0, -1]
    assert torch.isfinite(first).all()
    assert not torch.allclose(first, second), "the image does not reach the logits"


# --- full width and the command line --------------------------------------------------------------


def test_full_width_config_has_the_real_widths() -> None:
    config = model_config(full_width=True, layers=1)
    assert (config["hidden_size"], config["intermediate_size"]) == (2048, 11008)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (16, 2)
    assert config["hidden_size"] // config["num_attention_heads"] == 128
    assert config["num_hidden_layers"] == 1
    assert config["rope_scaling"]["mrope_section"] == [16, 24, 24]
    vision = config["vision_config"]
    assert (vision["hidden_size"], vision["intermediate_size"], vision["num_heads"]) == (1280, 3420, 16)
    assert vision["depth"] == 32 and vision["fullatt_block_indexes"] == [7, 15, 23, 31]
    assert model_config(full_width=True)["num_hidden_layers"] == 2


@pytest.mark.parametrize("full_width", [False, True])
def test_weight_shapes_match_the_stock_model_built_from_the_config(full_width: bool) -> None:
    config = transformers.Qwen2_5_VLConfig(**model_config(full_width=full_width, layers=1))
    with torch.device("meta"):
        model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    expected = {}
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight":
            continue  # tied to the embedding, not stored
        key = re.sub(r"^model\.language_model\.", "model.", key)
        key = re.sub(r"^model\.visual\.", "visual.", key)
        expected[key] = tuple(tensor.shape)
    assert weight_shapes(full_width=full_width, layers=1) == expected


def test_cli_writes_a_folder_and_reports_json(tmp_path: Path, capsys) -> None:
    assert run_cli("make-tiny", str(tmp_path / "m"), "--layers", "1", "--json") == 0
    document = json.loads(capsys.readouterr().out)
    assert document["layers"] == 1 and document["full_width"] is False
    assert sorted(document["files"]) == sorted(p.name for p in (tmp_path / "m").iterdir())
    assert document["parameter_count"] == sum(t.numel() for t in all_tensors(tmp_path / "m").values())


def test_cli_rejects_zero_layers(tmp_path: Path, capsys) -> None:
    assert run_cli("make-tiny", str(tmp_path / "m"), "--layers", "0") == 2
    assert "--layers" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_refuses_a_patched_folder(tmp_path: Path) -> None:
    (tmp_path / ".pto_patch").mkdir()
    (tmp_path / ".pto_patch" / "manifest.json").write_text("{}")
    with pytest.raises(ModelFolderError, match="patched") as error:
        make_tiny(tmp_path)
    assert "pto-patch restore" in error.value.hint
    assert not (tmp_path / "config.json").exists()


def test_unknown_model_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="unknown model"):
        make_tiny(tmp_path, model="no_such_model")


def test_refuses_a_folder_with_files_unless_forced(tmp_path: Path) -> None:
    folder = tmp_path / "real-download"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen2_5_vl"}')
    with pytest.raises(ModelFolderError, match="not empty"):
        make_tiny(folder)
    assert (folder / "config.json").read_text() == '{"model_type": "qwen2_5_vl"}'
    assert run_cli("make-tiny", str(folder)) == 1
    assert run_cli("make-tiny", str(folder), "--force") == 0
    assert (folder / "model.safetensors.index.json").is_file()


KERNEL_WIDTH_CHECK = """
import sys
import torch
sys.path.insert(0, sys.argv[1])
from pto_kernels.backends.pypto_pieces import check_half_blocks
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    check_half_blocks(int(sys.argv[2]), dtype, "the default make-tiny model")
"""


def test_the_default_tiny_model_takes_every_pypto_kernel():
    """make-tiny's default widths meet each PyPTO kernel's own width rule in fp32, bf16 and fp16 (checked
    with the kernels' own check, in a process of its own, not a copy of it), so `--kernel-backend pypto`
    runs every kernel instead of falling back: the rotary and prologue kernels take half a head in whole
    32-byte blocks (measured: verify --kernel-backend pypto in bf16 ran rms_norm, mrope and swiglu_mlp
    with no fallback)."""
    import subprocess
    import sys

    from pto_patch.resources import kernel_package_dir

    config = model_config()
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    command = [sys.executable, "-c", KERNEL_WIDTH_CHECK, str(kernel_package_dir().parent), str(head_dim)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
