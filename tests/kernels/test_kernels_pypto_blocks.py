"""The PyPTO decoder-layer block kernels, run on the CPU through PyPTO's verify interpreter, against float64
references written here (not imported from pto_kernels).

One subprocess (pypto_blocks_runner.py) runs every case; pypto exits the process on a g++ failure. Small
widths: hidden 64, intermediate 128, 4 q / 2 kv heads (head_dim 16 in fp32, 32 in bf16: head_dim / 2
fills whole 32-byte blocks), in bf16 and fp32, at 1 row, 6 rows (batch 2) and 19 rows (the prefill tiling);
the MLP block also at widths its decode tiles do not divide (runner.TAIL_WIDTHS), at 1 row and batch 8.
"""

import importlib.util
import sys
from pathlib import Path

import golden_cases as gc
import pytest
import torch
from interpreter_run import run_interpreter
from pto_kernels.backends import pypto_blocks
from pto_kernels.tiling.tile_table import tile_config

pytestmark = [
    pytest.mark.pypto,
    pytest.mark.skipif(importlib.util.find_spec("pypto") is None, reason="pypto not installed (extra `pto`)"),
]

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pypto_blocks_runner as runner  # noqa: E402

RUNNER = Path(runner.__file__)
CASE_IDS = [f"{dtype}-{shape}" for dtype, shape in runner.CASES]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = run_interpreter(RUNNER, tmp_path_factory.mktemp("pypto_blocks"))
    print("pypto interpreter seconds per case:", {k: round(v, 1) for k, v in out["seconds"].items()})
    return out


# --- float64 references ------------------------------------------------------------------------------


def _f64(i: dict, *names):
    return [i[n].double() for n in names]


def _norm64(h, weight, eps=runner.EPS):
    return weight * h / torch.sqrt((h * h).mean(dim=-1, keepdim=True) + eps)


def residual_rms_norm_expected(i):
    x, res, w = _f64(i, "hidden_states", "residual", "norm_weight")
    summed = res + x
    return _norm64(summed, w), summed


def mlp_block_expected(i):
    res, attn, o_w, w, gate_w, up_w, down_w = _f64(
        i, "residual", "attn_output", "o_weight", "norm_weight", "gate_weight", "up_weight", "down_weight"
    )
    h = res + attn @ o_w.T
    n = _norm64(h, w)
    gate, up = n @ gate_w.T, n @ up_w.T
    return h + (gate / (1 + torch.exp(-gate)) * up) @ down_w.T


def prologue_expected(i, biases=True):
    x, w = _f64(i, "hidden_states", "norm_weight")
    batch, seq, _ = x.shape
    d = i["head_dim"]
    n = _norm64(x, w)
    heads = []
    for name in "qkv":
        y = n @ i[f"{name}_weight"].double().T
        if biases:
            y = y + i[f"{name}_bias"].double()
        heads.append(y.reshape(batch, seq, -1, d).transpose(1, 2))
    cos_m, sin_m = gc.mix_tables(i["cos"], i["section"]), gc.mix_tables(i["sin"], i["section"])
    q, k, v = heads
    return gc.rotary_expected(q, cos_m, sin_m), gc.rotary_expected(k, cos_m, sin_m), v


EXPECTED = {
    "residual_rms_norm": residual_rms_norm_expected,
    "mlp_block": lambda i: (mlp_block_expected(i),),
    "attention_prologue": prologue_expected,
    "attention_prologue_mixed": prologue_expected,
}


def _check(entry: str, inputs: dict, output) -> list:
    output = output if isinstance(output, tuple) else (output,)
    expected = EXPECTED[entry](inputs)
    dtype = inputs["hidden_states"].dtype
    assert len(output) == len(expected), entry
    for n, (got, want) in enumerate(zip(output, expected, strict=True)):
        assert got.dtype == dtype, (entry, n, got.dtype)
        gc.check_close(got, want, dtype, f"{entry} output {n}")
    return expected


# --- the cases ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", runner.ENTRIES)
@pytest.mark.parametrize("case", CASE_IDS)
def test_block_matches_float64(entry, case, results):
    result = results["results"][f"{entry}/{case}"]
    _check(entry, result["inputs"], result["output"])


@pytest.mark.parametrize("shape", list(runner.TAIL_SHAPES))
def test_mlp_block_matches_float64_where_its_tiles_end_in_a_partial_tile(shape, results):
    """The decode and one-row entries' o_proj / down tiles (96 columns) and gate/up tiles (112) at widths they
    do not divide, at 1 row and at batch 8: a tile past a matrix's edge, or a tail left unwritten, fails."""
    hidden, inter = runner.TAIL_WIDTHS
    rows = runner.TAIL_SHAPES[shape][0] * runner.TAIL_SHAPES[shape][1]
    config = tile_config("mlp_block", rows, hidden)[1]
    down_n, proj_n, gate_n = config.down_cube_n[0], config.proj_cube_n[0], config.cube_n[0]
    if config.static:  # the kernel's own split of the o_proj output (pypto_blocks._split_output_tiles)
        proj_n = pypto_blocks._split_output_tiles([proj_n], hidden)[0]
    assert hidden % down_n and hidden % proj_n and inter % gate_n, (hidden, inter, config)
    assert hidden > max(down_n, proj_n) and inter > gate_n, (hidden, inter, config)
    result = results["results"][f"mlp_block_tails/bfloat16-{shape}"]
    assert result["inputs"]["residual"].shape[-1] == hidden
    _check("mlp_block", result["inputs"], (result["output"],))


def test_attention_prologue_without_biases(results):
    result = results["results"]["attention_prologue_bias_free/float32-rows6"]
    q, k, v = result["output"]
    for got, want, what in zip(
        (q, k, v), prologue_expected(result["inputs"], biases=False), "qkv", strict=True
    ):
        gc.check_close(got, want, torch.float32, what)


def test_the_cost_models_plain_linear_kernel(results):
    result = results["results"]["linear/bfloat16-rows6"]
    x, weight = result["inputs"]["x"], result["inputs"]["weight"]
    gc.check_close(result["output"], x.double() @ weight.double().T, torch.bfloat16, "linear")


def _check_cached(result: dict, position: int, sequences=None) -> None:
    """q against float64; the caches hold each sequence's k and v at `position` of each kv head and nothing
    anywhere else. `sequences`: which sequence's expected rows each cache row is checked against (default:
    its own)."""
    q, key_cache, value_cache = result["output"]
    q_want, k_want, v_want = prologue_expected(result["inputs"])
    gc.check_close(q, q_want, torch.bfloat16, "q")
    batch, heads = key_cache.shape[:2]
    order = list(range(batch)) if sequences is None else sequences
    for cache, want, what in ((key_cache, k_want, "k"), (value_cache, v_want, "v")):
        written = (~cache.isnan().all(-1)).nonzero().tolist()
        assert written == [[b, head, position] for b in range(batch) for head in range(heads)], f"{what} rows"
        gc.check_close(cache[:, :, position : position + 1], want[order], torch.bfloat16, what)


@pytest.mark.parametrize("case", ["counter", "scalar", "cache_position"])
def test_the_cached_prologue_writes_k_and_v_at_the_position_its_tensor_holds(case, results):
    """One kernel: q out, and k and v into the static caches at the position read inside the kernel from
    the int64 tensor transformers keeps ([1], 0-d, or the attention's cache_position): three positions."""
    result = results["results"][f"attention_prologue_cached/{case}"]
    _check_cached(result, result["position"])


@pytest.mark.parametrize("case", ["counter", "scalar", "cache_position"])
def test_the_cached_prologue_advances_a_length_in_the_same_kernel(case, results):
    """With advance (a 5.8+ layer's own length, [1] or 0-d) the kernel leaves the position one further, in
    its tensor's own form and dtype; without (the attention's cache_position, 4.57 - 5.0) untouched."""
    result = results["results"][f"attention_prologue_cached/{case}"]
    after, at = result["position_after"], result["position"]
    assert after.dtype == torch.int64 and after.shape == runner.CACHE_POSITIONS[case].shape
    assert after.reshape(-1).tolist() == [at + 1 if result["advance"] else at]


def test_the_cache_wrapper_runs_the_pypto_kernel_on_transformers_static_cache(results):
    """A decode step into the installed transformers' StaticCache (5 positions prefilled), backend pypto,
    strict: one pypto call that wrote the cache; the new k and v at position 5, the prefill kept, the rest
    zeros; the layer's length advanced by one where the release keeps one."""
    _check_dispatched_write(results["results"]["dispatched/attention_prologue_cached"])


def _check_dispatched_write(result) -> None:
    """One pypto call that wrote the cache: q, the new k and v at position 5 of every sequence, the prefill
    kept, the rest zeros; the layer's length advanced by one where the release keeps one."""
    assert result["written"] and result["backends"] == {"pypto": 1} and result["cache_writes"] == 1
    q, keys, values = result["output"]
    q_want, k_want, v_want = prologue_expected(result["inputs"])
    gc.check_close(q, q_want, torch.bfloat16, "q")
    for cache, prefill, want, what in zip(
        (keys, values), result["prefill"], (k_want, v_want), "kv", strict=True
    ):
        torch.testing.assert_close(cache[:, :, :5], prefill, rtol=0, atol=0)
        gc.check_close(cache[:, :, 5:6], want, torch.bfloat16, what)
        assert not cache[:, :, 6:].any(), f"{what}: rows past the new one written"
    assert result["length"] in (None, 6)


def test_the_cached_check_fails_at_another_position(results):
    result = results["results"]["attention_prologue_cached/counter"]
    with pytest.raises(AssertionError):
        _check_cached(result, result["position"] - 1)


BATCH_CASES = [f"{batch}-{case}" for batch in runner.CACHED_BATCHES for case in ("advance", "at")]


@pytest.mark.parametrize("case", BATCH_CASES)
def test_the_cached_prologue_at_a_batch_writes_each_sequences_rows_at_the_position(case, results):
    """At 4 and 16 sequences, one kernel: q out, and each sequence's k and v into its own cache rows at the
    batch's one position (transformers' static cache writes every sequence there), nothing else written;
    the length advanced by one with advance, untouched without. No plain prologue kernel ran (whose k and v
    torch's index_copy_ would then write)."""
    result = results["results"][f"attention_prologue_cached/{case}"]
    _check_cached(result, result["position"])
    at = result["position"]
    assert result["position_after"].tolist() == [at + 1 if result["advance"] else at]
    assert result["launches"] == {"attention_prologue": 0, "attention_prologue_cached": 1}


@pytest.mark.parametrize("batch", list(runner.CACHED_BATCHES))
def test_the_batch_cached_check_fails_on_rows_in_another_sequence_or_position(batch, results):
    """The check above fails where a sequence's rows landed in another sequence's cache (the expected rows
    of the batch rotated by one sequence) or at another position."""
    result = results["results"][f"attention_prologue_cached/{batch}-advance"]
    rotated = [*range(1, runner.CACHED_BATCHES[batch][0]), 0]
    with pytest.raises(AssertionError):
        _check_cached(result, result["position"], sequences=rotated)
    with pytest.raises(AssertionError):
        _check_cached(result, result["position"] + 1)


def test_the_cache_wrapper_runs_one_pypto_kernel_at_a_batch(results):
    """A decode step of 4 sequences into the installed transformers' StaticCache (5 positions prefilled),
    backend pypto, strict: the cached kernel alone wrote every sequence's new k and v at position 5, the
    prefill kept, the rest zeros."""
    result = results["results"]["dispatched/attention_prologue_cached/batch4"]
    assert result["launches"] == {"attention_prologue": 0, "attention_prologue_cached": 1}
    assert result["output"][1].shape[0] == 4
    _check_dispatched_write(result)


@pytest.mark.parametrize("epilogue", ["none", "per_head", "one_task"])
def test_the_prologue_bound_probes_do_the_matmuls(epilogue, results):
    """benchmarks/prologue_bound.py's probes: every output column is x @ W^T, so their spans are of kernels
    that do the prologue's matmuls; a probe that skipped a head or a projection would fail here."""
    result = results["results"][f"prologue_bound/{epilogue}"]
    x, weights = result["inputs"]["x"], result["inputs"]["weights"]
    for name, w, out in zip("qkv", weights, result["output"], strict=True):
        gc.check_close(out, x.double() @ w.double().T, torch.bfloat16, f"probe {epilogue} {name}")


def test_the_probe_check_fails_on_a_skipped_head(results):
    result = results["results"]["prologue_bound/per_head"]
    x, w, out = result["inputs"]["x"], result["inputs"]["weights"][0], result["output"][0].clone()
    out[:, : out.shape[1] // 4] = 0  # one of four q heads never written
    with pytest.raises(AssertionError):
        gc.check_close(out, x.double() @ w.double().T, torch.bfloat16, "probe with a head skipped")


@pytest.mark.parametrize("entry", runner.ENTRIES)
def test_a_sabotaged_call_fails_the_check(entry, results):
    """A wrong weight, gate and up swapped, sections reversed, cos and sin swapped: the same check fails."""
    result = results["results"][f"sabotaged/{entry}"]
    with pytest.raises(AssertionError, match="relative error"):
        _check(entry, result["inputs"], result["output"])


def test_one_kernel_per_entry_dtype_and_shape_class(results):
    """The row axis is dynamic: 1 and 6 rows share the decode kernel; 19 rows build the prefill one. The
    prologue and the MLP block have a kernel of their own for exactly 1 row (tile_table's "one_row" class)."""
    stats = results["stats"]
    # bf16 decode, fp32 decode, bf16 prefill (the sabotaged bf16 calls hit the decode kernel); the prologue
    # and the MLP block also bf16 and fp32 for 1 row; the MLP block at the tail widths, 1 row and batch 8
    built = {"residual_rms_norm": 3, "mlp_block": 7, "attention_prologue": 5}
    for op, kernels in built.items():
        assert stats[op]["built"] == kernels, (op, stats[op])
        assert stats[op]["cache_hits"] >= 2, (op, stats[op])


def test_norm_folded_weights_are_made_once_and_again_after_a_change():
    from pto_kernels.backends import pypto_prologue

    folded = pypto_prologue._NormFolded()
    weight, norm = torch.randn(8, 4), torch.rand(4) + 0.5
    first = folded.get(weight, norm, torch.float32)
    torch.testing.assert_close(first, weight * norm)
    assert folded.get(weight, norm, torch.float32) is first and folded.builds == 1
    with torch.no_grad():
        norm.mul_(2.0)  # an in-place change bumps the version counter
    torch.testing.assert_close(folded.get(weight, norm, torch.float32), weight * norm)
    assert folded.builds == 2
    del weight, first
    assert not folded._by_id  # the copy goes with its weight


@pytest.mark.parametrize("entry", ["residual_rms_norm", "mlp_block", "attention_prologue"])
def test_the_wrappers_route_the_blocks_to_the_pypto_kernels(entry, results):
    """enable(backend="pypto") and a patched layer's call: served by pypto (strict: no fallback)."""
    result = results["results"][f"dispatched/{entry}"]
    assert result["backends"] == {"pypto": 1}, result["backends"]
    _check(entry, result["inputs"], result["output"])
