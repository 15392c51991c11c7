"""The config.json changes apply makes: auto_map to the renamed classes, and the MRoPE section.

Every other key, and the key order, is kept. The section is `model.rope_section`'s choice (the config's
own where it fits the head size, else the spec's). `config_changes` lists what changed, key by key, for
apply's output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pto_patch.model.folder import ModelConfig
from pto_patch.model.rope_section import ROPE_KEYS, choose_mrope_section
from pto_patch.model.spec import ModelSpec


@dataclass(frozen=True)
class ConfigChange:
    key: str  # dotted path in config.json, e.g. "rope_scaling.mrope_section"
    change: str  # "added" or "changed"
    old: Any = None
    new: Any = None


def fixed_config(config: ModelConfig, spec: ModelSpec) -> dict[str, Any]:
    """A copy of config.json's data with auto_map and the rope fix applied (key order kept)."""
    data = json.loads(config.raw_bytes.decode("utf-8"))
    section = choose_mrope_section(config, spec)
    data["auto_map"] = spec.renamed_auto_map()
    text_config = data.get("text_config")
    if spec.family.nested_text_config and isinstance(text_config, dict):
        return _fixed_nested_rope(data, text_config, section)
    rope_scaling = data.get("rope_scaling")
    rope_scaling = dict(rope_scaling) if isinstance(rope_scaling, dict) else {}
    rope_scaling["type"] = "mrope"
    rope_scaling["mrope_section"] = section
    data["rope_scaling"] = rope_scaling
    if isinstance(data.get("rope_parameters"), dict):
        data["rope_parameters"]["mrope_section"] = section
    if isinstance(text_config, dict):
        for key in ROPE_KEYS:
            if isinstance(text_config.get(key), dict):
                text_config[key]["mrope_section"] = section
    return data


def _fixed_nested_rope(
    data: dict[str, Any], text_config: dict[str, Any], section: list[int]
) -> dict[str, Any]:
    """A family that keeps its rope dict in text_config (Qwen3-VL): the section goes where the dicts are, and
    none is added at the top level, where the composite config would take it for a rope setting of its own."""
    if not any(isinstance(text_config.get(key), dict) for key in ROPE_KEYS):
        text_config["rope_scaling"] = {
            "mrope_interleaved": True,
            "mrope_section": section,
            "rope_type": "default",
        }
    for scope in (data, text_config):
        for key in ROPE_KEYS:
            if isinstance(scope.get(key), dict):
                scope[key]["mrope_section"] = section
    return data


def config_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[ConfigChange]:
    """Every key of `new` that `old` lacks or holds another value for, down into objects both have."""
    changes = []
    for key, value in new.items():
        if key not in old:
            changes.append(ConfigChange(f"{prefix}{key}", "added", None, value))
        elif isinstance(old[key], dict) and isinstance(value, dict):
            changes += config_changes(old[key], value, f"{prefix}{key}.")
        elif old[key] != value:
            changes.append(ConfigChange(f"{prefix}{key}", "changed", old[key], value))
    return changes


def render_config(data: dict[str, Any], original: bytes) -> bytes:
    """Serialise like the hub does (2-space indent), keeping the original's line ending style."""
    text = json.dumps(data, indent=2, ensure_ascii=False)
    newline = "\r\n" if b"\r\n" in original else "\n"
    if newline != "\n":
        text = text.replace("\n", newline)
    if original.endswith(b"\n"):
        text += newline
    return text.encode("utf-8")
