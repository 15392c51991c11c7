"""The attention core op (decode over a static KV cache) on the backends that run here, against a float64
reference written in golden_cases (a loop over sequences, heads and rows, not the package's math); its
contract, its custom op under torch.compile, and the stand-in torch_npu op the npu backend calls."""

import sys

import golden_cases as gc
import pto_kernels
import pytest
import stand_in_torch_npu
import torch
from pto_kernels.backends import fused, npu, reference

CASES = gc.load("attention_core")
HALF_CASES = [c for c in CASES if c["dtype"] != "float32"]  # npu_fused_infer_attention_score: fp16 / bf16


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setenv("PTO_KERNELS_STRICT", "1")
    module = stand_in_torch_npu.make_module()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return module


def _run(backend: str, inputs):
    with pto_kernels.enabled(["attention_core"], backend=backend):
        out = pto_kernels.attention_core_wrapper(*inputs)
    stats = pto_kernels.stats()["attention_core"]
    assert stats["backend"] == backend and stats["fallbacks"] == 0 and stats["calls"] == 1, stats
    return out


@pytest.mark.parametrize("backend", ["torch", "fused"])
@pytest.mark.parametrize("case", CASES, ids=gc.ids(CASES))
def test_attention_core_golden(case, backend, monkeypatch):
    monkeypatch.setenv("PTO_KERNELS_STRICT", "1")
    inputs = gc.attention_core_inputs(case)
    out = _run(backend, inputs)
    dtype = inputs[0].dtype
    assert out.dtype == dtype
    tol = gc.MODEL_ROUNDED_SCORES_TOL[dtype] if backend == "torch" else None
    gc.check_close(out, gc.attention_core_expected(*inputs), dtype, f"{backend} {case['id']}", tol)


@pytest.mark.parametrize("case", HALF_CASES, ids=gc.ids(HALF_CASES))
def test_attention_core_golden_npu_stand_in(case, stand_in):
    inputs = gc.attention_core_inputs(case)
    out = _run("npu", inputs)
    assert stand_in.calls["npu_fused_infer_attention_score"] == 1
    gc.check_close(out, gc.attention_core_expected(*inputs), inputs[0].dtype, f"npu {case['id']}")


def test_the_golden_cases_catch_a_core_that_misreads_the_lengths():
    """One position short, or the whole static cache read: each must fail the check (the cache's unused
    tail holds noise, so ignoring kv_lens cannot pass)."""
    case = next(c for c in CASES if c["id"] == "gutenocr-batch3-lengths-bf16")
    query, keys, values, kv_lens, scale = gc.attention_core_inputs(case)
    expected = gc.attention_core_expected(query, keys, values, kv_lens, scale)
    for wrong in (kv_lens - 1, torch.full_like(kv_lens, keys.shape[2])):
        with pytest.raises(AssertionError, match="relative error"):
            gc.check_close(fused.attention_core(query, keys, values, wrong, scale), expected, query.dtype)


def test_rows_are_causal_among_themselves():
    """Row i of s new rows must not see the rows after it: a core that lets every row see all s fails."""
    case = next(c for c in CASES if c["id"] == "gutenocr-4rows-causal-fp16")
    query, keys, values, kv_lens, scale = gc.attention_core_inputs(case)
    expected = gc.attention_core_expected(query, keys, values, kv_lens, scale)
    all_rows = torch.cat(
        [fused.attention_core(query[:, :, i : i + 1], keys, values, kv_lens, scale) for i in range(4)], dim=1
    )
    with pytest.raises(AssertionError, match="relative error"):
        gc.check_close(all_rows, expected, query.dtype)


def test_the_custom_op_is_one_node_under_compile(monkeypatch):
    monkeypatch.setenv("PTO_KERNELS_STRICT", "1")
    inputs = gc.attention_core_inputs(CASES[3])
    graphs = []

    def count(gm, _):
        graphs.append(gm)
        return gm

    with pto_kernels.enabled(["attention_core"], backend="fused"):
        compiled = torch.compile(
            lambda q, k, v, n: pto_kernels.attention_core_wrapper(q, k, v, n, inputs[4]),
            fullgraph=True,
            backend=count,
        )
        out = compiled(*inputs[:4])
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert targets.count("pto_kernels.attention_core.default") == 1, targets
    gc.check_close(out, gc.attention_core_expected(*inputs), inputs[0].dtype)


@pytest.mark.parametrize("backend", ["torch", "fused"])
def test_the_op_passes_opcheck(backend):
    """The fake (the reference on fake tensors) against the body: schema, shapes, dtypes, strides."""
    from test_kernels_ops import fake_layout_mismatches

    pto_kernels.enable(ops=["attention_core"], backend=backend)
    args = gc.attention_core_inputs(CASES[4])
    op = torch.ops.pto_kernels.attention_core.default
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
    assert fake_layout_mismatches(op, args) == []
    query, keys, values, kv_lens, scale = args
    masked = torch.ops.pto_kernels.attention_core_masked.default
    for mask in (
        None,
        _masks(int(kv_lens.min()), keys.shape[2], query.shape[2])[0].expand(keys.shape[0], -1, -1, -1),
    ):
        masked_args = (query, keys, values, mask, scale)
        torch.library.opcheck(masked, masked_args, test_utils=("test_schema", "test_faketensor"))
        assert fake_layout_mismatches(masked, masked_args) == []


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda q, k, v, n: (q, k, v[:, :, :-1], n), "caches"),
        (lambda q, k, v, n: (q[:, :3], k, v, n), "does not group"),
        (lambda q, k, v, n: (q, k, v, n.float()), "integers"),
        (lambda q, k, v, n: (q, k, v, n[:1]), "integers"),
    ],
    ids=["value-shape", "heads-not-grouped", "float-lengths", "lengths-count"],
)
def test_the_contract_is_checked_on_every_backend(change, message, stand_in):
    query, keys, values, kv_lens, scale = gc.attention_core_inputs(CASES[3])
    args = change(query, keys, values, kv_lens)
    for module in (reference, fused, npu):
        with pytest.raises(ValueError, match=message):
            module.attention_core(*args, scale)


def test_fused_refuses_lengths_that_do_not_hold_the_rows():
    query, keys, values, _, scale = gc.attention_core_inputs(CASES[4])  # 4 rows a sequence
    with pytest.raises(ValueError, match="do not hold 4 new rows"):
        fused.attention_core(query, keys, values, torch.tensor([200, 3]), scale)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda op, q, k, v: op(q.repeat_interleave(2, -1)[..., ::2], k, v, num_heads=16, input_layout="BNSD", num_key_value_heads=2), "query must be contiguous"),
        (lambda op, q, k, v: op(q.float(), k.float(), v.float(), num_heads=16, input_layout="BNSD", num_key_value_heads=2), "float16 or bfloat16"),
        (lambda op, q, k, v: op(q, k, v, num_heads=8, input_layout="BNSD", num_key_value_heads=2), "do not match query N"),
        (lambda op, q, k, v: op(q, k, v, num_heads=16, input_layout="BNSD", num_key_value_heads=2, actual_seq_lengths_kv=[300]), "at most the key's S"),
        (lambda op, q, k, v: op(q, k, v, num_heads=16, input_layout="BSH", num_key_value_heads=2), "BNSD only"),
    ],
    ids=["strided-query", "fp32", "num-heads", "length-past-cache", "layout"],
)  # fmt: skip
def test_the_stand_in_refuses_what_the_real_op_refuses(call, message, stand_in):
    query, keys, values, _, _ = gc.attention_core_inputs(CASES[1])
    with pytest.raises(RuntimeError, match=message):
        call(stand_in.npu_fused_infer_attention_score, query, keys, values)


def test_the_stand_in_takes_lengths_as_a_host_list_only(stand_in):
    query, keys, values, kv_lens, _ = gc.attention_core_inputs(CASES[1])
    with pytest.raises(TypeError, match="list of ints"):
        stand_in.npu_fused_infer_attention_score(
            query,
            keys,
            values,
            num_heads=16,
            input_layout="BNSD",
            num_key_value_heads=2,
            actual_seq_lengths_kv=kv_lens,
        )


def _mask_call(op, batch: int, rows: int, mask_shape: tuple[int, ...]):
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(batch, 4, rows, 8, generator=gen).half()
    k, v = (torch.randn(batch, 2, 12, 8, generator=gen).half() for _ in range(2))
    mask = torch.zeros(mask_shape, dtype=torch.bool)
    mask[..., 10:] = True  # the last two positions hidden, whatever the form
    out, _ = op(q, k, v, atten_mask=mask, num_heads=4, scale=0.5, input_layout="BNSD", num_key_value_heads=2)
    kk, vv = k.float().repeat_interleave(2, 1)[:, :, :10], v.float().repeat_interleave(2, 1)[:, :, :10]
    want = torch.softmax(q.float() @ kk.transpose(2, 3) * 0.5, -1) @ vv
    return out, want


@pytest.mark.parametrize(
    ("batch", "rows", "shape"),
    [(2, 1, (2, 12)), (2, 1, (2, 1, 1, 12)), (2, 1, (1, 1, 12)), (2, 1, (1, 1, 1, 12)), (2, 3, (3, 12)),
     (2, 3, (2, 1, 3, 12)), (2, 3, (1, 3, 12)), (1, 1, (1, 12))],
)  # fmt: skip
def test_the_stand_in_takes_every_mask_shape_op_plugin_lists(stand_in, batch, rows, shape):
    """op-plugin master's page (docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md):
    (1, Q_S, KV_S), (B, 1, Q_S, KV_S), (1, 1, Q_S, KV_S); under BNSD (B, KV_S) at one row, (Q_S, KV_S) at more."""
    out, want = _mask_call(stand_in.npu_fused_infer_attention_score, batch, rows, shape)
    torch.testing.assert_close(out.float(), want, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize(
    ("batch", "rows", "shape"),
    [(2, 3, (2, 3, 12)), (2, 1, (1, 12)), (2, 3, (2, 12)), (2, 1, (2, 2, 1, 12)), (2, 1, (12,))],
)  # fmt: skip
def test_the_stand_in_refuses_mask_shapes_op_plugin_does_not_list(stand_in, batch, rows, shape):
    with pytest.raises(RuntimeError, match="does not fit Q_S"):
        _mask_call(stand_in.npu_fused_infer_attention_score, batch, rows, shape)


def test_npu_refuses_fp32_as_the_op_does(stand_in):
    case = next(c for c in CASES if c["dtype"] == "float32")
    with pytest.raises(RuntimeError, match="float16 or bfloat16"):
        npu.attention_core(*gc.attention_core_inputs(case))


def _masks(kv_len: int, cache_len: int, rows: int):
    """The forms transformers hands an attention: bool (True: visible) and additive float, [1, 1, rows, L]."""
    visible = torch.arange(cache_len)[None, :] <= (kv_len - rows + torch.arange(rows))[:, None]
    additive = torch.zeros(rows, cache_len).masked_fill(~visible, torch.finfo(torch.float32).min)
    return visible[None, None], additive[None, None]


def test_lengths_are_read_from_every_mask_form():
    from pto_kernels.backends import decode_lengths

    keys = torch.zeros(1, 2, 64, 8)
    for mask in _masks(37, 64, 3):
        assert decode_lengths.count(mask, keys).tolist() == [37]
    assert decode_lengths.count(None, keys).tolist() == [64]
    assert decode_lengths.count(torch.ones(1, 50, dtype=torch.long), keys).tolist() == [
        50
    ]  # 2-D padding mask


class _Attention(torch.nn.Module):
    """What the core's model wrapper reads of an attention: its scale and its config's implementation."""

    def __init__(self, implementation: str, dim: int):
        super().__init__()
        self.scaling = dim**-0.5
        self.config = type("Config", (), {"_attn_implementation": implementation})()


def _prefill_case(past: int, rows: int, cache_len: int, dim: int = 16):
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, rows, dim, generator=gen)
    keys, values = torch.zeros(1, 2, cache_len, dim), torch.zeros(1, 2, cache_len, dim)
    keys[:, :, : past + rows], values[:, :, : past + rows] = torch.randn(
        2, 1, 2, past + rows, dim, generator=gen
    )
    return q, keys, values


@pytest.mark.parametrize("backend", ["torch", "fused"])
def test_sdpa_without_a_mask_at_a_static_cache_prefill_sees_the_rows_only(backend):
    """sdpa runs several new rows without a mask as `is_causal`, aligned to the keys' start: a static
    cache's short prefill (9 rows, 12 positions) sees 9 positions, never the 3 after them (zeros)."""
    q, keys, values = _prefill_case(0, 9, 12)
    want = torch.nn.functional.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=True)
    want = want.transpose(1, 2).reshape(1, 9, 64)
    with pto_kernels.enabled(["attention_core"], backend=backend):
        got = pto_kernels.attention_core_model_wrapper(_Attention("sdpa", 16), q, keys, values, None)
    torch.testing.assert_close(got, want)
    every_position = reference.attention_core(q, keys, values, torch.tensor([12]), 16**-0.5)
    assert not torch.allclose(every_position, want, atol=1e-3)  # what counting the whole cache gave


@pytest.mark.parametrize("backend", ["torch", "fused"])
def test_flash_attention_without_a_mask_aligns_the_rows_to_the_keys_end(backend):
    """Flash attention passes no mask for a growing cache with a past: its causal rows end at the keys'
    end (row i sees keys 0 .. past + i), as the op's lengths do: every key."""
    q, keys, values = _prefill_case(20, 4, 24)
    allowed = torch.ones(4, 24, dtype=torch.bool).tril(20)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=allowed, enable_gqa=True
    )
    want = want.transpose(1, 2).reshape(1, 4, 64)
    with pto_kernels.enabled(["attention_core"], backend=backend):
        got = pto_kernels.attention_core_model_wrapper(
            _Attention("flash_attention_2", 16), q, keys, values, None
        )
        as_sdpa = pto_kernels.attention_core_model_wrapper(_Attention("sdpa", 16), q, keys, values, None)
    torch.testing.assert_close(got, want)
    assert not torch.allclose(as_sdpa, want, atol=1e-3)  # sdpa's start alignment would be wrong here


def test_lengths_are_counted_once_per_mask():
    from pto_kernels.backends.decode_lengths import _Lengths

    lengths, keys = _Lengths(), torch.zeros(1, 2, 64, 8)
    mask, _ = _masks(20, 64, 1)
    assert lengths.get(mask, keys)[1].tolist() == [20] and lengths.get(mask, keys)[1].tolist() == [20]
    assert lengths.one_range_each(mask, keys) and lengths.builds == 1  # every layer passes the same mask
    mask[..., 20] = True  # the next step's mask, changed in place: counted again
    assert lengths.get(mask, keys)[1].tolist() == [21] and lengths.builds == 2


def _left_padded(starts, lengths, cache_len: int, rows: int):
    """transformers' masks of a left-padded batch: [b, 1, rows, L] bool (True: visible) and additive."""
    positions = torch.arange(cache_len)
    visible = torch.stack(
        [
            (positions[None, :] >= first)
            & (positions[None, :] <= (first + length - rows + torch.arange(rows))[:, None])
            for first, length in zip(starts, lengths, strict=True)
        ]
    )[:, None]
    additive = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)
    return visible, additive


def test_each_sequence_s_range_is_read_from_a_left_padded_mask():
    from pto_kernels.backends import decode_lengths

    keys = torch.zeros(4, 2, 64, 8)
    starts, lengths = [10, 0, 63, 40], [54, 64, 1, 21]
    for rows in (1, 3):
        lengths_rows = [max(n, rows) for n in lengths]
        starts_rows = [min(s, 64 - n) for s, n in zip(starts, lengths_rows, strict=True)]
        for mask in _left_padded(starts_rows, lengths_rows, 64, rows):
            got_starts, got_lengths = decode_lengths.ranges(mask, keys)
            assert got_starts.tolist() == starts_rows and got_lengths.tolist() == lengths_rows
            assert decode_lengths.is_one_range_each(mask, keys)
    padding = torch.ones(4, 64, dtype=torch.long)  # flash attention's 2-D padding mask
    for b, first in enumerate(starts):
        padding[b, :first] = 0
    assert decode_lengths.ranges(padding, keys)[0].tolist() == starts
    padding[1, 30] = 0  # a hole inside a sequence: not one range
    assert not decode_lengths.is_one_range_each(padding, keys)


@pytest.mark.parametrize("backend", ["torch", "fused", "npu"])
def test_the_model_wrapper_at_batch_4_takes_each_sequence_s_left_padding(backend, stand_in, monkeypatch):
    """Four sequences of four lengths, left-padded as generate pads a batch: the op from the mask, through
    every backend that runs here, matches float64 with each sequence's own range."""
    case = next(c for c in CASES if c["id"] == "gutenocr-batch4-left-padded-bf16")
    query, keys, values, kv_lens, scale, kv_starts = gc.attention_core_inputs(case)
    expected = gc.attention_core_expected(query, keys, values, kv_lens, scale, kv_starts)
    attention = _Attention("sdpa", query.shape[-1])
    attention.scaling = scale
    for mask in _left_padded(kv_starts.tolist(), kv_lens.tolist(), keys.shape[2], 1):
        with pto_kernels.enabled(["attention_core"], backend=backend):
            out = pto_kernels.attention_core_model_wrapper(attention, query, keys, values, mask)
        assert pto_kernels.stats()["attention_core"]["fallbacks"] == 0
        gc.check_close(out, expected, query.dtype, f"{backend} left-padded")


def test_the_model_wrapper_hands_a_mask_with_a_hole_back_to_the_model():
    case = next(c for c in CASES if c["id"] == "gutenocr-batch4-left-padded-bf16")
    query, keys, values, kv_lens, scale, kv_starts = gc.attention_core_inputs(case)
    mask, _ = _left_padded(kv_starts.tolist(), kv_lens.tolist(), keys.shape[2], 1)
    mask[2, ..., 150] = False  # inside sequence 2's range (130 .. 206)
    with pto_kernels.enabled(["attention_core"], backend="fused"):
        out = pto_kernels.attention_core_model_wrapper(_Attention("sdpa", 128), query, keys, values, mask)
    assert out is None and pto_kernels.stats()["attention_core"]["calls"] == 0


def test_the_golden_cases_catch_a_core_that_reads_the_padding_or_another_sequence():
    """Left padding ignored (each sequence from position 0), or every sequence given sequence 0's range:
    each must fail the check (the padded head holds noise)."""
    case = next(c for c in CASES if c["id"] == "gutenocr-batch4-left-padded-bf16")
    query, keys, values, kv_lens, scale, kv_starts = gc.attention_core_inputs(case)
    expected = gc.attention_core_expected(query, keys, values, kv_lens, scale, kv_starts)
    gc.check_close(
        fused.attention_core(query, keys, values, kv_lens, scale, kv_starts), expected, query.dtype
    )
    for lens, starts in ((kv_starts + kv_lens, None), (kv_lens[:1].expand(4), kv_starts[:1].expand(4))):
        with pytest.raises(AssertionError, match="relative error"):
            gc.check_close(
                fused.attention_core(query, keys, values, lens, scale, starts), expected, query.dtype
            )


@pytest.mark.parametrize("form", ["bool", "additive"])
def test_the_model_wrapper_matches_float64_with_the_lengths_of_the_mask(form, monkeypatch):
    monkeypatch.setenv("PTO_KERNELS_STRICT", "1")
    case = next(c for c in CASES if c["id"] == "gutenocr-context17-bf16")
    query, keys, values, kv_lens, scale = gc.attention_core_inputs(case)
    mask = _masks(int(kv_lens[0]), keys.shape[2], query.shape[2])[form == "additive"]
    attention = torch.nn.Module()
    attention.scaling = scale
    with pto_kernels.enabled(["attention_core"], backend="fused"):
        out = pto_kernels.attention_core_model_wrapper(attention, query, keys, values, mask)
    gc.check_close(out, gc.attention_core_expected(query, keys, values, kv_lens, scale), query.dtype)


def test_npu_inside_a_capture_masks_on_the_device_instead_of_reading_lengths_back(stand_in, monkeypatch):
    """A host int list cannot be made inside a device-graph capture: the lengths go into the mask."""
    from pto_kernels.backends import pypto_device

    case = next(c for c in CASES if c["id"] == "gutenocr-batch3-lengths-bf16")
    inputs = gc.attention_core_inputs(case)
    seen = []
    real = stand_in.npu_fused_infer_attention_score

    def spy(*args, **kwargs):
        seen.append((kwargs["actual_seq_lengths_kv"], kwargs["atten_mask"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(stand_in, "npu_fused_infer_attention_score", spy)
    monkeypatch.setattr(pypto_device, "capturing", lambda device_type: True)
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: pytest.fail("a host copy inside a capture"))
    out = npu.attention_core(*inputs)
    lengths, mask = seen[0]
    assert lengths is None and mask is not None and mask.dtype == torch.bool
    gc.check_close(out, gc.attention_core_expected(*inputs), inputs[0].dtype, "npu, captured")


def test_the_pypto_mask_bias_hides_exactly_what_a_row_must_not_see():
    """The pypto kernel's mask, made in torch once per forward: row (q head, i) of sequence b sees positions
    < kv_lens[b] - s + i + 1, checked position by position; one new row gets one shared bias row."""
    from pto_kernels.backends import pypto_attention

    kv_lens, group, seq, cache_len = torch.tensor([5, 9]), 2, 3, 12
    bias = pypto_attention.mask_bias(kv_lens, group, seq, cache_len)
    assert bias.shape == (2 * group * seq, cache_len) and bias.dtype == torch.float32
    for b, length in enumerate(kv_lens.tolist()):
        for g in range(group):
            for i in range(seq):
                row = bias[b * group * seq + g * seq + i]
                for pos in range(cache_len):
                    limit = length - seq + i + 1
                    assert (row[pos] == 0) == (pos < limit), (b, g, i, pos)
                    if pos >= limit:  # the further past, the lower: a chunk with nothing visible weighs 0
                        assert row[pos].item() == pytest.approx(
                            -pypto_attention.MASKED * (pos - limit + 1), rel=1e-6
                        )
    one = pypto_attention.mask_bias(kv_lens, 8, 1, cache_len)
    assert one.shape == (2, cache_len) and (one[0] == 0).sum() == 5 and (one[1] == 0).sum() == 9


def test_the_pypto_mask_bias_is_made_once_per_forward():
    from pto_kernels.backends.pypto_attention import _Constants

    constants, kv_lens = _Constants(), torch.tensor([20])
    first = constants.bias(kv_lens, 8, 1, 64)
    assert constants.bias(kv_lens, 8, 1, 64) is first and constants.builds == 1  # every layer, one forward
    kv_lens += 1  # the next step's lengths, in place: made again
    assert (constants.bias(kv_lens, 8, 1, 64) == 0).sum() == 21 and constants.builds == 2
    constants.bias(kv_lens, 8, 2, 64)  # another row count
    constants.bias(torch.tensor([21]), 8, 2, 64)  # other lengths of the same value: made again, never trusted
    assert constants.builds == 4
    assert constants.bias(kv_lens, 8, 2, 128).shape == (16, 128) and constants.builds == 5  # another cache
    assert constants.bias(kv_lens, 4, 2, 128).shape == (8, 128) and constants.builds == 6  # another group


def test_a_cache_of_one_chunk_spreads_the_chunk_over_the_cores():
    from pto_kernels.tiling.tile_table import BLOCK_TILE_TABLE, attention_core_config

    decode = BLOCK_TILE_TABLE[("attention_core", "decode", None)]
    one_chunk = BLOCK_TILE_TABLE[("attention_core", "one_chunk", None)]
    assert one_chunk.kv_chunk == decode.kv_chunk  # the same chunk width: only the tiles differ
    assert attention_core_config(1, 128, decode.kv_chunk) == ("one_chunk", one_chunk)
    assert attention_core_config(16, 128, 17) == ("one_chunk", one_chunk)
    assert attention_core_config(1, 128, decode.kv_chunk + 1) == ("decode", decode)
    assert one_chunk.cube_n[1] < decode.cube_n[1] and one_chunk.down_cube_n[1] < decode.down_cube_n[1]


@pytest.mark.parametrize("cache_len, chunk", [(1040, 1024), (4096, 1024), (2065, 1024), (96, 32)])
def test_the_pypto_chunk_spans_are_the_chunks_each_range_touches(cache_len, chunk):
    """The kernel's loop bounds (made in torch once per forward): the whole chunks' loop and the shorter
    last chunk's together run exactly the chunks a sequence's range overlaps, counted position by position."""
    from pto_kernels.backends import pypto_attention

    gen = torch.Generator().manual_seed(cache_len)
    lengths = torch.cat(
        (torch.tensor([1, 1, cache_len]), torch.randint(1, cache_len + 1, (13,), generator=gen))
    )
    starts = (torch.rand(16, generator=gen) * (cache_len - lengths + 1)).long()
    starts[:3] = torch.tensor([0, cache_len - 1, 0])  # the first position, the last, the whole cache
    spans = pypto_attention.chunk_spans(starts, lengths, chunk, cache_len)
    assert spans.dtype == torch.int32 and spans.shape == (16, 4)
    for (start, length), (first, stop, tail_first, tail_stop) in zip(
        zip(starts.tolist(), lengths.tolist(), strict=True), spans.tolist(), strict=True
    ):
        touched = sorted({position // chunk for position in range(start, start + length)})
        assert list(range(first, stop)) + list(range(tail_first, tail_stop)) == touched, (start, length)
        assert stop <= cache_len // chunk and tail_stop - tail_first in (0, 1)


def test_the_pypto_spans_and_scratch_are_made_once_per_forward():
    from pto_kernels.backends.pypto_attention import MASKED, _Constants, chunk_tops, sum_column

    constants, kv_lens, kv_starts = _Constants(), torch.tensor([20, 5]), torch.tensor([0, 15])
    spans = constants.spans(kv_lens, 16, 40, kv_starts)
    scratch = constants.scratch(kv_lens, kv_starts, 16, 3, 8, "cpu")
    assert constants.spans(kv_lens, 16, 40, kv_starts) is spans  # every layer of one forward
    assert constants.scratch(kv_lens, kv_starts, 16, 3, 8, "cpu") is scratch
    tops, sums = chunk_tops(scratch[0], 3), scratch[0][:, sum_column(0, 3) :]  # a 32-byte block a value
    assert (tops == -MASKED).all() and (sums == 0).all() and (scratch[1] == 0).all()
    assert scratch[0].shape == (16, 2 * 3 * 8) and scratch[1].shape == (16, 3 * 8)
    kv_lens += 1  # the next step: made again, neutral again
    assert constants.scratch(kv_lens, kv_starts, 16, 3, 8, "cpu") is not scratch
    assert constants.spans(kv_lens, 16, 40, kv_starts).tolist() == [[0, 2, 2, 2], [0, 2, 2, 2]]


def test_the_pypto_chunk_doubles_where_the_batch_spreads_the_work():
    """Cost model (pypto_attention.WIDE_CHUNK_HEADS): from 8 kv heads of work, chunks twice the table's."""
    from pto_kernels.backends import pypto_attention
    from pto_kernels.tiling.tile_table import attention_core_config

    config = attention_core_config(1, 128, 4096)[1]
    assert pypto_attention.chunk_width(config, 4096, 2) == config.kv_chunk  # batch 1, 2 kv heads
    assert pypto_attention.chunk_width(config, 4096, 4) == config.kv_chunk
    assert pypto_attention.chunk_width(config, 4096, 8) == 2 * config.kv_chunk  # batch 4
    assert pypto_attention.chunk_width(config, 1040, 16) == 1040  # the whole cache, block-aligned


def test_the_pypto_schedule_fills_one_wave_of_the_cube_cores(monkeypatch):
    """Each (kv head, chunk)'s scores and P @ V split into the largest power of two of tasks that keeps a stage
    within the cube cores (pypto's A2A3.ini: 24), never narrower than the table's tiles."""
    from pto_kernels.backends import pypto_attention
    from pto_kernels.tiling.tile_table import attention_core_config

    one_chunk, wide = attention_core_config(1, 128, 1024)[1], attention_core_config(1, 128, 4096)[1]
    plan = pypto_attention.schedule
    assert pypto_attention.cube_cores() == 24
    assert plan(one_chunk, 1024, 2) == pypto_attention.Schedule(1024, 128, 32)  # batch 1: 8 tasks each
    assert plan(one_chunk, 1024, 8) == pypto_attention.Schedule(1024, 512, 64)  # batch 4: 2 each
    assert plan(one_chunk, 1024, 16) == pypto_attention.Schedule(1024, 1024, 128)  # batch 8: 1 each
    assert plan(wide, 4096, 2) == pypto_attention.Schedule(1024, 512, 128)  # 4 chunks x 2 heads: 2 each
    assert plan(wide, 4096, 8) == pypto_attention.Schedule(2048, 2048, 128)  # batch 4, 2 chunks: 1 each
    monkeypatch.setattr(pypto_attention, "cube_cores", lambda: 48)  # twice the cores: twice the split
    assert plan(one_chunk, 1024, 8) == pypto_attention.Schedule(1024, 256, 32)
    assert plan(wide, 4096, 8) == pypto_attention.Schedule(2048, 1024, 128)


def test_the_pypto_schedule_s_tiles_fit_the_chip_at_every_batch():
    """The scores tile as wide as a chunk of 2,048 takes k tiles of 16 (L0B 64 KiB) and 64 (L1)."""
    from dataclasses import replace

    from pto_kernels.backends import pypto_attention
    from pto_kernels.tiling import tile_budget
    from pto_kernels.tiling.tile_table import attention_core_config

    for cache_len in (17, 256, 1024, 2065, 4096, 8192):
        config = attention_core_config(1, 128, cache_len)[1]
        for heads in (2, 4, 8, 16, 32):
            plan = pypto_attention.schedule(config, cache_len, heads)
            qk_k, qk_n, pv_k, pv_n = pypto_attention._tiles(config, plan, 128)
            tiles = replace(config, cube_k=tuple(qk_k), cube_n=tuple(qk_n), down_cube_k=tuple(pv_k))
            tiles = replace(tiles, down_cube_n=tuple(pv_n))
            assert not tile_budget.problems("attention_core", tiles), (cache_len, heads, plan)
    wide = attention_core_config(1, 128, 4096)[1]
    assert pypto_attention._tiles(wide, pypto_attention.Schedule(2048, 2048, 128), 128)[:2] == (
        [16, 64],
        [2048, 2048],
    )
    unshrunk = replace(wide, cube_k=(64, 128), cube_n=(2048, 2048))  # what the k tiles would be unshrunk
    assert tile_budget.problems("attention_core", unshrunk)


def test_the_pypto_root_pool_holds_every_root_the_kernel_can_run():
    """One root function a (sequence, chunk) and the merge; pypto's default pool (10) at least."""
    from pto_kernels.backends import pypto_attention

    assert pypto_attention.runtime_options(8, 2) == {"stitch_function_inner_memory": 17}
    assert pypto_attention.runtime_options(16, 4) == {"stitch_function_inner_memory": 65}
    assert pypto_attention.runtime_options(1, 4) == {"stitch_function_inner_memory": 10}
