"""preprocessor_config.json of a tiny model: the Pillow image processor (Qwen2VLImageProcessor) that both
families' folders carry, at the family's patch size, pixel bounds and normalisation."""

from __future__ import annotations

from typing import Any


def image_processor_config(
    *,
    processor_class: str,
    patch_size: int,
    merge_size: int,
    temporal_patch_size: int,
    min_pixels: int,
    max_pixels: int,
    image_mean: list[float],
    image_std: list[float],
) -> dict[str, Any]:
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": image_mean,
        "image_processor_type": "Qwen2VLImageProcessor",
        "image_std": image_std,
        "max_pixels": max_pixels,
        "merge_size": merge_size,
        "min_pixels": min_pixels,
        "patch_size": patch_size,
        "processor_class": processor_class,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": max_pixels, "shortest_edge": min_pixels},
        "temporal_patch_size": temporal_patch_size,
    }
