"""make-tiny's Qwen3-VL layout: the hub checkpoint's config.json and tensor keys for the qwen3_vl family.

What the Qwen3-VL hub checkpoints look like (Qwen/Qwen3-VL-*-Instruct, datalab-to/chandra): config.json keeps
the text widths under `text_config` with an explicit `head_dim` and `rope_scaling: {"mrope_interleaved": true,
"mrope_section": [...], "rope_type": "default"}` (the layout 4.57 wrote, which every later release reads); the
weights use the module keys themselves (`model.language_model.*`, `model.visual.*`), which have no conversion
mapping in any release. The vision tower is Qwen3-VL's own: LayerNorms with bias, a GELU MLP (`linear_fc1/2`),
learned position embeddings, and one "deepstack" merger per entry of `deepstack_visual_indexes`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pto_patch.model.spec import ModelSpec
from pto_patch.tiny.processor import image_processor_config

# `sizes` below is tiny_model's _Sizes (the widths of one build); named by duck type, since tiny_model
# imports this module.

PATCH_SIZE = 16
SPATIAL_MERGE = 2
TEMPORAL_PATCH = 2
MERGED_SIDE = PATCH_SIZE * SPATIAL_MERGE  # image sides are resized to multiples of 32
MIN_PIXELS = MERGED_SIDE**2 * 4
MAX_PIXELS = MERGED_SIDE**2 * 256  # at most 256 image tokens: tiny models see small images
IMAGE_MEAN = [0.5, 0.5, 0.5]  # Qwen3-VL's preprocessor_config.json
IMAGE_STD = [0.5, 0.5, 0.5]
ROPE_THETA = 5000000.0
VISION_ACT = "gelu_pytorch_tanh"


def config(spec: ModelSpec, sizes: Any, vocab_size: int, token_ids: dict[str, int]) -> dict[str, Any]:
    tied = spec.tie_word_embeddings
    text = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": token_ids["<|endoftext|>"],
        "dtype": "bfloat16",
        "eos_token_id": token_ids["<|im_end|>"],
        "head_dim": sizes.head_dim,
        "hidden_act": "silu",
        "hidden_size": sizes.hidden,
        "initializer_range": 0.02,
        "intermediate_size": sizes.intermediate,
        "max_position_embeddings": 262144,
        "model_type": "qwen3_vl_text",
        "num_attention_heads": sizes.heads,
        "num_hidden_layers": sizes.layers,
        "num_key_value_heads": sizes.kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "mrope_interleaved": True,
            "mrope_section": list(sizes.mrope_section),
            "rope_type": "default",
        },
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": tied,
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    vision = {
        "deepstack_visual_indexes": list(sizes.deepstack_visual_indexes),
        "depth": sizes.vision_depth,
        "hidden_act": VISION_ACT,
        "hidden_size": sizes.vision_hidden,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": sizes.vision_intermediate,
        "model_type": "qwen3_vl",
        "num_heads": sizes.vision_heads,
        "num_position_embeddings": sizes.num_position_embeddings,
        "out_hidden_size": sizes.hidden,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": SPATIAL_MERGE,
        "temporal_patch_size": TEMPORAL_PATCH,
    }
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "image_token_id": token_ids["<|image_pad|>"],
        "model_type": spec.model_type,
        "text_config": text,
        "tie_word_embeddings": tied,
        "transformers_version": "4.57.0.dev0",
        "video_token_id": token_ids["<|video_pad|>"],
        "vision_config": vision,
        "vision_end_token_id": token_ids["<|vision_end|>"],
        "vision_start_token_id": token_ids["<|vision_start|>"],
    }


def preprocessor_config() -> dict[str, Any]:
    """The Pillow image processor (Qwen2VLImageProcessor) at Qwen3-VL's patch size and normalisation."""
    return image_processor_config(
        processor_class="Qwen3VLProcessor",
        patch_size=PATCH_SIZE,
        merge_size=SPATIAL_MERGE,
        temporal_patch_size=TEMPORAL_PATCH,
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
        image_mean=IMAGE_MEAN,
        image_std=IMAGE_STD,
    )


def weight_layout(sizes: Any, vocab_size: int, tied: bool) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(checkpoint key, shape, kind) for every tensor, in the order the stock model's state dict lists them."""
    h, hd = sizes.hidden, sizes.head_dim
    q, kv = sizes.heads * hd, sizes.kv_heads * hd
    vh, vi = sizes.vision_hidden, sizes.vision_intermediate
    merged = vh * SPATIAL_MERGE**2
    visual = "model.visual"
    yield f"{visual}.patch_embed.proj.weight", (vh, 3, TEMPORAL_PATCH, PATCH_SIZE, PATCH_SIZE), "linear"
    yield f"{visual}.patch_embed.proj.bias", (vh,), "bias"
    yield f"{visual}.pos_embed.weight", (sizes.num_position_embeddings, vh), "embed"
    for i in range(sizes.vision_depth):
        block = f"{visual}.blocks.{i}"
        for norm in ("norm1", "norm2"):
            yield f"{block}.{norm}.weight", (vh,), "norm"
            yield f"{block}.{norm}.bias", (vh,), "bias"
        yield f"{block}.attn.qkv.weight", (3 * vh, vh), "linear"
        yield f"{block}.attn.qkv.bias", (3 * vh,), "bias"
        yield f"{block}.attn.proj.weight", (vh, vh), "linear"
        yield f"{block}.attn.proj.bias", (vh,), "bias"
        yield f"{block}.mlp.linear_fc1.weight", (vi, vh), "linear"
        yield f"{block}.mlp.linear_fc1.bias", (vi,), "bias"
        yield f"{block}.mlp.linear_fc2.weight", (vh, vi), "linear"
        yield f"{block}.mlp.linear_fc2.bias", (vh,), "bias"
    # The main merger norms each patch before the 2x2 shuffle; the deepstack mergers after it.
    mergers = [(f"{visual}.merger", vh)]
    mergers += [
        (f"{visual}.deepstack_merger_list.{i}", merged) for i in range(len(sizes.deepstack_visual_indexes))
    ]
    for prefix, norm_width in mergers:
        yield f"{prefix}.norm.weight", (norm_width,), "norm"
        yield f"{prefix}.norm.bias", (norm_width,), "bias"
        yield f"{prefix}.linear_fc1.weight", (merged, merged), "linear"
        yield f"{prefix}.linear_fc1.bias", (merged,), "bias"
        yield f"{prefix}.linear_fc2.weight", (h, merged), "linear"
        yield f"{prefix}.linear_fc2.bias", (h,), "bias"
    text = "model.language_model"
    yield f"{text}.embed_tokens.weight", (vocab_size, h), "embed"
    for i in range(sizes.layers):
        layer = f"{text}.layers.{i}"
        yield f"{layer}.self_attn.q_proj.weight", (q, h), "linear"
        yield f"{layer}.self_attn.k_proj.weight", (kv, h), "linear"
        yield f"{layer}.self_attn.v_proj.weight", (kv, h), "linear"
        yield f"{layer}.self_attn.o_proj.weight", (h, q), "linear"
        yield f"{layer}.self_attn.q_norm.weight", (hd,), "norm"
        yield f"{layer}.self_attn.k_norm.weight", (hd,), "norm"
        yield f"{layer}.mlp.gate_proj.weight", (sizes.intermediate, h), "linear"
        yield f"{layer}.mlp.up_proj.weight", (sizes.intermediate, h), "linear"
        yield f"{layer}.mlp.down_proj.weight", (h, sizes.intermediate), "linear"
        yield f"{layer}.input_layernorm.weight", (h,), "norm"
        yield f"{layer}.post_attention_layernorm.weight", (h,), "norm"
    yield f"{text}.norm.weight", (h,), "norm"
    if not tied:
        yield "lm_head.weight", (vocab_size, h), "embed"
