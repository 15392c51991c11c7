"""The attention core at decode as a PyPTO 0.2 flash-decode kernel: the context split into chunks spread
over the AI cores, each chunk's softmax partials (row max, row sum, unnormalised P @ V) merged online.

    query [b, q_heads, s, d], caches [b, kv_heads, cache_len, d] (the static cache), kv_lens [b]
    -> [b, s, q_heads * d]

Rows: the q heads that share a kv head (GQA: q head h reads kv head h // group, as transformers'
repeat_kv) and the s new positions are one matmul's rows, M = group x s, so each kv chunk is read once
for the whole group. Per (sequence, kv head, chunk), each stage in one or more tasks: S = Q K^T (fp32),
masked and scaled; m = rowmax(S), P = exp(S - m), l = rowsum(P); A = P @ V (P rounded to the activations'
dtype, as flash attention does). Then per (sequence, kv head): m* = max_c m_c, w_c = exp(m_c - m*),
out = sum_c w_c A_c / sum_c w_c l_c. The softmax is fp32 throughout. A cache of one chunk (up to the
table's kv_chunk positions) needs no merge: its P is normalised in the softmax task and its P @ V is the
output, three stages instead of four.

The schedule (`schedule`): the chunk width, and how many tasks a (kv head, chunk)'s scores and P @ V take,
chosen per batch x kv heads and cache length so that a stage fits one wave of the cube cores. In PyPTO's
cost model a task's every copy from global memory waits ~1,400 cycles however little it moves, and the
AICPU schedulers poll their cores in turn (240 cycles a core, 12 cores each), so a task's successor starts
3,000 - 8,000 cycles after it ends: fewer, wider tasks and one root function (loop iteration) per
(sequence, chunk) for all its kv heads, rather than one each, is what brought the span down
(docs/graph-decode.md, "By batch").

The mask comes in as an additive bias, fp32 [batch * bias_rows, cache_len], made in torch once per forward
and shared by every layer (`_Constants.bias`; inside a device-graph capture it is recorded once, in the first
layer, and every replay remakes it): row i of sequence b sees positions kv_starts[b] <= j < kv_starts[b] +
kv_lens[b] - s + i + 1 (left padding before the start; the new rows are the last s valid positions, causal
among themselves), one bias row per sequence when s is 1 (the
group's q heads share it), group x s rows otherwise. Masked scores get -1e30 times how far past the limit
they are (before the start: how far before), so a chunk with no visible position has m_c ~ -1e30 and weight 0 in the merge (every row sees at
least its own position). The kernel reads the bias once per chunk and task, where making the mask inside
it cost the softmax task two more copies from global memory (the lengths and the positions), ~1,400
cycles each in the cost model. Over several chunks the kernel runs only the chunks each sequence's range
touches (`chunk_spans`: loop bounds read from an int32 tensor inside the kernel); the merge finds the
others' neutral partials in the scratch. A cache of one chunk is read whole.
"""

# No `from __future__ import annotations`: pypto reads the kernels' annotations as objects.
import configparser
import functools
import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..tiling import tile_budget
from ..tiling.tile_table import DECODE_MAX_ROWS, TileConfig, attention_core_config
from . import decode_lengths, reference
from . import pypto_runtime as runtime

MASKED = 1e30  # a masked score gets -MASKED per position past its row's limit: exp() of it is 0
BLOCK = 16  # cube fractal: chunk widths and tiles are whole blocks
ML_BLOCK = 8  # fp32 values in 32 bytes: each chunk's row maximum and row sum own one block of the scratch


def _align(value: int, to: int) -> int:
    return -(-value // to) * to


@dataclass(frozen=True)
class Schedule:
    """How the kernel spreads a call over the AI cores: cache positions per chunk, cache positions per scores
    task (a chunk's scores in chunk / scores_n cube tasks) and output columns per P @ V task."""

    chunk: int
    scores_n: int
    pv_n: int


# kv heads (batch x the model's kv heads) from which a chunk is twice the table's: the work is spread over
# the cores by the heads already, and fewer, longer chunks mean fewer tasks and a shorter merge. Cost model,
# 1 new row, 16 q / 2 kv heads of 128, every position used (us, the table's 1,024 vs 2,048 positions a
# chunk): 4,096 positions batch 1 25.86 vs 29.34; batch 4 84.29 vs 54.18; batch 8 142.10 vs 102.54;
# batch 16 251.17 vs 175.61; 2,048 positions batch 8 87.96 vs 36.03. Batch 2 (4 kv heads) not measured.
# (Measured before `schedule`'s splits, the root per (sequence, chunk) and the root pool.)
WIDE_CHUNK_HEADS = 8


@functools.cache
def cube_cores() -> int:
    """The chip's cube cores as PyPTO's cost model configures a 910B (lib/configs/A2A3.ini, [SoCInfo]
    cube_core_cnt: 24); 24 where pypto or its config is not installed."""
    spec = importlib.util.find_spec("pypto")
    ini = configparser.ConfigParser(strict=False, interpolation=None)
    if spec is not None and spec.origin:
        ini.read(Path(spec.origin).parent / "lib" / "configs" / "A2A3.ini")
    return ini.getint("SoCInfo", "cube_core_cnt", fallback=24)


def schedule(config: TileConfig, cache_len: int, heads: int = 1, dim: int = 128) -> Schedule:
    """The chunk width (the table's, twice it from WIDE_CHUNK_HEADS kv heads of work, or the whole
    block-aligned cache when it is shorter), then each (kv head, chunk)'s scores and P @ V split into as many
    tasks as keep a stage within one wave of the cube cores: split = the largest power of two <= cube cores /
    (kv heads x chunks), never below the table's tiles (cube_n, down_cube_n). Cost model, 16 q / 2 kv heads
    of 128, every position used, us (the table's fixed tiles -> split; both with runtime_options):
    1,024 positions batch 1 (split 8) 15.74 -> 15.74, batch 2 (4) 22.61 -> 16.48, batch 4 (2) 28.46 ->
    19.03 (18.94 unsplit), batch 8 (1) 34.12 -> 22.04, batch 16 (1) 58.59 -> 30.01; 4,096 positions
    batch 1 (2) 25.23 -> 25.23 (one task a chunk 27.02), batch 4 (1) 41.63 -> 36.31, batch 8 (1) 61.74 ->
    45.73, batch 16 (1) 110.04 -> 73.23."""
    whole = _align(cache_len, BLOCK)
    chunk = min(config.kv_chunk * (2 if heads >= WIDE_CHUNK_HEADS else 1), whole)
    work = heads * -(-cache_len // chunk)
    split = 1 << (max(1, cube_cores() // work).bit_length() - 1)
    scores_n = min(chunk, max(config.cube_n[0], _align(chunk // split, BLOCK)))
    pv_n = min(dim, max(config.down_cube_n[0], dim // split))
    return Schedule(chunk, scores_n, pv_n)


def chunk_width(config: TileConfig, cache_len: int, heads: int = 1) -> int:
    """Cache positions per chunk (`schedule`)."""
    return schedule(config, cache_len, heads).chunk


def _tiles(config: TileConfig, plan: Schedule, dim: int):
    """(scores k, scores n, P @ V k, P @ V n) cube tiles, clipped to the chunk and head widths: the scores
    tile plan.scores_n wide and the P @ V tile plan.pv_n (L0 = L1: one task each); the scores' k tiles
    shrink to keep L0B (n x k0) and L1 ((16 + n) x k1) within the chip's buffers (tile_budget.A2A3)."""
    chunk, n = plan.chunk, plan.scores_n
    chip = tile_budget.A2A3
    k0 = max(BLOCK, min(config.cube_k[0], dim, chip.l0b // (2 * _align(n, BLOCK)) // BLOCK * BLOCK))
    k1 = min(config.cube_k[1], dim)
    while k1 > k0 and (BLOCK + _align(n, BLOCK)) * k1 * 2 > chip.l1:
        k1 //= 2
    qk_k, qk_n = [k0, max(k0, k1 // k0 * k0)], [n, n]
    pv_k = [min(config.down_cube_k[0], chunk), min(config.down_cube_k[1], chunk)]
    pv_n = [min(plan.pv_n, dim), min(plan.pv_n, dim)]
    return qk_k, qk_n, pv_k, pv_n


def runtime_options(batch: int, chunks: int) -> dict:
    """pypto runtime options for the kernel: a root-function pool (stitch_function_inner_memory, pypto's
    default 10) that holds every root the kernel can have in flight: one per (sequence, chunk) and the merge.
    At pypto's 10, roots past the tenth wait for earlier ones to end: cost model, batch 8 over 4,096
    positions (33 roots), 102.54 us at 10, 69.30 at 20, 60.65 at 40, 100 and 1,000; batch 16 175.61 vs
    109.62 at 100; batch 1 (9 roots) unchanged."""
    return {"stitch_function_inner_memory": max(10, batch * chunks + 1)}


def _build_attention_core(
    batch, kv_heads, group, new_rows, cache_len, dim, dtype, scale, config, device_type
):
    """rows = group x s (a kv head's query rows); q and out [batch*kv_heads*rows, dim], caches
    [batch*kv_heads*cache_len, dim], bias [batch * bias_rows(s, group), cache_len] fp32 (the mask, see the
    module docstring); two fp32 scratch tensors hold the chunks' partials: (m, l) [.., 2 * padded chunk
    count] and A [.., chunks * dim]."""
    pypto = runtime.pypto_module()
    dt, fp32 = runtime.pypto_dtype(dtype), pypto.DT_FP32
    rows = group * new_rows
    heads = batch * kv_heads
    plan = schedule(config, cache_len, heads, dim)
    chunk = plan.chunk
    chunks = -(-cache_len // chunk)
    m = [config.cube_m, config.cube_m]
    qk_k, qk_n, pv_k, pv_n = _tiles(config, plan, dim)
    vec_rows = min(rows, config.norm_rows or rows)
    masks = bias_rows(new_rows, group)

    tail = cache_len % chunk  # the last chunk's width when it is shorter than the others (0: none)

    def one_chunk(q, k, v, bias_in, out, head, c, width):
        """Chunk c (a Python int or a loop's index) of `head`: its partials, or the output for a cache of
        one chunk."""
        row, seq = head * rows, head // kv_heads
        first = key_row(head, kv_heads, heads, cache_len) + c * chunk
        qt = pypto.view(q, [rows, dim], [row, 0])
        kt = pypto.view(k, [width, dim], [first, 0])
        vt = pypto.view(v, [width, dim], [first, 0])
        pypto.set_cube_tile_shapes(m, qk_k, qk_n)
        scores = pypto.matmul(qt, kt, fp32, b_trans=True)
        pypto.set_vec_tile_shapes(vec_rows, chunk)
        bias = pypto.view(bias_in, [masks, width], [seq * masks, c * chunk])  # [1, w]: broadcast
        scores = pypto.add(pypto.mul(scores, scale), bias)
        top = pypto.amax(scores, -1, True)
        p = pypto.exp(pypto.sub(scores, top))
        if chunks == 1:  # the whole cache in one chunk: P normalised here, P @ V is the output
            p = pypto.div(p, pypto.sum(p, -1, True))
            pypto.set_cube_tile_shapes(m, pv_k, pv_n)
            pypto.assemble(pypto.matmul(pypto.cast(p, dt), vt, dt), [row, 0], out)
            return
        return top, pypto.sum(p, -1, True), p, vt

    def chunk_partials(q, k, v, bias_in, spans, ml_buf, acc_buf, out):
        if chunks == 1:
            for head in range(heads):
                one_chunk(q, k, v, bias_in, out, head, 0, cache_len)
            return
        for seq in range(batch):
            # only the chunks the sequence's range touches (spans: read from the int32 tensor in the
            # kernel); the others' slots keep the neutral partials the scratch was made with. One loop
            # iteration (a root function) runs a chunk of every kv head of the sequence.
            loops = [(spans[seq, 0], spans[seq, 1], chunk)]
            if tail:
                loops.append((spans[seq, 2], spans[seq, 3], tail))
            for start, stop, width in loops:
                for c in pypto.loop(start, stop):
                    for head in range(seq * kv_heads, (seq + 1) * kv_heads):
                        row = head * rows
                        top, total, p, vt = one_chunk(q, k, v, bias_in, out, head, c, width)
                        pypto.assemble(top, [row, top_column(c)], ml_buf)
                        pypto.assemble(total, [row, sum_column(c, chunks)], ml_buf)
                        pypto.set_cube_tile_shapes(m, pv_k, pv_n)
                        pv = pypto.matmul(pypto.cast(p, dt), vt, fp32)
                        pypto.assemble(pv, [row, c * dim], acc_buf)

    def merged(out, ml_buf, acc_buf):
        for head in range(heads):
            row = head * rows
            pypto.set_vec_tile_shapes(vec_rows, ML_BLOCK * 2 * chunks)
            # one copy each (an op reads the whole tile; views of its result at whole 32-byte blocks are
            # local, where a view of one column inside a block went out to global memory and back, a
            # ~1,400-cycle copy per chunk): (m, l), then A
            ml = pypto.add(pypto.view(ml_buf, [rows, ML_BLOCK * 2 * chunks], [row, 0]), 0.0)
            tops = [pypto.view(ml, [rows, 1], [0, top_column(c)]) for c in range(chunks)]
            sums = [pypto.view(ml, [rows, 1], [0, sum_column(c, chunks)]) for c in range(chunks)]
            weights = _chunk_weights(tops)
            pypto.set_vec_tile_shapes(vec_rows, chunks * dim)  # one tile: every chunk's A in one copy
            acc = pypto.add(pypto.view(acc_buf, [rows, chunks * dim], [row, 0]), 0.0)
            summed, total = None, None
            for c in range(chunks):
                term = pypto.mul(pypto.view(acc, [rows, dim], [0, c * dim]), weights[c])
                part = pypto.mul(weights[c], sums[c])
                summed = term if summed is None else pypto.add(summed, term)
                total = part if total is None else pypto.add(total, part)
            pypto.assemble(pypto.cast(pypto.div(summed, total), dt), [row, 0], out)

    @runtime.jit(device_type, config, runtime_options(batch, chunks))
    def attention_core_kernel(
        q: pypto.Tensor([heads * rows, dim], dt),
        k: pypto.Tensor([heads * cache_len, dim], dt),
        v: pypto.Tensor([heads * cache_len, dim], dt),
        bias_in: pypto.Tensor([batch * masks, cache_len], fp32),
        spans: pypto.Tensor([batch, 4], pypto.DT_INT32),
        out: pypto.Tensor([heads * rows, dim], dt),
        ml_buf: pypto.Tensor([heads * rows, ML_BLOCK * 2 * chunks], fp32),
        acc_buf: pypto.Tensor([heads * rows, chunks * dim], fp32),
    ):
        pypto.set_vec_tile_shapes(vec_rows, chunk)
        # two stages, each its own function: a scratch tensor written and read in one would be a cycle
        for _ in pypto.loop(1):
            chunk_partials(q, k, v, bias_in, spans, ml_buf, acc_buf, out)
        if chunks > 1:
            for _ in pypto.loop(1):
                merged(out, ml_buf, acc_buf)

    return attention_core_kernel


def key_row(head: int, kv_heads: int, heads: int, cache_len: int) -> int:
    """Inside a kernel: the first row of `head`'s keys and values in the flattened caches (head = sequence x
    kv_heads + kv head)."""
    return head * cache_len


def chunk_spans(kv_starts: torch.Tensor, kv_lens: torch.Tensor, chunk: int, cache_len: int) -> torch.Tensor:
    """[batch, 4] int32: the chunks each sequence's range [start, start + length) touches, as two loops'
    (first, stop): the whole chunks' (indices < cache_len // chunk), then the shorter last chunk's ((n, n)
    or (n, n + 1) with n = cache_len // chunk; (n, n) when there is none)."""
    whole = cache_len // chunk
    first = kv_starts.to(torch.int64) // chunk
    last = (kv_starts.to(torch.int64) + kv_lens.to(torch.int64) - 1).clamp_min(0) // chunk
    stop = torch.minimum(last + 1, torch.full_like(last, whole))
    start = torch.minimum(first, stop)
    tail_stop = torch.full_like(last, whole) + (last >= whole).to(torch.int64) * int(cache_len % chunk > 0)
    tail = torch.full_like(last, whole)
    return torch.stack((start, stop, tail, tail_stop), -1).to(torch.int32)


def neutral_partials(rows: int, chunks: int, dim: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk scratch (m, l) and A as the merge finds a chunk the kernel skipped: m = -MASKED (weight
    exp(-MASKED - m*) = 0), l = 0, A = 0."""
    ml = torch.zeros(rows, ML_BLOCK * 2 * chunks, dtype=torch.float32, device=device)
    ml[:, : ML_BLOCK * chunks] = -MASKED
    return ml, torch.zeros(rows, chunks * dim, dtype=torch.float32, device=device)


def bias_rows(new_rows: int, group: int) -> int:
    """Rows of the mask bias per sequence: 1 for one new row (its q heads share a limit), else group x s."""
    return 1 if new_rows == 1 else group * new_rows


def _chunk_weights(tops: list) -> list:
    """Inside a kernel: each chunk's weight in the merge, exp(m_c - max_c m_c), from the chunks' row maxima
    (one [rows, 1] tensor a chunk)."""
    pypto = runtime.pypto_module()
    top = tops[0]
    for other in tops[1:]:
        top = pypto.maximum(top, other)
    return [pypto.exp(pypto.sub(t, top)) for t in tops]


def top_column(c: int) -> int:
    """Column of chunk c's row maximum in the (m, l) scratch: each value in a 32-byte block of its own."""
    return ML_BLOCK * c


def sum_column(c: int, chunks: int) -> int:
    """Column of chunk c's row sum in the (m, l) scratch, after every chunk's maximum."""
    return ML_BLOCK * (chunks + c)


def chunk_tops(ml: torch.Tensor, chunks: int) -> torch.Tensor:
    """The chunks' row maxima [rows, chunks] from an (m, l) scratch (for inspection: the tests)."""
    return ml[:, : ML_BLOCK * chunks : ML_BLOCK]


class _Constants:
    """What the kernel takes besides the model's tensors, made once while the same lengths come back (every
    layer of a forward passes one lengths tensor: decode_lengths, which makes a new one each forward): the
    mask bias, the chunk spans, and the chunk scratch with its neutral partials (every layer of a forward
    writes the same chunks' slots; the others stay neutral). A lengths tensor changed in place is seen by
    its version counter, which an inference-mode tensor lacks: a caller that changes one in place under
    torch.inference_mode must pass a new tensor instead."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._held: tuple | None = None  # the lengths kept alive, so their id is never reused meanwhile
        self._made: dict = {}
        self.builds = 0  # mask biases made

    def _lengths_key(self, kv_lens, kv_starts) -> tuple:
        key = (id(kv_lens), decode_lengths.version_of(kv_lens), tuple(kv_lens.shape), MASKED)
        return key + (None if kv_starts is None else (id(kv_starts), decode_lengths.version_of(kv_starts)),)

    def _get(self, kv_lens, kv_starts, what: tuple, make):
        key = self._lengths_key(kv_lens, kv_starts)
        if key != self._key:
            self._key, self._held, self._made = key, (kv_lens, kv_starts), {}
        if what not in self._made:
            self._made[what] = make()
        return self._made[what]

    def bias(
        self, kv_lens: torch.Tensor, group: int, new_rows: int, cache_len: int, kv_starts=None
    ) -> torch.Tensor:
        def make():
            self.builds += 1
            return mask_bias(kv_lens, group, new_rows, cache_len, kv_starts)

        return self._get(kv_lens, kv_starts, ("bias", group, new_rows, cache_len), make)

    def spans(self, kv_lens: torch.Tensor, chunk: int, cache_len: int, kv_starts=None) -> torch.Tensor:
        def make():
            starts = torch.zeros_like(kv_lens) if kv_starts is None else kv_starts
            return chunk_spans(starts, kv_lens, chunk, cache_len)

        return self._get(kv_lens, kv_starts, ("spans", chunk, cache_len), make)

    def scratch(self, kv_lens, kv_starts, rows: int, chunks: int, dim: int, device) -> tuple:
        what = ("scratch", rows, chunks, dim, str(device))
        return self._get(kv_lens, kv_starts, what, lambda: neutral_partials(rows, chunks, dim, device))


def mask_bias(
    kv_lens: torch.Tensor, group: int, new_rows: int, cache_len: int, kv_starts: torch.Tensor | None = None
) -> torch.Tensor:
    """[batch * bias_rows, cache_len] fp32: 0 where a row sees the position, -MASKED x (how far outside its
    range) where it does not; row (g, i) of sequence b sees positions kv_starts[b] <= j < kv_starts[b] +
    kv_lens[b] - s + i + 1 (kv_starts 0 when not given: no left padding)."""
    device = kv_lens.device
    first = torch.zeros_like(kv_lens) if kv_starts is None else kv_starts.to(kv_lens.dtype)
    first = first.to(torch.float32).reshape(-1, 1, 1)
    offsets = 1 - new_rows + torch.arange(new_rows, dtype=torch.float32, device=device)
    offsets = offsets.repeat(bias_rows(new_rows, group) // new_rows)  # rows ordered (q head, position)
    limits = first + kv_lens.to(torch.float32).reshape(-1, 1, 1) + offsets.reshape(1, -1, 1)
    positions = torch.arange(cache_len, dtype=torch.float32, device=device).reshape(1, 1, -1)
    past = (positions - limits + 1.0).clamp_min(0.0) + (first - positions).clamp_min(0.0)  # 0: visible
    return (past * -MASKED).reshape(-1, cache_len)


CONSTANTS = _Constants()


def attention_core(query, key_cache, value_cache, kv_lens, scale, kv_starts=None):
    """One kernel: the decode rows' attention over the static cache (see the module docstring)."""
    reference.check_attention_core(query, key_cache, value_cache, kv_lens, kv_starts)
    batch, q_heads, seq, dim = query.shape
    kv_heads, cache_len = key_cache.shape[1], key_cache.shape[2]
    if seq > DECODE_MAX_ROWS:
        raise ValueError(
            f"pypto attention_core is a decode kernel: at most {DECODE_MAX_ROWS} rows, not {seq}"
        )
    dtype, group = query.dtype, q_heads // kv_heads
    rows, device_type = group * seq, runtime.device_type_of(query)
    _, config = attention_core_config(seq, dim, cache_len)
    plan = schedule(config, cache_len, batch * kv_heads, dim)
    chunk = plan.chunk
    qk_k, qk_n, _, _ = _tiles(config, plan, dim)  # the scores tiles the kernel sets, checked as it runs them
    tiles = replace(config, cube_k=tuple(qk_k), cube_n=tuple(qk_n))
    tile_budget.check(
        "attention_core", tiles, dtype.itemsize, {"scores": (rows, dim, chunk), "P @ V": (rows, chunk, dim)}
    )
    key = runtime.kernel_key("attention_core", config, seq, batch, kv_heads, group, cache_len, dim, dtype)
    key += (float(scale), device_type)
    kernel = runtime.cached_kernel(
        key,
        device_type,
        lambda: _build_attention_core(
            batch, kv_heads, group, seq, cache_len, dim, dtype, float(scale), config, device_type
        ),
    )
    # [b, h, s, d] -> [b, kv_heads, group * s, d]: a kv head's q heads and positions as one matrix's rows
    q = query.contiguous().reshape(batch * kv_heads * rows, dim)
    k = key_cache.to(dtype).contiguous().reshape(-1, dim)
    v = value_cache.to(dtype).contiguous().reshape(-1, dim)
    bias = CONSTANTS.bias(kv_lens, group, seq, cache_len, kv_starts)
    spans = CONSTANTS.spans(kv_lens, chunk, cache_len, kv_starts)
    chunks = -(-cache_len // chunk)
    out = runtime.new_output(q)
    ml_buf, acc_buf = CONSTANTS.scratch(kv_lens, kv_starts, q.shape[0], chunks, dim, q.device)
    with runtime.launching(q):
        kernel(q, k, v, bias, spans, out, ml_buf, acc_buf)
    # rows (kv head, q head in group, position) -> [b, s, q_heads * d]
    out = out.reshape(batch, q_heads, seq, dim).transpose(1, 2)
    return out.reshape(batch, seq, q_heads * dim)


def attention_core_masked(query, key_cache, value_cache, attention_mask, scale):
    """attention_core with each sequence's range read from the model's attention mask, once per forward."""
    kv_starts, kv_lens = decode_lengths.LENGTHS.get(attention_mask, key_cache)
    return attention_core(query, key_cache, value_cache, kv_lens, scale, kv_starts)
