"""Architecture families: what every spec of one transformers model directory shares, as data.

A spec names its family (`"family": "qwen3_vl"`). The family says what no single checkpoint decides: the
stock class the patched folder's main class is renamed from, the first transformers release that ships the
model directory, where config.json keeps the text widths, how make-tiny lays out the hub checkpoint, and the
ops pto-patch refuses for the family (with the reason a user is shown).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pto_patch.errors import SpecError


@dataclass(frozen=True)
class Family:
    name: str  # the transformers model directory and config.json's model_type, e.g. "qwen3_vl"
    title: str  # how people write it, e.g. "Qwen3-VL"
    generation_class: str  # the stock class `AutoModelForImageTextToText` loads, before renaming
    # the first transformers release pto-patch patches the family on (the release matrix starts at 4.57;
    # Qwen3-VL's models/qwen3_vl first shipped in it)
    supported_from: str
    # True: config.json keeps the text widths and rope dict under `text_config` (Qwen3-VL's hub layout);
    # False: at the top level, as Qwen2.5-VL's hub checkpoints do
    nested_text_config: bool = False
    # op -> why the family cannot take it; asking for one is an error that says so
    refused_ops: dict[str, str] = field(default_factory=dict)


FAMILIES: dict[str, Family] = {
    "qwen2_5_vl": Family(
        name="qwen2_5_vl",
        title="Qwen2.5-VL",
        generation_class="Qwen2_5_VLForConditionalGeneration",
        supported_from="4.57",
    ),
    "qwen3_vl": Family(
        name="qwen3_vl",
        title="Qwen3-VL",
        generation_class="Qwen3VLForConditionalGeneration",
        supported_from="4.57",
        nested_text_config=True,
        refused_ops={
            "attention_prologue": (
                "Qwen3-VL normalises q and k per head (q_norm, k_norm) between the projections and the "
                "rotation; the attention_prologue kernel (input norm, q/k/v projections and MRoPE in one "
                "launch) has no q/k norm step, so it would skip them"
            ),
        },
    ),
}


def family(name: str, where: str = "spec") -> Family:
    """The family `name`; a SpecError naming the known ones otherwise."""
    found = FAMILIES.get(name)
    if found is None:
        raise SpecError(
            f"model spec {where} names unknown family '{name}'",
            f"families pto-patch knows: {', '.join(FAMILIES)}",
        )
    return found
