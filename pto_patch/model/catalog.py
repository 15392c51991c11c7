"""`pto-patch models`: the specs pto-patch knows, their checkpoints' shapes, and where each value comes from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pto_patch.model.spec import ModelSpec, all_specs, load_spec


@dataclass(frozen=True)
class ModelEntry:
    spec: ModelSpec

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        text = spec.checkpoint.get("text", {})
        vision = spec.checkpoint.get("vision", {})
        return {
            "name": spec.name,
            "description": spec.description,
            "hub_repo_id": spec.hub_repo_id,
            "model_path_env": spec.model_path_env,
            "spec_file": str(spec.source_path) if spec.source_path else None,
            "builtin": spec.builtin,
            "family": spec.family.name,
            "family_title": spec.family.title,
            "class_prefixes": [new for _, new in spec.class_renames],
            "ops": list(spec.injections),
            "tie_word_embeddings": spec.tie_word_embeddings,
            "checkpoint": {
                "hidden_size": text.get("hidden_size"),
                "intermediate_size": text.get("intermediate_size"),
                "num_hidden_layers": text.get("num_hidden_layers"),
                "num_attention_heads": text.get("num_attention_heads"),
                "num_key_value_heads": text.get("num_key_value_heads"),
                "vocab_size": text.get("vocab_size"),
                "vision_hidden_size": vision.get("hidden_size"),
                "vision_out_hidden_size": vision.get("out_hidden_size"),
            },
            "sources": [dict(item) for item in spec.sources],
            "disagreements": list(spec.disagreements),
        }


@dataclass(frozen=True)
class ModelsResult:
    models: tuple[ModelEntry, ...]

    def to_json(self) -> dict[str, Any]:
        return {"models": [entry.to_json() for entry in self.models]}


def list_models(model: str | None = None) -> ModelsResult:
    """Every built-in spec, or only `model` (a name or the path of a spec file, validated as apply would)."""
    specs = [load_spec(model)] if model is not None else all_specs()
    return ModelsResult(tuple(ModelEntry(spec) for spec in specs))
