"""The installed transformers' own Qwen2.5-VL code, found by the names the model spec lists.

Kernel tests compare against these functions (not against pto_kernels.reference), so the kernels and the
package's reference are both held to whatever the installed release actually computes.
"""

import importlib
import json
from pathlib import Path

import torch

SPEC = Path(__file__).resolve().parents[2] / "templates" / "specs" / "gutenocr_3b.json"
MODELING = "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl"


def modeling():
    return importlib.import_module(MODELING)


def release() -> str:
    return importlib.import_module("transformers").__version__


def _names(op: str, kind: str) -> list[str]:
    return json.loads(SPEC.read_text())["injections"][op][kind]


def _first_present(op: str, kind: str):
    """The first spec-listed name the modeling module defines or imports (4.57 imports Qwen2RMSNorm)."""
    module = modeling()
    for name in _names(op, kind):
        found = getattr(module, name, None)
        if found is not None:
            return name, found
    return None, None


def rms_norm_class() -> type[torch.nn.Module]:
    name, cls = _first_present("rms_norm", "classes")
    if cls is None:  # a release that renamed the class again: take the norm the decoder layers build
        candidates = [
            obj
            for n, obj in vars(modeling()).items()
            if n.endswith("RMSNorm") and isinstance(obj, type) and issubclass(obj, torch.nn.Module)
        ]
        if len(candidates) != 1:
            raise LookupError(f"no single RMSNorm class in {MODELING} (transformers {release()})")
        cls = candidates[0]
    return cls


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The RMSNorm module's forward, with its weight set to `weight` (same dtype, as a checkpoint loads it)."""
    module = rms_norm_class()(weight.shape[-1], eps=eps)
    module.weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=False)
    with torch.no_grad():
        return module(hidden_states)


def apply_rotary_pos_emb():
    """`apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)`: cos/sin already section-mixed, [b, s, d]."""
    found = getattr(modeling(), "apply_rotary_pos_emb", None)
    if found is None:  # 4.x keeps only the multimodal variant here; the plain one is qwen2's
        found = importlib.import_module("transformers.models.qwen2.modeling_qwen2").apply_rotary_pos_emb
    return found


def apply_multimodal_rotary_pos_emb():
    """The pre-5.20 function (mixes [3, b, s, d] tables itself), or None where the release lacks it."""
    return getattr(modeling(), "apply_multimodal_rotary_pos_emb", None)


def text_config(head_dim: int, mrope_section: list[int]):
    config_module = importlib.import_module("transformers.models.qwen2_5_vl.configuration_qwen2_5_vl")
    heads = 4
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": list(mrope_section)}
    config = config_module.Qwen2_5_VLTextConfig(
        hidden_size=head_dim * heads,
        num_attention_heads=heads,
        num_key_value_heads=2,
        intermediate_size=2 * head_dim,
        num_hidden_layers=1,
        vocab_size=64,
    )
    if hasattr(config, "rope_parameters"):  # 5.x
        config.rope_parameters = rope
    else:  # 4.x: rope_scaling plus rope_theta, as the hub's flat config.json has them
        config.rope_scaling, config.rope_theta = dict(rope, type="mrope"), rope["rope_theta"]
    return config


def rotary_tables(x: torch.Tensor, position_ids: torch.Tensor, mrope_section: list[int]):
    """(mixed cos, mixed sin, unmixed cos, unmixed sin) from the installed rotary embedding module.

    Mixed tables are [b, s, d] as 5.20+ hands them to apply_rotary_pos_emb. The unmixed [3, b, s, d]
    tables are what releases up to 5.16 passed to apply_multimodal_rotary_pos_emb: the same module with
    its section recomposition replaced by the plain (freq, freq) layout. None where the installed module
    has no recomposition step (it returns unmixed tables already).
    """
    module = modeling().Qwen2_5_VLRotaryEmbedding(text_config(x.shape[-1], mrope_section))
    with torch.no_grad():
        cos, sin = module(x, position_ids)
        if not hasattr(module, "recomposition_frequencies"):
            return None
        module.recomposition_frequencies = lambda freq: torch.cat((freq, freq), dim=-1)
        cos3, sin3 = module(x, position_ids)
    return cos, sin, cos3, sin3


def swiglu_mlp_module(hidden: int, intermediate: int, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """The installed text MLP class (Qwen2MLP) at the given width, random weights of the given dtype."""
    _, cls = _first_present("swiglu_mlp", "classes")
    config = text_config(16, [2, 3, 3])
    config.hidden_size, config.intermediate_size = hidden, intermediate
    module = cls(config).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for proj in (module.gate_proj, module.up_proj, module.down_proj):
            fan_in = proj.weight.shape[1]
            proj.weight.copy_(torch.randn(proj.weight.shape, generator=gen) / fan_in**0.5)
    return module
