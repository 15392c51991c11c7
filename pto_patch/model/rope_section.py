"""The MRoPE section a model runs with: config.json's own where it fits the head size, else the spec's.

An mrope section already in the config is kept when it fits the model's head size (the tiny test models
use a small one); one that does not fit is an error, never silently replaced, since it changes what the
model computes. A config without one gets the spec's section, as the reference system writes for
GutenOCR-3B ([16, 24, 24]). apply writes it into config.json (`patching.config_fix`); a run's plan reads
it from the folder it loads (`folder_mrope_section`) and the load sets it on every rope dict the loaded
config carries (`run.loading.fix_rope_config`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pto_patch.errors import ModelFolderError
from pto_patch.model.folder import ModelConfig, read_model_config
from pto_patch.model.spec import ModelSpec

# 4.x reads the section from rope_scaling, 5.x from rope_parameters; either may be nested in text_config.
ROPE_KEYS = ("rope_scaling", "rope_parameters")
_REDOWNLOAD_HINT = "download the model's config.json again"


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


def folder_mrope_section(folder: Path, spec: ModelSpec) -> list[int]:
    """The section the model in `folder` runs with, read from its config.json."""
    return choose_mrope_section(read_model_config(folder, spec), spec)
