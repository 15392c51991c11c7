"""torch_npu fused ops, for Ascend hosts without PyPTO.

torch_npu is imported lazily on the first call: importing this module never needs it. Unverified on
hardware here; the golden tests drive it through a stand-in module with the documented signatures.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

from . import fused, reference


def _torch_npu():
    return importlib.import_module("torch_npu")


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    out_dtype = torch.promote_types(hidden_states.dtype, weight.dtype)
    y, _rstd = _torch_npu().npu_rms_norm(hidden_states, weight.to(hidden_states.dtype), epsilon=eps)
    return y.to(out_dtype)


def _rotary(q, k, cos, sin):
    npu = _torch_npu()
    q_embed = npu.npu_rotary_mul(q, cos, sin, rotary_mode="half")
    k_embed = npu.npu_rotary_mul(k, cos, sin, rotary_mode="half")
    return q_embed, k_embed


def mrope(q, k, cos, sin, mrope_section, unsqueeze_dim: int = 1):
    # Section mixing is shared with the fused path: built once per forward, reused by every layer.
    cos_m, sin_m, _ = fused.MIXED_TABLES.get(cos, sin, tuple(int(s) for s in mrope_section), unsqueeze_dim)
    return _rotary(q, k, cos_m.to(q.dtype), sin_m.to(q.dtype))


def mrope_mixed(q, k, cos, sin, unsqueeze_dim: int = 1):
    return _rotary(q, k, cos.unsqueeze(unsqueeze_dim).to(q.dtype), sin.unsqueeze(unsqueeze_dim).to(q.dtype))


def swiglu_mlp_weights(hidden_states, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias):
    # npu_swiglu is the activation only: silu(first half) * second half of the last dim.
    gate_up = torch.cat(
        (F.linear(hidden_states, gate_weight, gate_bias), F.linear(hidden_states, up_weight, up_bias)), dim=-1
    )
    return F.linear(_torch_npu().npu_swiglu(gate_up, dim=-1), down_weight, down_bias)


def swiglu_mlp(mlp_module: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    gate, up, down = mlp_module.gate_proj, mlp_module.up_proj, mlp_module.down_proj
    if not fused.reference.is_silu(mlp_module.act_fn):
        return fused.swiglu_mlp(mlp_module, hidden_states)
    return swiglu_mlp_weights(
        hidden_states, gate.weight, gate.bias, up.weight, up.bias, down.weight, down.bias
    )


def add_rms_norm(hidden_states, residual, weight, eps: float = 1e-6):
    # npu_add_rms_norm returns (normed, rstd, x + residual): the add and the norm in one kernel.
    out_dtype = torch.promote_types(hidden_states.dtype, weight.dtype)
    y, _rstd, summed = _torch_npu().npu_add_rms_norm(
        hidden_states, residual.to(hidden_states.dtype), weight.to(hidden_states.dtype), epsilon=eps
    )
    return y.to(out_dtype), summed


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    return _torch_npu().npu_swiglu(gate_up, dim=-1)


# Decoder-layer blocks from torch_npu's fused ops: npu_add_rms_norm carries the residual add, npu_rms_norm
# the input norm, npu_rotary_mul the rotation, npu_swiglu the activation.


def residual_rms_norm(hidden_states, residual, weight, eps: float = 1e-6):
    return add_rms_norm(hidden_states, residual, weight, eps)


def mlp_block(
    residual, attn_output, o_weight, o_bias, norm_weight, eps,
    gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias,
):  # fmt: skip
    normed, summed = add_rms_norm(F.linear(attn_output, o_weight, o_bias), residual, norm_weight, eps)
    return summed + swiglu_mlp_weights(
        normed, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias
    )


def attention_prologue(*args):
    """reference.attention_prologue's arguments; this backend's RMSNorm and MRoPE."""
    return reference.prologue_with(rms_norm, mrope, args)


def attention_prologue_mixed(*args):
    """reference.attention_prologue_mixed's arguments; this backend's RMSNorm and MRoPE."""
    return reference.prologue_with(rms_norm, mrope_mixed, args)
