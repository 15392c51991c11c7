"""Model inputs for a prompt and an optional image, without the stock processor.

`Qwen2_5_VLProcessor` builds a video processor too, and that needs torchvision, which does not
import beside the CPU torch here (and is not a dependency of pto-patch). Images only need the
tokenizer and the Qwen2-VL image processor, which run on Pillow, so this module does what the
processor does for one image: apply the chat template, expand `<|image_pad|>` to one token per
merged patch group, tokenize, and add `mm_token_type_ids` where the installed transformers wants it
(5.16+ places image tokens by it; without it positions silently fall back to 1-D).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from pto_patch.errors import ModelFolderError

IMAGE_TOKEN = "<|image_pad|>"
# The mm_token_type_ids value of an image token, as transformers defines them (text 0, image 1, video 2).
IMAGE_TYPE = 1


def sample_image(width: int = 56, height: int = 56, seed: int = 0):
    """A deterministic RGB test image: gradients plus a few dark bars, like a line of text."""
    from PIL import Image

    image = Image.new("RGB", (width, height))
    pixels = image.load()
    for y in range(height):
        for x in range(width):
            ink = (y // 7) % 2 == 1 and ((x + 3 * seed) // 5) % 3 != 0
            r = (x * 255 // max(width - 1, 1) + 37 * seed) % 256
            g = y * 255 // max(height - 1, 1)
            b = ((x + y) * 4 + 11 * seed) % 256
            pixels[x, y] = (r // 4, g // 4, b // 4) if ink else (r, g, b)
    return image


DEFAULT_GENERATION_CLASS = "Qwen2_5_VLForConditionalGeneration"


def wants_mm_token_type_ids(generation_class: str = DEFAULT_GENERATION_CLASS) -> bool:
    """Whether the installed transformers' forward of `generation_class` (the spec family's stock class) takes
    `mm_token_type_ids` (Qwen2.5-VL from 5.16, Qwen3-VL from 5.8)."""
    import transformers

    stock = getattr(transformers, generation_class)
    return "mm_token_type_ids" in inspect.signature(stock.forward).parameters


def load_tokenizer(folder: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def load_image_processor(folder: str | Path):
    # Not `from transformers import AutoImageProcessor`: 5.8 - 5.16 export a placeholder there that
    # raises ImportError without torchvision; the module itself falls back to the Pillow processor.
    from transformers.models.auto.image_processing_auto import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(str(folder))


def build_inputs(
    folder: str | Path,
    prompt: str,
    image: Any = None,
    *,
    tokenizer: Any = None,
    image_processor: Any = None,
    generation_class: str = DEFAULT_GENERATION_CLASS,
) -> dict[str, Any]:
    """Tensors for `model(**inputs)` / `model.generate(**inputs)`: one user turn, an optional image.

    `image` is a PIL image or a path to one. Pass `tokenizer` / `image_processor` to reuse loaded ones.
    Returns input_ids, attention_mask, and with an image pixel_values and image_grid_thw; plus
    mm_token_type_ids when the installed transformers takes it.
    """
    folder = Path(folder)
    if not (folder / "tokenizer_config.json").is_file() and tokenizer is None:
        raise ModelFolderError(
            f"{folder} has no tokenizer_config.json",
            "point at a downloaded model folder (pto-patch download) or a make-tiny folder",
        )
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(folder)
    content: list[dict[str, str]] = []
    if image is not None:
        content.append({"type": "image"})
    content.append({"type": "text", "text": prompt})
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )

    inputs: dict[str, Any] = {}
    if image is not None:
        if image_processor is None:
            if not (folder / "preprocessor_config.json").is_file():
                raise ModelFolderError(
                    f"{folder} has no preprocessor_config.json",
                    "the model folder is incomplete; download it again",
                )
            image_processor = load_image_processor(folder)
        image = as_rgb_image(image)
        vision = image_processor(images=[image], return_tensors="pt")
        grid = vision["image_grid_thw"]
        tokens = int(grid[0].prod()) // image_processor.merge_size**2
        if text.count(IMAGE_TOKEN) != 1:
            raise ModelFolderError(
                f"the chat template in {folder} did not place exactly one {IMAGE_TOKEN} for the image",
                "check chat_template in tokenizer_config.json",
            )
        text = text.replace(IMAGE_TOKEN, IMAGE_TOKEN * tokens)
        inputs["pixel_values"] = vision["pixel_values"]
        inputs["image_grid_thw"] = grid

    encoded = tokenizer(text, return_tensors="pt")
    inputs = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"], **inputs}
    if wants_mm_token_type_ids(generation_class):
        image_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
        inputs["mm_token_type_ids"] = (encoded["input_ids"] == image_id).to(
            encoded["input_ids"].dtype
        ) * IMAGE_TYPE
    return inputs


def as_rgb_image(image: Any):
    """A PIL image in RGB, from a path or an image; a one-line error for a file PIL cannot read."""
    from PIL import Image

    if isinstance(image, (str, Path)):
        try:
            with Image.open(image) as opened:
                return opened.convert("RGB")
        except OSError as exc:
            raise ModelFolderError(f"cannot read image {image}: {exc}", "pass a PNG or JPEG file") from exc
    return image.convert("RGB")
