"""The config.json changes apply makes: auto_map to the renamed classes, and the MRoPE section.

Every other key, and the key order, is kept. An mrope section already in the config is kept when
it fits the model's head size (the tiny test models use a small one); one that does not fit is an
error, never silently replaced, since it changes what the model computes. A config without one
gets the spec's section, as the reference system writes for GutenOCR-3B ([16, 24, 24]).
`config_changes` lists what changed, key by key, for apply's output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pto_patch.errors import ModelFolderError
from pto_patch.model.folder import ModelConfig
from pto_patch.model.spec import ModelSpec

# 4.x reads the section from rope_scaling, 5.x from rope_parameters; either may be nested in text_config.
ROPE_KEYS = ("rope_scaling", "rope_parameters")
_REDOWNLOAD_HINT = "download the model's config.json again"


@dataclass(frozen=True)
class ConfigChange:
    key: str  # dotted path in config.json, e.g. "rope_scaling.mrope_section"
    change: str  # "added" or "changed"
    old: Any = None
    new: Any = None


def _scopes(config: ModelConfig) -> list[tuple[str, dict[str, Any]]]:
    """(prefix, object) for the top level and text_config, which must be an object when present."""
    scopes = [("", config.data)]
    text_config = config.data.get("text_config")
    if text_config is not None:
        if not isinstance(text_config, dict):
            raise ModelFolderError(
                f"{config.path}: text_config is {text_config!r}, not an object", _REDOWNLOAD_HINT
            )
        scopes.append(("text_config.", text_config))
    return scopes


def _positive_int(config: ModelConfig, scope: dict[str, Any], prefix: str, key: str) -> int | None:
    value = scope.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelFolderError(
            f"{config.path}: {prefix}{key} is {value!r}, not a positive integer", _REDOWNLOAD_HINT
        )
    return value


def _head_dim(config: ModelConfig) -> int:
    for prefix, scope in _scopes(config):
        head_dim = _positive_int(config, scope, prefix, "head_dim")
        if head_dim:
            return head_dim
        hidden = _positive_int(config, scope, prefix, "hidden_size")
        heads = _positive_int(config, scope, prefix, "num_attention_heads")
        if hidden and heads:
            return hidden // heads
    raise ModelFolderError(
        f"{config.path} names neither head_dim nor hidden_size and num_attention_heads", _REDOWNLOAD_HINT
    )


def _existing_sections(config: ModelConfig) -> list[tuple[str, list[int]]]:
    """(where, section) for every mrope_section the config holds, each checked to be three positive ints."""
    found = []
    for prefix, scope in _scopes(config):
        for key in ROPE_KEYS:
            rope = scope.get(key)
            if rope is None:
                continue
            if not isinstance(rope, dict):
                raise ModelFolderError(
                    f"{config.path}: {prefix}{key} is {rope!r}, not an object", _REDOWNLOAD_HINT
                )
            if "mrope_section" not in rope:
                continue
            section = rope["mrope_section"]
            where = f"{prefix}{key}.mrope_section"
            if (
                not isinstance(section, list)
                or len(section) != 3
                or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in section)
            ):
                raise ModelFolderError(
                    f"{config.path}: {where} is {section!r}, not three positive integers",
                    "fix it in config.json (three numbers summing to head_dim / 2)",
                )
            found.append((where, list(section)))
    return found


def choose_mrope_section(config: ModelConfig, spec: ModelSpec) -> list[int]:
    head_dim = _head_dim(config)
    existing = _existing_sections(config)
    for where, section in existing:
        if sum(section) * 2 != head_dim:
            raise ModelFolderError(
                f"{config.path}: {where} {section} does not fit head_dim {head_dim} "
                f"(its numbers must sum to {head_dim // 2})",
                f"set it to the section the checkpoint was trained with (for {spec.name}: "
                f"{list(spec.mrope_section)}), then run apply again",
            )
    if existing:
        return existing[0][1]
    if sum(spec.mrope_section) * 2 == head_dim:
        return list(spec.mrope_section)
    raise ModelFolderError(
        f"{config.path}: mrope_section {list(spec.mrope_section)} does not fit head_dim {head_dim}",
        "fix rope_scaling.mrope_section in config.json (three numbers summing to head_dim / 2)",
    )


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
