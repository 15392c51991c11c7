"""Write a random-weight model folder of a spec's architecture, offline, for tests and the demo.

Each architecture family has its own hub layout (LAYOUTS): Qwen3-VL's lives in tiny/qwen3_vl.py. For
Qwen2.5-VL the folder looks like the hub's checkpoint: a flat config.json (text keys at the top level,
`vision_config` nested, `rope_scaling: {"type": "mrope", ...}`), safetensors shards in the hub's
legacy key layout (`model.layers.N...`, `visual.blocks.N...`, `lm_head` only where the spec unties it) with a
`model.safetensors.index.json`, a small byte-level BPE tokenizer carrying the Qwen special tokens,
a chat template, preprocessor_config.json and generation_config.json. That layout loads on every
supported transformers release (4.57 - 5.24); what a release's `save_pretrained` writes does not.

The same seed gives the same bytes. Weights are drawn from one seeded generator, tensor by tensor,
with a scale (2/sqrt(fan_in)) large enough that every layer changes the output: at 1/sqrt(fan_in)
the tiny model's greedy output collapses into repeating one token.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pto_patch.errors import EXIT_USAGE, ModelFolderError, SpecError
from pto_patch.model.spec import ModelSpec, load_spec
from pto_patch.patching.patch_state import NONE, state_before_writing
from pto_patch.tiny import qwen3_vl as tiny_qwen3_vl
from pto_patch.tiny.processor import image_processor_config
from pto_patch.tiny.tokenizer import (
    CHAT_TEMPLATE,
    QWEN_ADDED_TOKENS,
    QWEN_SPECIAL_TOKENS,
    VOCAB_MULTIPLE,
    build_tokenizer,
    tokenizer_config,
)

PATCH_SIZE = 14
SPATIAL_MERGE = 2
TEMPORAL_PATCH = 2
MIN_PIXELS = 56 * 56  # one merged 2x2 patch group of 28x28 pixels, times 4
MAX_PIXELS = 28 * 28 * 256  # at most 256 image tokens: tiny models see small images
# CLIP's normalisation constants, which the Qwen2-VL image processor uses.
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]

SHARDS = 2
LINEAR_GAIN = 2.0
# Embedding rows at 4/sqrt(hidden): larger ones dominate the residual at full width, so every
# position's greedy pick is its own input token (the tied lm_head sees the embedding again).
EMBED_SCALE = 4.0
FULL_WIDTH_DEFAULT_LAYERS = 2


@dataclass(frozen=True)
class TinyModelResult:
    path: Path
    files: tuple[str, ...]
    parameter_count: int
    full_width: bool
    layers: int
    model: str = "gutenocr_3b"  # the spec it was built for

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "model": self.model,
            "files": list(self.files),
            "parameter_count": self.parameter_count,
            "full_width": self.full_width,
            "layers": self.layers,
        }


@dataclass(frozen=True)
class _Sizes:
    """The widths of one build, validated from the spec's `tiny` or `full_width` table."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    mrope_section: tuple[int, ...]
    vision_depth: int
    vision_hidden: int
    vision_intermediate: int
    vision_heads: int
    fullatt_block_indexes: tuple[int, ...] = ()  # Qwen2.5-VL's windowed vision tower
    explicit_head_dim: int | None = None  # Qwen3-VL names head_dim (128 at hidden 2560 / 32 heads)
    deepstack_visual_indexes: tuple[int, ...] = ()  # Qwen3-VL: vision layers feeding the first text layers
    num_position_embeddings: int = 0  # Qwen3-VL's learned vision position table (a square number)

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads


@dataclass(frozen=True)
class TextWidths:
    """make-tiny's overrides of the spec table's text widths (None: the table's). vLLM's CPU attention,
    for one, takes head_dim 32, 64, 80, ... only: `--hidden-size 256 --heads 4` gives 64."""

    hidden_size: int | None = None
    heads: int | None = None
    kv_heads: int | None = None


def _section_for(section: tuple[int, ...], head_dim: int, where: str) -> tuple[int, ...]:
    """The table's MRoPE section scaled to another head_dim, in the same proportions ([2, 3, 3] -> [8, 12, 12])."""
    half, total = head_dim // 2, sum(section)
    if head_dim % 2 or half % total:
        raise SpecError(
            f"{where}: head_dim {head_dim} does not take mrope_section {list(section)} scaled evenly",
            f"pick --hidden-size / --heads so that head_dim / 2 is a multiple of {total}",
            exit_code=EXIT_USAGE,
        )
    return tuple(part * (half // total) for part in section)


def _sizes(
    spec: ModelSpec, full_width: bool, layers: int | None, widths: TextWidths = TextWidths()
) -> _Sizes:
    table_name = "full_width" if full_width else "tiny"
    table = spec.full_width if full_width else spec.tiny
    where = f"model spec {spec.source_path or spec.name}, '{table_name}'"
    for flag, value in (
        ("--hidden-size", widths.hidden_size),
        ("--heads", widths.heads),
        ("--kv-heads", widths.kv_heads),
    ):
        if value is not None and value < 1:
            raise SpecError(
                f"{flag} must be at least 1, got {value}", f"pass {flag} 1 or more", exit_code=EXIT_USAGE
            )
    try:
        text, vision = table["text"], table["vision"]
        default_layers = text.get("num_hidden_layers", FULL_WIDTH_DEFAULT_LAYERS)
        hidden = int(widths.hidden_size or text["hidden_size"])
        heads = int(widths.heads or text["num_attention_heads"])
        section = tuple(int(x) for x in text["mrope_section"])
        explicit_head_dim = int(text["head_dim"]) if "head_dim" in text else None
        blocks_key = LAYOUTS[spec.family.name].vision_blocks_key
        positions_key = LAYOUTS[spec.family.name].vision_positions_key
        if widths != TextWidths() and hidden % heads == 0 and explicit_head_dim is None:
            section = _section_for(section, hidden // heads, where)
        sizes = _Sizes(
            hidden=hidden,
            intermediate=int(text["intermediate_size"]),
            layers=int(layers if layers is not None else default_layers),
            heads=heads,
            kv_heads=int(widths.kv_heads or text["num_key_value_heads"]),
            mrope_section=section,
            vision_depth=int(vision["depth"]),
            vision_hidden=int(vision["hidden_size"]),
            vision_intermediate=int(vision["intermediate_size"]),
            vision_heads=int(vision["num_heads"]),
            fullatt_block_indexes=tuple(int(x) for x in (vision[blocks_key] if blocks_key else ())),
            explicit_head_dim=explicit_head_dim,
            deepstack_visual_indexes=tuple(int(x) for x in vision.get("deepstack_visual_indexes", ())),
            num_position_embeddings=int(vision[positions_key]) if positions_key else 0,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError(
            f"{where} lacks or mangles {exc}", "compare it with templates/specs/gutenocr_3b.json"
        ) from exc
    if sizes.layers < 1:
        raise SpecError(
            f"--layers must be at least 1, got {sizes.layers}",
            "pass --layers 1 or more",
            exit_code=EXIT_USAGE,
        )
    if (sizes.explicit_head_dim is None and sizes.hidden % sizes.heads) or sizes.heads % sizes.kv_heads:
        raise SpecError(
            f"{where}: hidden_size {sizes.hidden}, {sizes.heads} heads, {sizes.kv_heads} kv heads: no fit",
            "pick head counts that divide hidden_size and each other",
        )
    if 2 * sum(sizes.mrope_section) != sizes.head_dim:
        raise SpecError(
            f"{where}: mrope_section {list(sizes.mrope_section)} must sum to {sizes.head_dim // 2}",
            "fix mrope_section in the spec",
        )
    if sizes.vision_hidden % sizes.vision_heads or (sizes.vision_hidden // sizes.vision_heads) % 4:
        raise SpecError(
            f"{where}: vision head_dim must be a multiple of 4",
            "pick vision hidden_size and num_heads accordingly",
        )
    if any(i >= sizes.vision_depth for i in sizes.fullatt_block_indexes):
        raise SpecError(f"{where}: fullatt_block_indexes past the vision depth", "fix the spec")
    if any(i >= sizes.vision_depth for i in sizes.deepstack_visual_indexes):
        raise SpecError(f"{where}: deepstack_visual_indexes past the vision depth", "fix the spec")
    side = math.isqrt(sizes.num_position_embeddings)
    if LAYOUTS[spec.family.name].vision_positions_key and (
        side < 1 or side * side != sizes.num_position_embeddings
    ):
        raise SpecError(
            f"{where}: num_position_embeddings {sizes.num_position_embeddings} is not a positive square",
            "the vision position table is a square grid (Qwen3-VL's: 2304 = 48 x 48)",
        )
    return sizes


# --- config -------------------------------------------------------------------------------------


def _config(spec: ModelSpec, sizes: _Sizes, vocab_size: int, token_ids: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "attention_dropout": 0.0,
        "bos_token_id": token_ids["<|endoftext|>"],
        "eos_token_id": token_ids["<|im_end|>"],
        "hidden_act": "silu",
        "hidden_size": sizes.hidden,
        "image_token_id": token_ids["<|image_pad|>"],
        "initializer_range": 0.02,
        "intermediate_size": sizes.intermediate,
        "max_position_embeddings": 128000,
        "max_window_layers": 70,
        "model_type": spec.model_type,
        "num_attention_heads": sizes.heads,
        "num_hidden_layers": sizes.layers,
        "num_key_value_heads": sizes.kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"type": "mrope", "mrope_section": list(sizes.mrope_section)},
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "video_token_id": token_ids["<|video_pad|>"],
        "vision_config": {
            "depth": sizes.vision_depth,
            "fullatt_block_indexes": list(sizes.fullatt_block_indexes),
            "hidden_act": "silu",
            "hidden_size": sizes.vision_hidden,
            "in_chans": 3,
            "intermediate_size": sizes.vision_intermediate,
            "num_heads": sizes.vision_heads,
            "out_hidden_size": sizes.hidden,
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": SPATIAL_MERGE,
            "spatial_patch_size": PATCH_SIZE,
            "temporal_patch_size": TEMPORAL_PATCH,
            "tokens_per_second": 2,
            "window_size": 112,
        },
        "vision_end_token_id": token_ids["<|vision_end|>"],
        "vision_start_token_id": token_ids["<|vision_start|>"],
        "vision_token_id": token_ids["<|vision_pad|>"],
        "vocab_size": vocab_size,
    }


def _preprocessor_config() -> dict[str, Any]:
    return image_processor_config(
        processor_class="Qwen2_5_VLProcessor",
        patch_size=PATCH_SIZE,
        merge_size=SPATIAL_MERGE,
        temporal_patch_size=TEMPORAL_PATCH,
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
        image_mean=IMAGE_MEAN,
        image_std=IMAGE_STD,
    )


def _generation_config(token_ids: dict[str, int]) -> dict[str, Any]:
    return {
        "bos_token_id": token_ids["<|endoftext|>"],
        "do_sample": False,
        "eos_token_id": [token_ids["<|im_end|>"], token_ids["<|endoftext|>"]],
        "pad_token_id": token_ids["<|endoftext|>"],
    }


# --- weights ------------------------------------------------------------------------------------


def _weight_layout(
    sizes: _Sizes, vocab_size: int, tied: bool = True
) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(hub legacy key, shape, kind) for every tensor, in a fixed order. Kinds: linear, bias, norm, embed.

    An untied model (the 7B checkpoints) carries its own `lm_head.weight`; a tied one has none.
    """
    h, kv = sizes.hidden, sizes.kv_heads * sizes.head_dim
    vh, vi = sizes.vision_hidden, sizes.vision_intermediate
    merged = vh * SPATIAL_MERGE**2
    yield "visual.patch_embed.proj.weight", (vh, 3, TEMPORAL_PATCH, PATCH_SIZE, PATCH_SIZE), "linear"
    for i in range(sizes.vision_depth):
        block = f"visual.blocks.{i}"
        yield f"{block}.norm1.weight", (vh,), "norm"
        yield f"{block}.norm2.weight", (vh,), "norm"
        yield f"{block}.attn.qkv.weight", (3 * vh, vh), "linear"
        yield f"{block}.attn.qkv.bias", (3 * vh,), "bias"
        yield f"{block}.attn.proj.weight", (vh, vh), "linear"
        yield f"{block}.attn.proj.bias", (vh,), "bias"
        for name, shape in (("gate_proj", (vi, vh)), ("up_proj", (vi, vh)), ("down_proj", (vh, vi))):
            yield f"{block}.mlp.{name}.weight", shape, "linear"
            yield f"{block}.mlp.{name}.bias", shape[:1], "bias"
    yield "visual.merger.ln_q.weight", (vh,), "norm"
    yield "visual.merger.mlp.0.weight", (merged, merged), "linear"
    yield "visual.merger.mlp.0.bias", (merged,), "bias"
    yield "visual.merger.mlp.2.weight", (h, merged), "linear"
    yield "visual.merger.mlp.2.bias", (h,), "bias"
    yield "model.embed_tokens.weight", (vocab_size, h), "embed"
    for i in range(sizes.layers):
        layer = f"model.layers.{i}"
        yield f"{layer}.input_layernorm.weight", (h,), "norm"
        for name, out in (("q_proj", h), ("k_proj", kv), ("v_proj", kv)):
            yield f"{layer}.self_attn.{name}.weight", (out, h), "linear"
            yield f"{layer}.self_attn.{name}.bias", (out,), "bias"
        yield f"{layer}.self_attn.o_proj.weight", (h, h), "linear"
        yield f"{layer}.post_attention_layernorm.weight", (h,), "norm"
        yield f"{layer}.mlp.gate_proj.weight", (sizes.intermediate, h), "linear"
        yield f"{layer}.mlp.up_proj.weight", (sizes.intermediate, h), "linear"
        yield f"{layer}.mlp.down_proj.weight", (h, sizes.intermediate), "linear"
    yield "model.norm.weight", (h,), "norm"
    if not tied:
        yield "lm_head.weight", (vocab_size, h), "embed"


def _random_tensor(shape: tuple[int, ...], kind: str, generator):
    import torch

    values = torch.randn(shape, generator=generator, dtype=torch.float32)
    if kind == "linear":
        values *= LINEAR_GAIN / math.sqrt(math.prod(shape[1:]))
    elif kind == "bias":
        values *= 0.02
    elif kind == "norm":
        # Around 1 (what training leaves), but not exactly, so a wrong weight shows in the output.
        values = 1.0 + 0.1 * values
    elif kind == "embed":
        values *= EMBED_SCALE / math.sqrt(shape[1])
    return values.to(torch.bfloat16)


def _write_weights(
    folder: Path, sizes: _Sizes, vocab_size: int, seed: int, tied: bool, weights: Any = None
) -> tuple[list[str], int]:
    import torch
    from safetensors.torch import save_file

    layout = list((weights or _weight_layout)(sizes, vocab_size, tied))
    bytes_per = 2  # bfloat16
    total_size = sum(math.prod(shape) * bytes_per for _, shape, _ in layout)
    names = [f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors" for i in range(SHARDS)]
    generator = torch.Generator().manual_seed(seed)
    weight_map: dict[str, str] = {}
    shard: dict[str, Any] = {}
    shard_index, written, parameters = 0, 0, 0
    for key, shape, kind in layout:
        shard[key] = _random_tensor(shape, kind, generator)
        weight_map[key] = names[shard_index]
        written += math.prod(shape) * bytes_per
        parameters += math.prod(shape)
        # Cut into the next shard once half the bytes are in, as the hub's sharding does by size.
        if shard_index < SHARDS - 1 and written >= total_size * (shard_index + 1) / SHARDS:
            save_file(shard, str(folder / names[shard_index]), metadata={"format": "pt"})
            shard, shard_index = {}, shard_index + 1
    save_file(shard, str(folder / names[shard_index]), metadata={"format": "pt"})
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    _write_json(folder / "model.safetensors.index.json", index)
    # safetensors writes its files 0600; a checkpoint is as readable as the folder's other files
    readable = (folder / "model.safetensors.index.json").stat().st_mode & 0o777
    for name in names:
        os.chmod(folder / name, readable)
    return [*names, "model.safetensors.index.json"], parameters


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --- layouts per family ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    """How make-tiny writes one family's hub checkpoint."""

    config: Any  # (spec, sizes, vocab_size, token_ids) -> config.json
    weights: Any  # (sizes, vocab_size, tied) -> (key, shape, kind) per tensor
    preprocessor: Any  # () -> preprocessor_config.json
    processor_class: str
    vision_blocks_key: str  # the spec table's key for the vision tower's full-attention blocks ("": none)
    vision_positions_key: str = ""  # the spec table's key for a learned vision position table ("": none)


LAYOUTS = {
    "qwen2_5_vl": _Layout(
        _config, _weight_layout, _preprocessor_config, "Qwen2_5_VLProcessor", "fullatt_block_indexes"
    ),
    "qwen3_vl": _Layout(
        tiny_qwen3_vl.config,
        tiny_qwen3_vl.weight_layout,
        tiny_qwen3_vl.preprocessor_config,
        "Qwen3VLProcessor",
        "",
        "num_position_embeddings",
    ),
}


# --- entry point --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    spec: ModelSpec
    sizes: _Sizes
    tokenizer: Any
    token_ids: dict[str, int]
    vocab_size: int

    @property
    def layout(self) -> _Layout:
        return LAYOUTS[self.spec.family.name]


def _plan(model: str, full_width: bool, layers: int | None, widths: TextWidths = TextWidths()) -> _Plan:
    spec = load_spec(model)
    sizes = _sizes(spec, full_width, layers, widths)
    tokenizer = build_tokenizer()
    token_ids = {token: tokenizer.token_to_id(token) for token in QWEN_SPECIAL_TOKENS + QWEN_ADDED_TOKENS}
    vocab_size = math.ceil(tokenizer.get_vocab_size(with_added_tokens=True) / VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    return _Plan(spec, sizes, tokenizer, token_ids, vocab_size)


def model_config(model: str = "gutenocr_3b", full_width: bool = False, layers: int | None = None) -> dict:
    """The config.json that `make_tiny` writes for these options, without writing anything."""
    return model_config_of(_plan(model, full_width, layers))


def model_config_of(plan: _Plan) -> dict:
    return plan.layout.config(plan.spec, plan.sizes, plan.vocab_size, plan.token_ids)


def weight_shapes(
    model: str = "gutenocr_3b", full_width: bool = False, layers: int | None = None
) -> dict[str, tuple[int, ...]]:
    """Hub key -> shape of every tensor `make_tiny` writes for these options, without drawing any."""
    plan = _plan(model, full_width, layers)
    layout = plan.layout.weights(plan.sizes, plan.vocab_size, plan.spec.tie_word_embeddings)
    return {key: shape for key, shape, _ in layout}


def make_tiny(
    directory: str | Path,
    model: str = "gutenocr_3b",
    full_width: bool = False,
    layers: int | None = None,
    seed: int = 0,
    force: bool = False,
    widths: TextWidths = TextWidths(),
) -> TinyModelResult:
    """Write a random-weight model of `model`'s architecture into `directory` (created if missing).

    A folder that already holds files is refused unless `force`: pointed at a real download by
    mistake, make-tiny would replace its config.json and weights with random ones.
    """
    plan = _plan(model, full_width, layers, widths)
    folder = Path(directory).expanduser().resolve()
    if state_before_writing(folder) != NONE:  # applied, or an apply that stopped half-way
        raise ModelFolderError(
            f"{folder} holds a patched model (.pto_patch/)",
            f"run `pto-patch restore --model-path {folder}` first, or pick another folder",
        )
    if folder.exists() and not folder.is_dir():
        raise ModelFolderError(f"{folder} exists and is not a folder", "pick a folder path")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise ModelFolderError(
            f"{folder} is not empty; make-tiny would overwrite its files with a random-weight model",
            "pick a new or empty folder, or pass --force to overwrite",
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelFolderError(f"cannot create {folder}: {exc.strerror}", "pick a writable folder") from exc

    plan.tokenizer.save(str(folder / "tokenizer.json"), pretty=True)
    _write_json(
        folder / "tokenizer_config.json", tokenizer_config(plan.token_ids, plan.layout.processor_class)
    )
    _write_json(folder / "chat_template.json", {"chat_template": CHAT_TEMPLATE})
    _write_json(folder / "config.json", model_config_of(plan))
    _write_json(folder / "generation_config.json", _generation_config(plan.token_ids))
    _write_json(folder / "preprocessor_config.json", plan.layout.preprocessor())
    weight_files, parameters = _write_weights(
        folder, plan.sizes, plan.vocab_size, seed, plan.spec.tie_word_embeddings, plan.layout.weights
    )

    files = (
        "chat_template.json",
        "config.json",
        "generation_config.json",
        *weight_files,
        "preprocessor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    )
    return TinyModelResult(
        path=folder,
        files=tuple(sorted(files)),
        parameter_count=parameters,
        full_width=full_width,
        layers=plan.sizes.layers,
        model=plan.spec.name,
    )
