"""What a run feeds the model: the prompt (through the chat template), an optional image, a batch.

The image path goes through `image_inputs`, which does what the stock processor does for one image
without needing torchvision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pto_patch.errors import PtoPatchError
from pto_patch.run.device import DeviceChoice
from pto_patch.run.loading import LoadedModel

DEFAULT_PROMPT = "你好"  # the reference run script's default
# GutenOCR's full-page reading prompt (its model card's "read all text" task).
OCR_PROMPT = (
    "Read all text in the image and return a single TEXT string, linearized left-to-right/top-to-bottom."
)


def check_image(image: Path) -> None:
    """Refuse an --image that is missing, a folder, or not a picture PIL can decode, before any load."""
    from PIL import Image

    if not image.exists():
        raise PtoPatchError(f"--image {image} does not exist", "pass the path of a PNG or JPEG file")
    if not image.is_file():
        raise PtoPatchError(f"--image {image} is not a file", "pass the path of a PNG or JPEG file")
    try:
        with Image.open(image) as opened:
            opened.verify()
    except Exception as exc:  # PIL raises OSError, SyntaxError, struct.error ... for bad or truncated data
        reason = (str(exc).splitlines() or [""])[0] or type(exc).__name__
        raise PtoPatchError(
            f"--image {image} is not an image PIL can read ({reason})", "pass a PNG or JPEG file"
        ) from exc


def encode_prompt(loaded: LoadedModel, prompt: str | None, image: Path | None, simple_prompt: bool):
    """Tokenised inputs for one sequence of `loaded` (through the model's chat template and image
    processor), plus a description for the report."""
    from pto_patch.run import image_inputs

    tokenizer = loaded.tokenizer
    if image is not None:
        prompt = OCR_PROMPT if prompt is None else prompt
        picture = image_inputs.as_rgb_image(Path(image))
        inputs = image_inputs.build_inputs(
            loaded.folder,
            prompt,
            picture,
            tokenizer=tokenizer,
            generation_class=loaded.spec.family.generation_class,
        )
        image_id = tokenizer.convert_tokens_to_ids(image_inputs.IMAGE_TOKEN)
        description = {
            "kind": "image",
            "image": str(image),
            "image_size": list(picture.size),
            "image_tokens": int((inputs["input_ids"] == image_id).sum()),
        }
    else:
        prompt = DEFAULT_PROMPT if prompt is None else prompt
        if simple_prompt:  # the raw prompt, no chat template
            encoded = tokenizer(prompt, return_tensors="pt")
            inputs = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
        else:
            inputs = image_inputs.build_inputs(
                loaded.folder,
                prompt,
                None,
                tokenizer=tokenizer,
                generation_class=loaded.spec.family.generation_class,
            )
        description = {"kind": "text"}
    description.update(
        prompt=prompt,
        chat_template=not (simple_prompt and image is None),
        prompt_tokens=int(inputs["input_ids"].shape[1]),
    )
    return inputs, description


def repeat_for_batch(inputs: dict[str, Any], batch: int, device: DeviceChoice) -> dict[str, Any]:
    """The same sequence `batch` times (per-image tensors are stacked per sequence)."""
    result = {}
    for key, value in inputs.items():
        if key in ("pixel_values", "image_grid_thw"):
            result[key] = value.repeat(batch, *([1] * (value.dim() - 1)))
        else:
            result[key] = value.repeat(batch, 1)
        result[key] = result[key].to(device.name)
    return result
