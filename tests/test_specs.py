"""The model specs as data: each built-in spec's values, its sources, make-tiny at its widths, `models`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pto_patch.errors import SpecError
from pto_patch.model.spec import all_specs, known_specs, load_spec, specs_dir
from pto_patch.tiny.model import make_tiny, model_config, weight_shapes
from tests.helpers.cli import run_cli
from tests.local_hub import LocalHub, read_folder

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

NEW_SPECS = (
    "gutenocr_7b",
    "qwen2_5_vl_3b_instruct",
    "qwen2_5_vl_7b_instruct",
    "nanonets_ocr_s",
    "olmocr_2_7b",
)
QWEN3_VL_SPECS = ("qwen3_vl_2b_instruct", "qwen3_vl_4b_instruct", "qwen3_vl_8b_instruct", "chandra")
SPECS = ("gutenocr_3b", *NEW_SPECS, *QWEN3_VL_SPECS)
# Per family: the checkpoints' MRoPE section and the stock classes make-tiny's shapes are checked against.
SECTIONS = {"qwen2_5_vl": [16, 24, 24], "qwen3_vl": [24, 20, 20]}
STOCK = {
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration"),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration"),
}
# What each checkpoint's public config.json says (see the spec's `sources`): text widths, heads, lm_head.
WIDTHS_3B = {"hidden": 2048, "intermediate": 11008, "heads": 16, "kv_heads": 2, "layers": 36, "tied": True}
WIDTHS_7B = {"hidden": 3584, "intermediate": 18944, "heads": 28, "kv_heads": 4, "layers": 28, "tied": False}
EXPECTED = {
    "gutenocr_3b": WIDTHS_3B,
    "qwen2_5_vl_3b_instruct": WIDTHS_3B,
    "nanonets_ocr_s": WIDTHS_3B,
    "gutenocr_7b": WIDTHS_7B,
    "qwen2_5_vl_7b_instruct": WIDTHS_7B,
    "olmocr_2_7b": WIDTHS_7B,
    # Qwen3-VL (head_dim 128 in every one; see the specs' sources and disagreements)
    "qwen3_vl_2b_instruct": {
        "hidden": 2048,
        "intermediate": 6144,
        "heads": 16,
        "kv_heads": 8,
        "layers": 28,
        "tied": True,
    },
    "qwen3_vl_4b_instruct": {
        "hidden": 2560,
        "intermediate": 9728,
        "heads": 32,
        "kv_heads": 8,
        "layers": 36,
        "tied": True,
    },
    "qwen3_vl_8b_instruct": {
        "hidden": 4096,
        "intermediate": 12288,
        "heads": 32,
        "kv_heads": 8,
        "layers": 36,
        "tied": False,
    },
    "chandra": {
        "hidden": 4096,
        "intermediate": 12288,
        "heads": 32,
        "kv_heads": 8,
        "layers": 36,
        "tied": False,
    },
}


def text_of(config: dict) -> dict:
    """config.json's text widths: at the top level (Qwen2.5-VL's hub layout) or under text_config (Qwen3-VL's)."""
    return config.get("text_config", config)


def hub_keys(model, tied: bool, legacy: bool = True) -> dict[str, tuple[int, ...]]:
    """The stock model's state dict in the hub's key layout (Qwen2.5-VL's legacy one where `legacy`; Qwen3-VL's
    checkpoints use the module keys themselves), a tied lm_head left out."""
    expected = {}
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight" and tied:
            continue
        if legacy:
            key = re.sub(r"^model\.language_model\.", "model.", key)
            key = re.sub(r"^model\.visual\.", "visual.", key)
        expected[key] = tuple(tensor.shape)
    return expected


# --- the specs' values -----------------------------------------------------------------------------


def test_every_spec_is_shipped() -> None:
    assert set(known_specs()) == set(SPECS)


@pytest.mark.parametrize("name", SPECS)
def test_spec_records_the_checkpoints_public_config(name: str) -> None:
    spec, expected = load_spec(name), EXPECTED[name]
    text, vision = spec.checkpoint["text"], spec.checkpoint["vision"]
    assert (text["hidden_size"], text["intermediate_size"]) == (expected["hidden"], expected["intermediate"])
    assert (text["num_attention_heads"], text["num_key_value_heads"]) == (
        expected["heads"],
        expected["kv_heads"],
    )
    assert text["num_hidden_layers"] == expected["layers"]
    assert spec.tie_word_embeddings is text["tie_word_embeddings"] is expected["tied"]
    assert vision["out_hidden_size"] == text["hidden_size"]
    assert list(spec.mrope_section) == text["mrope_section"] == SECTIONS[spec.family.name]
    if spec.family.name == "qwen3_vl":  # head_dim is its own number there, not hidden / heads
        assert text["head_dim"] == 128 == 2 * sum(text["mrope_section"])


@pytest.mark.parametrize("name", SPECS)
def test_full_width_shapes_are_the_checkpoints(name: str) -> None:
    spec = load_spec(name)
    text, vision = spec.checkpoint["text"], spec.checkpoint["vision"]
    for key, value in spec.full_width["text"].items():
        assert text[key] == value, f"{name}: full_width.text.{key} {value} != checkpoint {text[key]}"
    for key, value in spec.full_width["vision"].items():
        assert vision[key] == value, f"{name}: full_width.vision.{key} {value} != checkpoint {vision[key]}"


@pytest.mark.parametrize("name", NEW_SPECS + QWEN3_VL_SPECS)  # gutenocr_3b's (4 / 2 heads) predates this rule
def test_tiny_shapes_keep_the_head_layout(name: str) -> None:
    spec = load_spec(name)
    tiny, full = spec.tiny["text"], spec.checkpoint["text"]
    ratio = full["num_attention_heads"] // full["num_key_value_heads"]
    assert tiny["num_attention_heads"] // tiny["num_key_value_heads"] == ratio
    assert tiny["hidden_size"] < full["hidden_size"]


@pytest.mark.parametrize("name", SPECS)
def test_spec_says_where_its_values_come_from(name: str) -> None:
    spec = load_spec(name)
    assert spec.sources, f"{name} names no source"
    assert all(re.match(r"https://\S+$", item["url"]) and item.get("what") for item in spec.sources)
    assert spec.builtin and spec.source_path == specs_dir() / f"{name}.json"


def test_specs_do_not_share_folder_variables_hub_ids_or_class_prefixes() -> None:
    specs = all_specs()
    for attribute in ("model_path_env", "hub_repo_id", "name"):
        values = [getattr(spec, attribute) for spec in specs]
        assert len(set(values)) == len(values), attribute
    prefixes = [new for spec in specs for _, new in spec.class_renames]
    assert len(set(prefixes)) == len(prefixes)
    assert not any(prefix.startswith(("Qwen2", "Qwen3VL")) for prefix in prefixes)


# --- make-tiny at each spec's widths ----------------------------------------------------------------


@pytest.mark.parametrize("full_width", [False, True])
@pytest.mark.parametrize("name", NEW_SPECS + QWEN3_VL_SPECS)
def test_weight_shapes_match_the_stock_model_built_from_the_config(name: str, full_width: bool) -> None:
    family = load_spec(name).family.name
    config_class, model_class = (getattr(transformers, cls) for cls in STOCK[family])
    written = model_config(name, full_width=full_width, layers=1)
    with torch.device("meta"):
        model = model_class(config_class(**written))
    expected = hub_keys(model, tied=written["tie_word_embeddings"], legacy=family == "qwen2_5_vl")
    shapes = weight_shapes(name, full_width=full_width, layers=1)
    assert shapes == expected
    if family == "qwen3_vl":  # the q / k norms run at the checkpoint's head_dim
        q_norm = shapes["model.language_model.layers.0.self_attn.q_norm.weight"]
        assert q_norm == ((128,) if full_width else (text_of(written)["head_dim"],))


@pytest.mark.parametrize("name", NEW_SPECS + QWEN3_VL_SPECS)
def test_full_width_config_has_the_checkpoints_widths(name: str) -> None:
    config, expected = model_config(name, full_width=True), EXPECTED[name]
    assert config["vision_config"]["out_hidden_size"] == expected["hidden"]
    # every vision value the checkpoint records and make-tiny writes is the checkpoint's
    recorded = load_spec(name).checkpoint["vision"]
    differ = {key: (config["vision_config"][key], value) for key, value in recorded.items()
              if key in config["vision_config"] and config["vision_config"][key] != value}  # fmt: skip
    assert differ == {}, f"{name}: full-width vision (written, checkpoint): {differ}"
    config = {**text_of(config), "tie_word_embeddings": config["tie_word_embeddings"]}
    assert (config["hidden_size"], config["intermediate_size"]) == (
        expected["hidden"],
        expected["intermediate"],
    )
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (
        expected["heads"],
        expected["kv_heads"],
    )
    assert config["tie_word_embeddings"] is expected["tied"]
    assert config["num_hidden_layers"] == 2


def test_untied_spec_writes_its_own_lm_head_and_loads_completely(tmp_path: Path) -> None:
    folder = make_tiny(tmp_path / "tiny7b", model="gutenocr_7b").path
    config = json.loads((folder / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    tensors = {}
    for shard in sorted(folder.glob("model-*.safetensors")):
        tensors.update(safetensors_torch.load_file(str(shard)))
    assert tensors["lm_head.weight"].shape == tensors["model.embed_tokens.weight"].shape
    assert not torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"])
    model, info = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        str(folder), output_loading_info=True, dtype=torch.float32
    )
    assert not any(info[kind] for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert model.lm_head.weight is not model.get_input_embeddings().weight
    assert torch.equal(model.lm_head.weight, tensors["lm_head.weight"].float())


# --- spec validation and spec files by path -----------------------------------------------------------


def write_spec(tmp_path: Path, **changes) -> Path:
    data = json.loads((specs_dir() / "gutenocr_3b.json").read_text())
    data.update(changes)
    path = tmp_path / "custom.json"
    path.write_text(json.dumps(data))
    return path


def test_a_spec_file_is_loaded_by_path(tmp_path: Path) -> None:
    path = write_spec(
        tmp_path, name="custom", class_renames=[["Qwen2_5_VL", "CustomVL"], ["Qwen2", "Custom"]]
    )
    spec = load_spec(str(path))
    assert spec.name == "custom" and spec.source_path == path.resolve() and not spec.builtin
    assert spec.renamed("Qwen2_5_VLModel") == "CustomVLModel"


@pytest.mark.parametrize(
    ("renames", "message"),
    [
        ([["Qwen2_5_VL", "Qwen2_5_VLX"]], "starts with the renamed prefix"),
        ([["Qwen2_5_VL", "My-Model"]], "not a Python identifier"),
        ([["Qwen2_5_VL"]], "pairs"),
    ],
)
def test_bad_class_renames_are_refused(tmp_path: Path, renames, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_spec(str(write_spec(tmp_path, class_renames=renames)))


def test_bad_spec_files_are_one_line_errors(tmp_path: Path, capsys) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{ not json")
    assert run_cli("models", "--model", str(broken)) == 2  # a spec is a --model value: a usage error
    assert "not valid JSON" in capsys.readouterr().err
    assert run_cli("models", "--model", str(tmp_path / "missing.json")) == 2  # a bad option value
    assert "does not exist" in capsys.readouterr().err
    assert run_cli("models", "--model", str(write_spec(tmp_path, tie_word_embeddings="yes"))) == 2
    assert "tie_word_embeddings" in capsys.readouterr().err


# --- pto-patch models --------------------------------------------------------------------------------


def test_models_json_lists_every_spec_with_its_sources(capsys) -> None:
    assert run_cli("models", "--json") == 0
    document = json.loads(capsys.readouterr().out)
    assert document["command"] == "models" and document["schema_version"] == 1
    by_name = {entry["name"]: entry for entry in document["models"]}
    assert set(by_name) == set(SPECS)
    for name, entry in by_name.items():
        spec = load_spec(name)
        assert entry["hub_repo_id"] == spec.hub_repo_id and entry["model_path_env"] == spec.model_path_env
        assert entry["sources"] == [dict(item) for item in spec.sources]
        assert entry["checkpoint"]["hidden_size"] == EXPECTED[name]["hidden"]
        assert entry["tie_word_embeddings"] is EXPECTED[name]["tied"]


def test_models_text_names_each_spec_and_source(capsys) -> None:
    assert run_cli("models") == 0
    text = capsys.readouterr().out
    for spec in all_specs():
        assert spec.name in text and spec.hub_repo_id in text and f"${spec.model_path_env}" in text
        assert all(item["url"] in text for item in spec.sources)


def test_models_shows_a_spec_file_given_by_path(tmp_path: Path, capsys) -> None:
    path = write_spec(tmp_path, name="custom", class_renames=[["Qwen2", "Custom"]])
    assert run_cli("models", "--model", str(path), "--json") == 0
    (entry,) = json.loads(capsys.readouterr().out)["models"]
    assert (
        entry["name"] == "custom" and entry["builtin"] is False and entry["spec_file"] == str(path.resolve())
    )


# --- download --model NAME ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NEW_SPECS)
def test_download_fetches_each_specs_repo_into_its_folder_variable(
    name: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    spec = load_spec(name)
    source = make_tiny(tmp_path / "source", model=name).path
    for variable in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(variable, raising=False)
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv(spec.model_path_env, str(tmp_path / "downloaded"))
    with LocalHub() as hub:
        hub.add_repo(spec.hub_repo_id, {"main": source})
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        assert run_cli("download", "--model", name, "--json") == 0
    document = json.loads(capsys.readouterr().out)
    assert document["repo_id"] == spec.hub_repo_id and document["complete"] is True
    assert document["folder"] == str((tmp_path / "downloaded").resolve())
    assert read_folder(tmp_path / "downloaded") == read_folder(source)


def test_models_prints_a_spec_file_whose_path_looks_like_markup(tmp_path, capsys):
    """A spec file's path is shown in brackets: it must print as text, not be read as rich markup."""
    import shutil

    from pto_patch.model.spec import specs_dir
    from tests.spec_pipeline import run_in_process

    spec = tmp_path / "spec.json"
    shutil.copy(specs_dir() / "gutenocr_3b.json", spec)
    assert run_in_process("models", "--model", str(spec)) == 0
    shown = capsys.readouterr()
    assert f"[{spec}]" in shown.out and "unexpected error" not in shown.err


@pytest.mark.parametrize("typed", ["gutenocr-3b", "GutenOCR-3B", "gutenocr_3B", "qwen3-vl-2b-instruct"])
def test_a_near_miss_of_a_model_name_gets_the_name_it_meant(typed, capsys):
    from tests.spec_pipeline import run_in_process

    assert run_in_process("models", "--model", typed) == 2
    err = capsys.readouterr().err
    meant = "qwen3_vl_2b_instruct" if typed.startswith("qwen") else "gutenocr_3b"
    assert f"error: unknown model '{typed}': did you mean {meant}?" in err
    assert "Traceback" not in err
