"""Entries for serving engines that build their own layers (vLLM), as custom ops like ops.py's.

A serving engine never runs the patched modeling file: its layers hand over other shapes than
transformers' (tokens flattened to one axis, q and k as [tokens, heads * head_dim], the residual add fused
into the norm, the gate and up projections merged into one matmul). These entries take that form and
run the routes bound at `enable()`, counted under the op that switches them:

    torch.ops.pto_kernels.add_rms_norm(x, residual, weight, eps) -> (normed, x + residual)   # rms_norm
    torch.ops.pto_kernels.silu_and_mul(gate_up) -> silu(gate) * up                         # swiglu_mlp
    token_mrope(q, k, cos, sin, mrope_section, head_size)                                  # mrope

`token_mrope` reshapes to transformers' layout and calls the `mrope` entry (the same kernel the patched
modeling code calls). Each function calls the bound route directly in eager mode and the custom op under
torch.compile, as the package's wrappers do.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _dispatch, ops


def _add_rms_norm(
    hidden_states: Tensor, residual: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    return ops._run("add_rms_norm", (hidden_states, residual, weight, eps))


def _silu_and_mul(gate_up: Tensor) -> Tensor:
    return ops._run("silu_and_mul", (gate_up,))


# custom op name -> its typed body, registered once per process as ops.py registers its own (entries.py
# declares the ops)
BODIES = {"add_rms_norm": _add_rms_norm, "silu_and_mul": _silu_and_mul}
NAMES = tuple(BODIES)
ops.register(BODIES)

_tracing = torch.compiler.is_compiling


def rms_norm(hidden_states: Tensor, weight: Tensor, eps: float) -> Tensor:
    if _tracing():
        return torch.ops.pto_kernels.rms_norm(hidden_states, weight, float(eps))
    return _dispatch.ROUTES["rms_norm"](hidden_states, weight, eps)


def add_rms_norm(
    hidden_states: Tensor, residual: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    if _tracing():
        return torch.ops.pto_kernels.add_rms_norm(hidden_states, residual, weight, float(eps))
    return _dispatch.ROUTES["add_rms_norm"](hidden_states, residual, weight, eps)


def silu_and_mul(gate_up: Tensor) -> Tensor:
    if _tracing():
        return torch.ops.pto_kernels.silu_and_mul(gate_up)
    return _dispatch.ROUTES["silu_and_mul"](gate_up)


def token_mrope(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, mrope_section: list[int], head_size: int
) -> tuple[Tensor, Tensor]:
    """MRoPE (neox-style halves) on q [tokens, q_heads * head_size] and k [tokens, k_heads * head_size].

    cos and sin are [3, tokens, head_size // 2]: the temporal, height and width tables looked up at each
    token's three positions, before section mixing. They become transformers' [3, 1, tokens, head_size]
    tables, and q and k its [1, heads, tokens, head_size] views, so the `mrope` entry runs unchanged.
    """
    tokens = query.shape[0]
    q = query.view(1, tokens, -1, head_size).transpose(1, 2)
    k = key.view(1, tokens, -1, head_size).transpose(1, 2)
    cos = torch.cat((cos, cos), dim=-1).unsqueeze(1)
    sin = torch.cat((sin, sin), dim=-1).unsqueeze(1)
    section = [int(s) for s in mrope_section]
    if _tracing():
        q, k = torch.ops.pto_kernels.mrope(q, k, cos, sin, section, 1)
    else:
        q, k = _dispatch.ROUTES["mrope"](q, k, cos, sin, section, 1)
    return q.transpose(1, 2).reshape(query.shape), k.transpose(1, 2).reshape(key.shape)
