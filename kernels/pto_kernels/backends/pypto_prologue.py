"""PyPTO 0.2 kernels of the attention prologue, one kernel a call: the input RMSNorm (folded into the q/k/v
weights), the q/k/v projections with their biases and MRoPE; and its decode-step form (one row a sequence, up
to 16 sequences) that writes the step's k and v into transformers' static KV cache (and advances the layer's
length) in the same kernel.

Beside pypto_blocks.py (the other decoder-layer blocks), whose tilings and notes on the cost model it shares;
pypto.py hands its entries to the dispatcher.
"""

# No `from __future__ import annotations`: pypto reads the kernels' annotations as objects.
import weakref

import torch

from ..tiling import tile_budget
from ..tiling.tile_table import DECODE_MAX_ROWS, tile_config
from . import fused, reference
from . import pypto_runtime as runtime
from .pypto_blocks import _block_tiles
from .pypto_pieces import WeightLayouts, check_half_blocks, rotated_halves


def _build_attention_prologue(
    rows, hidden, q_heads, k_heads, dim, dtype, table_dtype, eps, config, device_type
):
    """Rows are tokens (batch x positions): x [rows, hidden]; weights in nn.Linear layout with the input
    RMSNorm's weight folded in (W * norm_weight, column by column: `_norm_folded`), biases [1, n]; cos/sin
    [rows, dim] section-mixed; q/k/v out [rows, heads*dim] (heads side by side).

    The norm rides in the projections: RMSNorm(x) @ W^T = rsqrt(mean(x^2) + eps) * (x @ (W * g)^T), so the
    matmuls read x straight from global memory (no vector stage before them) while one vector task
    computes each row's scale beside them; the epilogue applies the scale and the bias, rounds as
    F.linear's output, and rotates q and k (RoPE), one task per head. As the MRoPE kernel, each head reads
    its cos/sin rows straight from the inputs."""
    pypto = runtime.pypto_module()
    dt, tdt = runtime.pypto_dtype(dtype), runtime.pypto_dtype(table_dtype)
    rows_axis = runtime.row_axis(config, rows)
    tile = config.row_tile
    q_width, kv_width = q_heads * dim, k_heads * dim
    m, proj_k, proj_n, norm_rows = _block_tiles(config)

    epilogue = _prologue_epilogue(hidden, (q_heads, k_heads), dim, eps, norm_rows, config, dt)

    @runtime.jit(device_type, config)
    def attention_prologue_kernel(
        x: pypto.Tensor([rows_axis, hidden], dt),
        q_w: pypto.Tensor([q_width, hidden], dt),
        q_b: pypto.Tensor([1, q_width], dt),
        k_w: pypto.Tensor([kv_width, hidden], dt),
        k_b: pypto.Tensor([1, kv_width], dt),
        v_w: pypto.Tensor([kv_width, hidden], dt),
        v_b: pypto.Tensor([1, kv_width], dt),
        cos: pypto.Tensor([rows_axis, dim], tdt),
        sin: pypto.Tensor([rows_axis, dim], tdt),
        q_out: pypto.Tensor([rows_axis, q_width], dt),
        k_out: pypto.Tensor([rows_axis, kv_width], dt),
        v_out: pypto.Tensor([rows_axis, kv_width], dt),
    ):
        n_rows = x.shape[0]
        for step in pypto.loop((n_rows + tile - 1) // tile):
            start = step * tile
            valid = pypto.min(start + tile, n_rows) - start
            xt = pypto.view(x, [tile, hidden], [start, 0], valid_shape=[valid, hidden])
            pypto.set_cube_tile_shapes(m, proj_k, proj_n)
            writer = _ToOutputs(q_out, k_out, v_out, start, q_heads, dim)
            tables = (cos, sin, start, tile, valid)
            epilogue(xt, (q_w, k_w, v_w), (q_b, k_b, v_b), tables, writer)
        pypto.set_pass_options(sg_set_scope=-1)  # a global option: leave it as found for the next kernel

    return attention_prologue_kernel


def _prologue_epilogue(hidden, heads, dim, eps, norm_rows, config, dt):
    """The prologue after its x tile, inside a kernel: epilogue(xt, (q, k, v) weights, (q, k, v) biases,
    (cos, sin, start, tile, valid), writer). The q/k/v matmuls in fp32; v scaled, biased and rounded in
    one task (writer.v(v)); then one task per q and k head (q heads first), scaled, biased, rounded and
    rotated (writer.head(head, first half, second half)). Each task works out its rows' RMSNorm scale from x
    itself: a scale shared between tasks would make them one task (pypto merges the consumers of a vector
    intermediate). The writers say where the results go: the outputs, or a static KV cache."""
    q_heads, k_heads = heads
    norm_scope = 1 if config.norm_one_task else -1  # -1: pypto partitions as it likes

    def epilogue(xt, weights, biases, tables, writer):
        pypto = runtime.pypto_module()
        q, k, v = (pypto.matmul(xt, w, pypto.DT_FP32, b_trans=True) for w in weights)
        q_b, k_b, v_b = biases
        cos, sin, start, tile, valid = tables
        pypto.set_vec_tile_shapes(norm_rows, hidden)
        pypto.set_pass_options(sg_set_scope=norm_scope)
        scale = _rms_scale(xt, hidden, eps)
        pypto.set_vec_tile_shapes(tile, dim)
        writer.v(_biased(pypto.mul(v, scale), v_b, dt))
        for head in range(q_heads + k_heads):
            src, bias, col = (q, q_b, head * dim) if head < q_heads else (k, k_b, (head - q_heads) * dim)
            pypto.set_pass_options(sg_set_scope=head + 2)
            pypto.set_vec_tile_shapes(norm_rows, hidden)
            scale = _rms_scale(xt, hidden, eps)
            pypto.set_vec_tile_shapes(tile, dim)
            writer.head(head, *_rope_epilogue(src, scale, bias, col, cos, sin, start, tile, valid, dim, dt))

    return epilogue


class _ToOutputs:
    """Where attention_prologue's kernel writes: q, k and v outputs [rows, heads * dim], at row `start`."""

    def __init__(self, q_out, k_out, v_out, start, q_heads, dim):
        self.q_out, self.k_out, self.v_out, self.start = q_out, k_out, v_out, start
        self.q_heads, self.dim = q_heads, dim

    def v(self, v):
        runtime.pypto_module().assemble(v, [self.start, 0], self.v_out)

    def head(self, head, out1, out2):
        pypto, dim = runtime.pypto_module(), self.dim
        dst, col = (
            (self.q_out, head * dim) if head < self.q_heads else (self.k_out, (head - self.q_heads) * dim)
        )
        pypto.assemble(out1, [self.start, col], dst)
        pypto.assemble(out2, [self.start, col + dim // 2], dst)


class _ToCache:
    """Where the cached prologue's kernel writes: q to its output, each kv head's k and v rows into the static
    caches at position `at` (a value read inside the kernel). Each cache is seen as one flat row a sequence,
    [batch, kv_heads * cache_len * dim]: a kv head's rows of every sequence then land in one tiled
    assemble, `batch` rows at the column of (head, at), rather than one untiled write a sequence."""

    def __init__(self, q_out, key_cache, value_cache, at, heads, dim, cache_len, rows):
        self.q_out, self.key_cache, self.value_cache, self.at = q_out, key_cache, value_cache, at
        (self.q_heads, self.k_heads), self.dim, self.cache_len, self.rows = heads, dim, cache_len, rows

    def _column(self, kv_head):
        return (kv_head * self.cache_len + self.at) * self.dim

    def v(self, v):
        pypto, dim = runtime.pypto_module(), self.dim
        for kv_head in range(self.k_heads):
            head = pypto.view(v, [self.rows, dim], [0, kv_head * dim])
            pypto.assemble(head, [0, self._column(kv_head)], self.value_cache)

    def head(self, head, out1, out2):
        pypto, dim = runtime.pypto_module(), self.dim
        if head < self.q_heads:
            pypto.assemble(out1, [0, head * dim], self.q_out)
            pypto.assemble(out2, [0, head * dim + dim // 2], self.q_out)
            return
        column = self._column(head - self.q_heads)
        pypto.assemble(out1, [0, column], self.key_cache)
        pypto.assemble(out2, [0, column + dim // 2], self.key_cache)


def _build_attention_prologue_cached(
    rows,
    hidden,
    q_heads,
    k_heads,
    dim,
    cache_len,
    dtype,
    table_dtype,
    eps,
    config,
    device_type,
    advance=False,
):
    """attention_prologue's kernel for a decode step, one row a sequence (`rows` sequences, one kernel per
    batch size), that writes its k and v rows straight into a static KV cache instead of outputs:
    key_cache / value_cache [rows, kv_heads * cache_len * dim] (the batch's [rows, kv_heads, cache_len, dim]
    cache, one flat row a sequence), every sequence at the position position[0, 0] (int32, read inside the
    kernel: the low word of transformers' int64 position, one for the whole batch); q out as before. The
    cache write transformers makes next (two index_copy_ launches) is then done. With `advance` the kernel
    also writes position + 1 into `length` (the caller passes the position itself: transformers 5.8+'s
    StaticLayer counts its own length and advances it after each write, one more launch otherwise);
    without, `length` is left as it is. All rows are one tile (rows <= DECODE_MAX_ROWS)."""
    pypto = runtime.pypto_module()
    dt, tdt = runtime.pypto_dtype(dtype), runtime.pypto_dtype(table_dtype)
    q_width, kv_width, cache_width = q_heads * dim, k_heads * dim, k_heads * cache_len * dim
    m, proj_k, proj_n, norm_rows = _block_tiles(config)
    norm_rows = min(norm_rows, rows)
    epilogue = _prologue_epilogue(hidden, (q_heads, k_heads), dim, eps, norm_rows, config, dt)

    @runtime.jit(device_type, config)
    def attention_prologue_cached_kernel(
        x: pypto.Tensor([rows, hidden], dt),
        q_w: pypto.Tensor([q_width, hidden], dt),
        q_b: pypto.Tensor([1, q_width], dt),
        k_w: pypto.Tensor([kv_width, hidden], dt),
        k_b: pypto.Tensor([1, kv_width], dt),
        v_w: pypto.Tensor([kv_width, hidden], dt),
        v_b: pypto.Tensor([1, kv_width], dt),
        cos: pypto.Tensor([rows, dim], tdt),
        sin: pypto.Tensor([rows, dim], tdt),
        position: pypto.Tensor([1, 2], pypto.DT_INT32),
        key_cache: pypto.Tensor([rows, cache_width], dt),
        value_cache: pypto.Tensor([rows, cache_width], dt),
        q_out: pypto.Tensor([rows, q_width], dt),
        length: pypto.Tensor([1, 2], pypto.DT_INT32),
    ):
        for _ in pypto.loop(1):
            at = position[0, 0]
            xt = pypto.view(x, [rows, hidden], [0, 0])
            pypto.set_cube_tile_shapes(m, proj_k, proj_n)
            writer = _ToCache(q_out, key_cache, value_cache, at, (q_heads, k_heads), dim, cache_len, rows)
            epilogue(xt, (q_w, k_w, v_w), (q_b, k_b, v_b), (cos, sin, 0, rows, rows), writer)
            _advance_length(position, length, advance, scope=q_heads + k_heads + 2)
        pypto.set_pass_options(sg_set_scope=-1)  # a global option: leave it as found for the next kernel

    return attention_prologue_cached_kernel


def _advance_length(position, length, advance: bool, scope: int) -> None:
    """Inside the cached prologue's kernel, when `advance`: the position's low int32 word plus one, into
    `length`'s (a task of its own, beside the matmuls; the high word is left: positions fit a cache, far
    under 2**31). The rows' write position was read before any task ran, so `length` may be the position
    itself."""
    if not advance:
        return
    pypto = runtime.pypto_module()
    pypto.set_pass_options(sg_set_scope=scope)
    pypto.set_vec_tile_shapes(1, 1)
    pypto.assemble(pypto.add(pypto.view(position, [1, 1], [0, 0]), 1), [0, 0], length)


def _rms_scale(xt, hidden: int, eps: float):
    """Inside a kernel: rsqrt(mean(x^2) + eps) of a [rows, hidden] tile, [rows, 1] in fp32."""
    pypto = runtime.pypto_module()
    x32 = pypto.cast(xt, pypto.DT_FP32)
    return pypto.rsqrt(pypto.add(pypto.mul(pypto.sum(pypto.mul(x32, x32), -1, True), 1.0 / hidden), eps))


def _biased(projected, bias, dt):
    """Inside a kernel: an fp32 matmul output plus its [1, n] bias, rounded to dt (F.linear's output)."""
    pypto = runtime.pypto_module()
    return pypto.cast(pypto.add(projected, pypto.cast(bias, pypto.DT_FP32)), dt)


def _rope_epilogue(projected, scale, bias, col, cos, sin, start, tile, valid, dim, dt):
    """Inside a kernel: one head of an fp32 q or k projection tile (its columns col .. col + dim), times the
    rows' RMSNorm scale, biased and rounded as F.linear's output, then rotated with the mixed tables' rows;
    the two output halves in dt.

    One copy each of the head, its bias, cos and sin (whole head_dim rows): the halves are views of those.
    """
    pypto = runtime.pypto_module()
    fp32, half = pypto.DT_FP32, dim // 2
    head = pypto.view(projected, [tile, dim], [0, col], valid_shape=[valid, dim])
    x = pypto.cast(_biased(pypto.mul(head, scale), pypto.view(bias, [1, dim], [0, col]), dt), fp32)
    cos_t = pypto.cast(pypto.view(cos, [tile, dim], [start, 0], valid_shape=[valid, dim]), fp32)
    sin_t = pypto.cast(pypto.view(sin, [tile, dim], [start, 0], valid_shape=[valid, dim]), fp32)
    halves = [
        pypto.view(t, [tile, half], [0, c], valid_shape=[valid, half])
        for t in (x, cos_t, sin_t)
        for c in (0, half)
    ]
    x1, x2, cos1, cos2, sin1, sin2 = halves
    out1, out2 = rotated_halves(x1, x2, cos1, cos2, sin1, sin2)
    return pypto.cast(out1, dt), pypto.cast(out2, dt)


class _NormFolded:
    """Projection weights with an RMSNorm weight folded in, W * norm_weight column by column (in the
    activations' dtype), per weight tensor; made again only when the weight or the norm weight changes
    (data pointer, version counter, shape, dtype). Holds one such copy per projection while the weight
    lives: for q/k/v at GutenOCR-3B width 2048 x 2560 bf16 (10 MB) a layer.

    Keyed by the weight's id, checked against a weak reference to it (a weak-key dictionary would compare
    tensors with ==)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple] = {}
        self.builds = 0

    def get(self, weight: torch.Tensor, norm_weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        signature = WeightLayouts._signature((weight, norm_weight), dtype)
        entry = self._by_id.get(id(weight))
        if entry is not None and entry[0]() is weight and entry[1] == signature:
            return entry[2]
        folded = (
            (weight.detach().float() * norm_weight.detach().float().reshape(1, -1)).to(dtype).contiguous()
        )
        key = id(weight)

        def forget(ref, key=key):
            if self._by_id.get(key, (None,))[0] is ref:
                del self._by_id[key]

        self._by_id[key] = (weakref.ref(weight, forget), signature, folded)
        self.builds += 1
        return folded


NORM_FOLDED = _NormFolded()


def _prologue(hidden_states, norm_weight, eps, projections, cos, sin, head_dim, cache=None):
    """attention_prologue(_mixed)'s body with cos/sin section-mixed ([b, s, d] or [b, 1, s, d]). With
    `cache` (key_cache, value_cache, position, advance): the cached kernel, which writes k and v into the
    caches (and advances the position by the row with `advance`) and returns q alone."""
    if hidden_states.dim() != 3:
        raise ValueError(
            f"pypto attention_prologue takes hidden_states [b, s, hidden], not {tuple(hidden_states.shape)}"
        )
    batch, seq, hidden = hidden_states.shape
    dtype, rows = hidden_states.dtype, batch * seq
    (q_w, q_b), (k_w, k_b), (v_w, v_b) = projections
    q_width, kv_width = q_w.shape[0], k_w.shape[0]
    if q_width % head_dim or kv_width % head_dim or v_w.shape[0] != kv_width:
        raise ValueError(
            f"pypto attention_prologue: q/k/v weights {tuple(q_w.shape)} {tuple(k_w.shape)} {tuple(v_w.shape)}"
            f" are not whole heads of {head_dim}"
        )
    if cos.numel() != rows * head_dim or cos.shape != sin.shape or cos.shape[-1] != head_dim:
        raise ValueError(
            f"pypto attention_prologue: cos {tuple(cos.shape)} does not fit {rows} rows of {head_dim}"
        )
    check_half_blocks(head_dim, dtype, "pypto attention_prologue kernel")
    weights, biases = [], []
    for w, b in projections:
        weights.append(NORM_FOLDED.get(w, norm_weight, dtype))
        # a bias-free projection adds zeros (Qwen2.5-VL's q/k/v have biases)
        biases.append(
            hidden_states.new_zeros(1, w.shape[0]) if b is None else b.to(dtype).reshape(1, -1).contiguous()
        )
    x = hidden_states.reshape(rows, hidden).contiguous()
    cos2, sin2 = cos.contiguous().reshape(rows, head_dim), sin.contiguous().reshape(rows, head_dim)
    q_heads, k_heads, device_type = q_width // head_dim, kv_width // head_dim, runtime.device_type_of(x)
    _, config = tile_config("attention_prologue", rows, hidden)
    tile_budget.check(
        "attention_prologue", config, dtype.itemsize, {"q/k/v": (config.row_tile, hidden, q_width)}
    )
    shape = (hidden, q_heads, k_heads, head_dim, dtype, cos.dtype, float(eps), device_type)
    args = (x, weights[0], biases[0], weights[1], biases[1], weights[2], biases[2], cos2, sin2)
    if cache is not None:
        return (
            _prologue_into_cache(args, shape, config, cache)
            .reshape(batch, seq, q_heads, head_dim)
            .transpose(1, 2)
        )
    key = runtime.kernel_key("attention_prologue", config, rows, *shape)
    kernel = runtime.cached_kernel(
        key,
        device_type,
        lambda: _build_attention_prologue(
            rows, hidden, q_heads, k_heads, head_dim, dtype, cos.dtype, float(eps), config, device_type
        ),
    )
    q_out = runtime.new_output(x.new_empty(rows, q_width))
    k_out, v_out = (runtime.new_output(x.new_empty(rows, kv_width)) for _ in range(2))
    with runtime.launching(x):
        kernel(*args, q_out, k_out, v_out)
    return tuple(t.reshape(batch, seq, -1, head_dim).transpose(1, 2) for t in (q_out, k_out, v_out))


def _prologue_into_cache(args, shape, config, cache):
    """The cached kernel's call: one row a sequence (a decode step of `rows` sequences) into a
    [rows, kv_heads, cache_len, d] static cache at the position its int64 tensor holds (read as the low int32
    word inside the kernel), the position advanced by one in the same kernel with `advance`. q [rows, q_width]."""
    hidden, q_heads, k_heads, head_dim, dtype, table_dtype, eps, device_type = shape
    key_cache, value_cache, position, advance = cache
    x = args[0]
    rows = x.shape[0]
    if not 1 <= rows <= DECODE_MAX_ROWS:
        raise ValueError(
            f"pypto attention_prologue writes a cache for 1 to {DECODE_MAX_ROWS} rows, not {rows}"
        )
    expected = (rows, k_heads, key_cache.shape[2], head_dim)
    for name, tensor in (("key_cache", key_cache), ("value_cache", value_cache)):
        if tuple(tensor.shape) != expected or tensor.dtype != dtype or not tensor.is_contiguous():
            raise ValueError(
                f"pypto attention_prologue: {name} {tuple(tensor.shape)} {tensor.dtype} is not a contiguous"
                f" {expected} {dtype} cache"
            )
    if position.dtype != torch.int64 or position.numel() < 1 or position.device != x.device:
        raise ValueError(f"pypto attention_prologue takes an int64 cache position on {x.device}")
    cache_len = key_cache.shape[2]
    # int64 positions are little-endian on every host and device pypto runs on: the low word comes first
    at = position.reshape(-1)[:1].view(torch.int32).reshape(1, 2)
    advance = bool(advance)
    # one kernel per batch size (its rows are one static tile), whatever the config's row axis
    key = ("attention_prologue_cached", rows, config, *shape, cache_len, advance)
    kernel = runtime.cached_kernel(
        key,
        device_type,
        lambda: _build_attention_prologue_cached(
            rows,
            hidden,
            q_heads,
            k_heads,
            head_dim,
            cache_len,
            dtype,
            table_dtype,
            eps,
            config,
            device_type,
            advance,
        ),
    )
    q_out = runtime.new_output(x.new_empty(rows, q_heads * head_dim))
    cache_width = k_heads * cache_len * head_dim
    flat = (key_cache.view(rows, cache_width), value_cache.view(rows, cache_width))
    with runtime.launching(x):
        kernel(*args, at, *flat, q_out, at)  # `length` is the position: advanced in place when asked
    return q_out


def _mixed_tables(hidden_states, cos, sin, mrope_section, head_dim):
    """cos/sin [3, b, s, head_dim] section-mixed in torch once per forward (the fused backend's table cache,
    shared by every layer); ValueError when the sections or the tables do not fit."""
    sections = tuple(int(s) for s in mrope_section)
    expected = (3, hidden_states.shape[0], hidden_states.shape[1], head_dim)
    if sum(sections) * 2 != head_dim or tuple(cos.shape) != expected or cos.shape != sin.shape:
        raise ValueError(
            f"mrope_section {list(sections)} / cos {tuple(cos.shape)} do not fit head_dim {head_dim}"
            f" and hidden_states {tuple(hidden_states.shape)}"
        )
    return fused.MIXED_TABLES.get(cos, sin, sections, 1)[:2]


def attention_prologue(
    hidden_states,
    norm_weight,
    eps,
    q_weight,
    q_bias,
    k_weight,
    k_bias,
    v_weight,
    v_bias,
    cos,
    sin,
    mrope_section,
    head_dim,
):
    """One kernel: the input RMSNorm, the q/k/v projections with their biases and MRoPE on q and k.

    cos/sin [3, b, s, head_dim] are section-mixed outside the kernel, in torch, once per forward (the
    fused backend's table cache, shared by every layer), as the MRoPE entry does."""
    mixed_cos, mixed_sin = _mixed_tables(hidden_states, cos, sin, mrope_section, head_dim)
    projections = ((q_weight, q_bias), (k_weight, k_bias), (v_weight, v_bias))
    return _prologue(hidden_states, norm_weight, eps, projections, mixed_cos, mixed_sin, head_dim)


def attention_prologue_mixed(
    hidden_states, norm_weight, eps, q_weight, q_bias, k_weight, k_bias, v_weight, v_bias, cos, sin, head_dim
):
    """attention_prologue with cos/sin already section-mixed, [b, s, head_dim]: one kernel."""
    projections = ((q_weight, q_bias), (k_weight, k_bias), (v_weight, v_bias))
    return _prologue(hidden_states, norm_weight, eps, projections, cos, sin, head_dim)


def attention_prologue_cached(*args):
    """attention_prologue (reference.attention_prologue_cached's arguments) that also writes k and v into a
    static cache at the given position and, with `advance`, advances the position by the row, in the same
    kernel: q. The kernel writes one row a sequence at up to DECODE_MAX_ROWS sequences; a larger batch runs
    the prologue's kernel, then the writes (and the advance, once) as transformers makes them."""
    *prologue_args, key_cache, value_cache, position, advance = args
    (x, norm_w, eps, q_w, q_b, k_w, k_b, v_w, v_b, cos, sin, mrope_section, head_dim) = prologue_args
    if x.shape[0] > DECODE_MAX_ROWS:  # past the decode tiling: the prologue's kernel, then torch's writes
        return reference.prologue_cached(attention_prologue, args)
    mixed_cos, mixed_sin = _mixed_tables(x, cos, sin, mrope_section, head_dim)
    projections = ((q_w, q_b), (k_w, k_b), (v_w, v_b))
    cache = (key_cache, value_cache, position, advance)
    return _prologue(x, norm_w, eps, projections, mixed_cos, mixed_sin, head_dim, cache)


def attention_prologue_mixed_cached(*args):
    """attention_prologue_cached with cos/sin already section-mixed, [b, s, head_dim]: one kernel (up to
    DECODE_MAX_ROWS sequences)."""
    *prologue_args, key_cache, value_cache, position, advance = args
    (x, norm_w, eps, q_w, q_b, k_w, k_b, v_w, v_b, cos, sin, head_dim) = prologue_args
    if x.shape[0] > DECODE_MAX_ROWS:
        return reference.prologue_cached(attention_prologue_mixed, args)
    projections = ((q_w, q_b), (k_w, k_b), (v_w, v_b))
    cache = (key_cache, value_cache, position, advance)
    return _prologue(x, norm_w, eps, projections, cos, sin, head_dim, cache)
