"""Model folders the tests build by hand: the checkpoint's config.json and nothing else needed."""

from __future__ import annotations

import json
from pathlib import Path

# GutenOCR-3B's config.json as the hub has it (the values apply reads).
HUB_CONFIG = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "rope_scaling": {"type": "default", "mrope_section": [16, 24, 24]},
    "torch_dtype": "bfloat16",
    "vision_config": {"hidden_size": 1280},
    "tie_word_embeddings": True,
}


def write_config(folder: Path, data: dict, newline: str = "\n") -> Path:
    text = json.dumps(data, indent=2).replace("\n", newline) + newline
    path = folder / "config.json"
    path.write_bytes(text.encode())
    return path
