"""The config.json changes apply makes: auto_map to the renamed classes, and the MRoPE fix.

Every other key, and the key order, is kept. The mrope section already in the config is kept
when it fits the model's head size (the tiny test models use a small one); otherwise the spec's
section is written, as the reference system does for GutenOCR-3B ([16, 24, 24]).
"""

from __future__ import annotations

import json
from typing import Any

from pto_patch.errors import ModelFolderError
from pto_patch.model_folder import ModelConfig
from pto_patch.spec import ModelSpec

# 4.x reads the section from rope_scaling, 5.x from rope_parameters; either may be nested in text_config.
ROPE_KEYS = ("rope_scaling", "rope_parameters")


def head_dim(data: dict[str, Any]) -> int | None:
    """The text model's head size, from config.json's data (flat, or nested in text_config)."""
    for scope in (data, data.get("text_config") or {}):
        if scope.get("head_dim"):
            return int(scope["head_dim"])
        if scope.get("hidden_size") and scope.get("num_attention_heads"):
            return int(scope["hidden_size"]) // int(scope["num_attention_heads"])
    return None


def existing_mrope_section(data: dict[str, Any]) -> list[int] | None:
    for scope in (data, data.get("text_config") or {}):
        for key in ROPE_KEYS:
            rope = scope.get(key)
            if isinstance(rope, dict) and isinstance(rope.get("mrope_section"), list | tuple):
                return [int(x) for x in rope["mrope_section"]]
    return None


def choose_mrope_section(data: dict[str, Any], spec: ModelSpec, where: str) -> list[int]:
    """The one mrope rule (apply's config.json, verify's loaded config): the section already there
    if it is three numbers summing to head_dim / 2, else the spec's if that fits, else an error."""
    size = head_dim(data)
    existing = existing_mrope_section(data)
    if size is None:
        raise ModelFolderError(
            f"{where} names neither head_dim nor hidden_size and num_attention_heads",
            "download the model's config.json again",
        )
    if existing is not None and len(existing) == 3 and sum(existing) * 2 == size:
        return existing
    if sum(spec.mrope_section) * 2 == size:
        return list(spec.mrope_section)
    raise ModelFolderError(
        f"{where}: mrope_section {existing or list(spec.mrope_section)} does not fit head_dim {size}",
        "fix rope_scaling.mrope_section in config.json (three numbers summing to head_dim / 2)",
    )


def fixed_config(config: ModelConfig, spec: ModelSpec) -> dict[str, Any]:
    """A copy of config.json's data with auto_map and the rope fix applied (key order kept)."""
    data = json.loads(config.raw_bytes.decode("utf-8"))
    section = choose_mrope_section(config.data, spec, str(config.path))
    data["auto_map"] = spec.renamed_auto_map()
    rope_scaling = data.get("rope_scaling")
    rope_scaling = dict(rope_scaling) if isinstance(rope_scaling, dict) else {}
    rope_scaling["type"] = "mrope"
    rope_scaling["mrope_section"] = section
    data["rope_scaling"] = rope_scaling
    if isinstance(data.get("rope_parameters"), dict):
        data["rope_parameters"]["mrope_section"] = section
    text_config = data.get("text_config")
    if isinstance(text_config, dict):
        for key in ROPE_KEYS:
            if isinstance(text_config.get(key), dict):
                text_config[key]["mrope_section"] = section
    return data


def render_config(data: dict[str, Any], original: bytes) -> bytes:
    """Serialise like the hub does (2-space indent), keeping the original's line ending style."""
    text = json.dumps(data, indent=2, ensure_ascii=False)
    newline = "\r\n" if b"\r\n" in original else "\n"
    if newline != "\n":
        text = text.replace("\n", newline)
    if original.endswith(b"\n"):
        text += newline
    return text.encode("utf-8")
