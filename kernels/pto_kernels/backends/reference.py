"""Eager reference implementations: the same math as transformers' Qwen2.5-VL modeling code.

Every other backend is checked against these (and the golden tests check these against float64).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import decode_lengths


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def mix_sections(
    cos: torch.Tensor, sin: torch.Tensor, mrope_section: list[int] | tuple[int, ...], unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """[3, b, s, d] temporal/height/width tables -> one [b, s, d] table (unsqueezed at unsqueeze_dim)."""
    sections = list(mrope_section) * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(sections, dim=-1))], dim=-1)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(sections, dim=-1))], dim=-1)
    return cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin already mixed and broadcastable to q and k."""
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def mrope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mrope_section: list[int] | tuple[int, ...],
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' apply_multimodal_rotary_pos_emb (releases up to 5.16)."""
    cos, sin = mix_sections(cos, sin, mrope_section, unsqueeze_dim)
    return apply_rotary(q, k, cos, sin)


def mrope_mixed(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' apply_rotary_pos_emb (5.20+: cos/sin arrive section-mixed as [b, s, d])."""
    return apply_rotary(q, k, cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim))


def is_silu(act) -> bool:
    """True for the SiLU activation module of torch or of older transformers releases."""
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def swiglu_mlp(mlp_module: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    return mlp_module.down_proj(
        mlp_module.act_fn(mlp_module.gate_proj(hidden_states)) * mlp_module.up_proj(hidden_states)
    )


def swiglu_mlp_weights(
    hidden_states: torch.Tensor,
    gate_weight: torch.Tensor,
    gate_bias: torch.Tensor | None,
    up_weight: torch.Tensor,
    up_bias: torch.Tensor | None,
    down_weight: torch.Tensor,
    down_bias: torch.Tensor | None,
) -> torch.Tensor:
    """swiglu_mlp of a SiLU MLP given its weights (the form the pto_kernels::swiglu_mlp op takes)."""
    gate = F.silu(F.linear(hidden_states, gate_weight, gate_bias))
    return F.linear(gate * F.linear(hidden_states, up_weight, up_bias), down_weight, down_bias)


def add_rms_norm(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual form of RMSNorm that serving engines call between layers (vLLM's `RMSNorm(x,
    residual)`): the sum x + residual is taken in fp32 and normalised, and handed back in x's dtype as
    the next residual. Returns (normed, sum)."""
    input_dtype = hidden_states.dtype
    summed = hidden_states.to(torch.float32) + residual.to(torch.float32)
    variance = summed.pow(2).mean(-1, keepdim=True)
    normed = summed * torch.rsqrt(variance + eps)
    return weight * normed.to(input_dtype), summed.to(input_dtype)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """The SwiGLU activation on a merged gate/up projection: silu(first half) * second half of the last
    dim (what a serving engine runs between its merged gate_up matmul and down_proj)."""
    half = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :half]) * gate_up[..., half:]


# Decoder-layer blocks: several of a layer's small ops as one entry each (fewer launches per token).


def residual_rms_norm(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoder layer's `residual + hidden_states` followed by its RMSNorm, in transformers' order: the sum
    is rounded to the activations' dtype before it is normalised (unlike `add_rms_norm`'s fp32 sum).
    Returns (normed, sum): the sum is the next residual."""
    summed = residual + hidden_states
    return rms_norm(summed, weight, eps), summed


def mlp_block(
    residual: torch.Tensor,
    attn_output: torch.Tensor,
    o_weight: torch.Tensor,
    o_bias: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    gate_weight: torch.Tensor,
    gate_bias: torch.Tensor | None,
    up_weight: torch.Tensor,
    up_bias: torch.Tensor | None,
    down_weight: torch.Tensor,
    down_bias: torch.Tensor | None,
) -> torch.Tensor:
    """Everything a decoder layer does after the attention core: the output projection, the residual add,
    the post-attention RMSNorm, the SiLU MLP and the residual add after it.

    attn_output is the attention core's [b, s, heads * head_dim] (before o_proj); residual the layer's
    input. Returns the layer's output."""
    summed = residual + F.linear(attn_output, o_weight, o_bias)
    normed = rms_norm(summed, norm_weight, eps)
    return summed + swiglu_mlp_weights(
        normed, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias
    )


def project_heads(
    normed: torch.Tensor,
    q_weight: torch.Tensor,
    q_bias: torch.Tensor | None,
    k_weight: torch.Tensor,
    k_bias: torch.Tensor | None,
    v_weight: torch.Tensor,
    v_bias: torch.Tensor | None,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The q/k/v projections of normed [b, s, hidden] with their biases, as [b, heads, s, head_dim] views."""
    b, s = normed.shape[0], normed.shape[1]
    return tuple(
        F.linear(normed, w, bias).view(b, s, -1, head_dim).transpose(1, 2)
        for w, bias in ((q_weight, q_bias), (k_weight, k_bias), (v_weight, v_bias))
    )


def attention_prologue(
    hidden_states: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    q_weight: torch.Tensor,
    q_bias: torch.Tensor | None,
    k_weight: torch.Tensor,
    k_bias: torch.Tensor | None,
    v_weight: torch.Tensor,
    v_bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mrope_section: list[int] | tuple[int, ...],
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Everything a decoder layer does before the attention core (transformers <= 5.16's sectioned MRoPE):
    the input RMSNorm of hidden_states [b, s, hidden], the q/k/v projections with their biases, and MRoPE on
    q and k with cos/sin [3, b, s, head_dim]. Returns q, k, v as [b, heads, s, head_dim]."""
    projections = (q_weight, q_bias, k_weight, k_bias, v_weight, v_bias)
    return prologue_with(
        rms_norm, mrope, (hidden_states, norm_weight, eps, *projections, cos, sin, mrope_section, head_dim)
    )


def attention_prologue_mixed(
    hidden_states: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    q_weight: torch.Tensor,
    q_bias: torch.Tensor | None,
    k_weight: torch.Tensor,
    k_bias: torch.Tensor | None,
    v_weight: torch.Tensor,
    v_bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """attention_prologue for transformers 5.20+, whose cos/sin arrive section-mixed as [b, s, head_dim]."""
    projections = (q_weight, q_bias, k_weight, k_bias, v_weight, v_bias)
    return prologue_with(
        rms_norm, mrope_mixed, (hidden_states, norm_weight, eps, *projections, cos, sin, head_dim)
    )


def prologue_with(norm, rotary, args: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An attention prologue from a backend's own RMSNorm and rotary entries, on attention_prologue's
    arguments (with mrope_section) or attention_prologue_mixed's (without)."""
    hidden_states, norm_weight, eps, q_w, q_b, k_w, k_b, v_w, v_b, cos, sin, *section, head_dim = args
    q, k, v = project_heads(norm(hidden_states, norm_weight, eps), q_w, q_b, k_w, k_b, v_w, v_b, head_dim)
    q, k = rotary(q, k, cos, sin, *section, 1)
    return q, k, v


# The attention prologue that also writes its new keys and values into a static KV cache, as transformers'
# StaticLayer.update does right after the prologue (index_copy_ along the cache's positions).


def check_cache_write(key, key_cache, value_cache, position) -> None:
    """The cache write's contract, checked on every backend (raises ValueError): caches [b, kv_heads,
    cache_len, d] alike, of the new keys' batch, heads, head size and dtype; an int64 position tensor whose
    first element is the first new row's position."""
    batch, heads, rows, dim = key.shape
    if key_cache.shape != value_cache.shape or key_cache.dim() != 4:
        raise ValueError(
            f"the cache write takes key and value caches [b, kv_heads, cache_len, d] alike, not"
            f" {tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )
    if (key_cache.shape[0], key_cache.shape[1], key_cache.shape[3]) != (batch, heads, dim):
        raise ValueError(f"caches {tuple(key_cache.shape)} do not hold new keys {tuple(key.shape)}")
    if key_cache.dtype != key.dtype or value_cache.dtype != key.dtype:
        raise ValueError(f"caches in {key_cache.dtype}, new keys in {key.dtype}: the write would round them")
    if position.dtype != torch.int64 or position.numel() < 1:
        raise ValueError(
            f"the cache position is an int64 tensor, not {position.dtype} {tuple(position.shape)}"
        )


def write_cache(key_cache, value_cache, key, value, position) -> None:
    """transformers' StaticLayer.update on its caches: the s new rows of key / value [b, kv_heads, s, d] at
    cache positions position[0] .. position[0] + s - 1, in place."""
    check_cache_write(key, key_cache, value_cache, position)
    at = position.reshape(-1)[:1]  # a view: one new row writes where transformers' update would
    if key.shape[2] > 1:
        at = at + torch.arange(key.shape[2], device=position.device)
    key_cache.index_copy_(2, at, key)
    value_cache.index_copy_(2, at, value)


def prologue_cached(prologue, args: tuple) -> torch.Tensor:
    """An attention prologue entry (a backend's own) followed by the cache write, on the arguments of
    attention_prologue(_mixed) followed by key_cache, value_cache, position and advance (True: the position
    is the layer's own length, advanced in place by the new rows after the write, as transformers 5.8+'s
    StaticLayer.update does). Returns q."""
    *prologue_args, key_cache, value_cache, position, advance = args
    q, k, v = prologue(*prologue_args)
    write_cache(key_cache, value_cache, k, v, position)
    if advance:
        position.add_(k.shape[2])
    return q


def attention_prologue_cached(*args) -> torch.Tensor:
    """attention_prologue, then its k and v written into the static caches at `position` (what the
    attention's `cache.update` does next): attention_prologue's arguments, then key_cache, value_cache
    [b, kv_heads, cache_len, head_dim], position (int64; its first element the first new row's) and
    advance (advance the position by the new rows after the write). q."""
    return prologue_cached(attention_prologue, args)


def attention_prologue_mixed_cached(*args) -> torch.Tensor:
    """attention_prologue_cached with cos/sin already section-mixed (transformers 5.20+)."""
    return prologue_cached(attention_prologue_mixed, args)


# The attention core at decode: the new rows' attention over a static KV cache, as transformers computes it.


def decode_positions_allowed(
    kv_lens: torch.Tensor, rows: int, cache_len: int, kv_starts: torch.Tensor | None = None
) -> torch.Tensor:
    """[b, rows, cache_len] bool: row i of sequence b (its rows are the last `rows` of its kv_lens[b] valid
    positions, which begin at kv_starts[b], 0 when not given) sees cache positions kv_starts[b] <= j <=
    kv_starts[b] + kv_lens[b] - rows + i, causal among the new rows."""
    positions = torch.arange(cache_len, device=kv_lens.device).reshape(1, 1, -1)
    first = torch.zeros_like(kv_lens) if kv_starts is None else kv_starts.to(kv_lens.dtype)
    last = (
        (first + kv_lens).reshape(-1, 1, 1)
        - rows
        + torch.arange(rows, device=kv_lens.device).reshape(1, -1, 1)
    )
    return (positions <= last) & (positions >= first.reshape(-1, 1, 1))


def check_attention_core(query, key_cache, value_cache, kv_lens, kv_starts=None) -> None:
    """The op's contract, checked on every backend: shapes, GQA grouping and lengths (raises ValueError)."""
    if query.dim() != 4 or key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(
            f"attention_core takes query [b, q_heads, s, d] and caches [b, kv_heads, cache_len, d] alike,"
            f" not {tuple(query.shape)}, {tuple(key_cache.shape)}, {tuple(value_cache.shape)}"
        )
    batch, q_heads, rows, dim = query.shape
    if key_cache.shape[0] != batch or key_cache.shape[3] != dim or q_heads % key_cache.shape[1]:
        raise ValueError(
            f"attention_core: query {tuple(query.shape)} does not group over caches {tuple(key_cache.shape)}"
        )
    if tuple(kv_lens.shape) != (batch,) or kv_lens.dtype.is_floating_point:
        raise ValueError(f"attention_core takes kv_lens as [{batch}] integers, not {tuple(kv_lens.shape)}")
    if kv_starts is not None and (tuple(kv_starts.shape) != (batch,) or kv_starts.dtype.is_floating_point):
        raise ValueError(
            f"attention_core takes kv_starts as [{batch}] integers, not {tuple(kv_starts.shape)}"
        )


def attention_core(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
    kv_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """The attention core of a decode step, transformers' eager attention: the `rows` new query rows of each
    sequence over its kv_lens[b] valid cache positions from kv_starts[b] (left padding before them; 0 when
    not given), causal among the new rows, scores in the query's dtype scaled by `scale`, masked with the
    dtype's minimum, softmax in fp32 rounded back, times V.

    query [b, q_heads, rows, d]; key_cache / value_cache [b, kv_heads, cache_len, d] (the static cache,
    already holding the new rows' keys and values); kv_lens, kv_starts [b] integers. Returns
    [b, rows, q_heads * d] (what o_proj takes)."""
    check_attention_core(query, key_cache, value_cache, kv_lens, kv_starts)
    batch, q_heads, rows, dim = query.shape
    groups = q_heads // key_cache.shape[1]
    keys = key_cache.repeat_interleave(groups, dim=1)  # transformers' repeat_kv
    values = value_cache.repeat_interleave(groups, dim=1)
    allowed = decode_positions_allowed(kv_lens, rows, key_cache.shape[2], kv_starts)[:, None]
    mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
    mask = mask.masked_fill(~allowed, torch.finfo(query.dtype).min)
    scores = torch.matmul(query, keys.transpose(2, 3)) * scale + mask
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights, values).transpose(1, 2)
    return out.reshape(batch, rows, q_heads * dim)


def attention_core_masked(query, key_cache, value_cache, attention_mask, scale):
    """attention_core with each sequence's range (start, length) read from the attention mask the model
    built (decode_lengths.ranges; uncached: this is also the op's fake, run on fake tensors)."""
    kv_starts, kv_lens = decode_lengths.ranges(attention_mask, key_cache)
    return attention_core(query, key_cache, value_cache, kv_lens, scale, kv_starts)


def prologue_entries(backend: dict) -> tuple:
    """A backend's four prologue entries from its own RMSNorm and MRoPE, read from `backend` (its module's
    globals()) at every call, so a kernel replaced there is seen: (attention_prologue,
    attention_prologue_mixed, attention_prologue_cached, attention_prologue_mixed_cached), with the
    arguments of this module's functions of those names; the cached two write the cache as transformers'
    update does (two index_copy_)."""

    def attention_prologue(*args):
        return prologue_with(backend["rms_norm"], backend["mrope"], args)

    def attention_prologue_mixed(*args):
        return prologue_with(backend["rms_norm"], backend["mrope_mixed"], args)

    def attention_prologue_cached(*args):
        return prologue_cached(attention_prologue, args)

    def attention_prologue_mixed_cached(*args):
        return prologue_cached(attention_prologue_mixed, args)

    made = (
        attention_prologue,
        attention_prologue_mixed,
        attention_prologue_cached,
        attention_prologue_mixed_cached,
    )
    for entry in made:
        entry.__module__ = backend["__name__"]
        entry.__qualname__ = entry.__name__
        entry.__doc__ = (
            f"{entry.__name__} by {backend['__name__']}'s RMSNorm and MRoPE (reference.prologue_entries)"
        )
    return made
