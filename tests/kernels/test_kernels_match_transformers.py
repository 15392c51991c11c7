"""The fused kernels and the package's reference give the installed transformers' own bits in bf16.

A fused norm that merely met the golden tolerance drifted through 32 bf16 vision layers into failing
logits, so these compare with torch.equal against the installed release's modeling code itself.
"""

import installed_transformers as it
import pytest
import torch
import torch.nn.functional as F
from pto_kernels.backends import fused, reference

RMS_SHAPES = [(1, 1, 2048), (1, 37, 2048), (2, 130, 2048), (64, 1280)]  # text decode/prefill, vision
SECTIONS = [[16, 24, 24], [2, 3, 3]]  # GutenOCR's head_dim 128, the tiny model's 16


def _rms_inputs(shape, dtype=torch.bfloat16, seed=7):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 2 + 0.3).to(dtype)
    weight = (torch.rand(shape[-1], generator=gen) + 0.5).to(dtype)
    return x, weight


def _qk(section, dtype=torch.bfloat16, batch=1, seq=9, seed=11):
    """q/k as the attention makes them: [b, s, h, d] projections transposed to [b, h, s, d]."""
    head_dim = 2 * sum(section)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, 4, head_dim, generator=gen).to(dtype).transpose(1, 2)
    k = torch.randn(batch, seq, 2, head_dim, generator=gen).to(dtype).transpose(1, 2)
    return q, k, gen


def _positions(batch, seq, gen):
    """Three different position streams (temporal, height, width), so the section mixing matters."""
    return torch.randint(0, 4096, (3, batch, seq), generator=gen)


def _assert_same_bits(got, expected, what=""):
    assert got.dtype == expected.dtype and got.shape == expected.shape, (what, got.dtype, expected.dtype)
    if not torch.equal(got, expected):
        diff = (got.float() - expected.float()).abs()
        raise AssertionError(
            f"{what}: {int((diff > 0).sum())} of {diff.numel()} elements differ (max {diff.max().item():.3g})"
        )


# --- fused kernels vs the installed transformers ----------------------------------------------------


@pytest.mark.parametrize("shape", RMS_SHAPES)
def test_fused_rms_norm_gives_the_eager_bits_in_bf16(shape):
    x, weight = _rms_inputs(shape)
    _assert_same_bits(
        fused.rms_norm(x, weight, 1e-6), it.rms_norm(x, weight, 1e-6), it.rms_norm_class().__name__
    )


@pytest.mark.parametrize("section", SECTIONS)
def test_fused_mrope_mixed_gives_the_eager_bits_in_bf16(section):
    q, k, gen = _qk(section)
    cos = torch.randn(1, q.shape[2], q.shape[3], generator=gen).to(torch.bfloat16)
    sin = torch.randn(1, q.shape[2], q.shape[3], generator=gen).to(torch.bfloat16)
    expected = it.apply_rotary_pos_emb()(q, k, cos, sin)
    for name, got, want in zip("qk", fused.mrope_mixed(q, k, cos, sin), expected, strict=True):
        _assert_same_bits(got, want, name)


@pytest.mark.parametrize("section", SECTIONS)
def test_fused_mrope_gives_the_eager_bits_in_bf16(section):
    apply_multimodal = it.apply_multimodal_rotary_pos_emb()
    if apply_multimodal is None:
        pytest.skip(
            f"transformers {it.release()} has no apply_multimodal_rotary_pos_emb (the section mixing moved "
            "into Qwen2_5_VLRotaryEmbedding in 5.20); see the rotary-embedding test"
        )
    q, k, gen = _qk(section)
    cos = torch.randn(3, 1, q.shape[2], q.shape[3], generator=gen).to(torch.bfloat16)
    sin = torch.randn(3, 1, q.shape[2], q.shape[3], generator=gen).to(torch.bfloat16)
    expected = apply_multimodal(q, k, cos, sin, section)
    for name, got, want in zip("qk", fused.mrope(q, k, cos, sin, section), expected, strict=True):
        _assert_same_bits(got, want, name)


@pytest.mark.parametrize("section", SECTIONS)
def test_fused_mrope_gives_the_rotary_embedding_bits_in_bf16(section):
    # 5.20+: the rotary embedding mixes the sections and apply_rotary_pos_emb rotates; fused.mrope does
    # both from the unmixed tables that releases up to 5.16 passed around.
    q, k, gen = _qk(section, batch=2)
    tables = it.rotary_tables(q, _positions(2, q.shape[2], gen), section)
    if tables is None:
        pytest.skip(f"transformers {it.release()}'s rotary embedding returns unmixed tables (no mixing step)")
    cos, sin, cos3, sin3 = tables
    expected = it.apply_rotary_pos_emb()(q, k, cos, sin)
    for name, got, want in zip("qk", fused.mrope(q, k, cos3, sin3, section), expected, strict=True):
        _assert_same_bits(got, want, name)


# --- the package's reference vs the installed transformers (it must not drift) ---------------------

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 37, 2048), (64, 1280)])
def test_reference_rms_norm_is_transformers_bit_for_bit(shape, dtype):
    x, weight = _rms_inputs(shape, dtype)
    _assert_same_bits(reference.rms_norm(x, weight, 1e-6), it.rms_norm(x, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("section", SECTIONS)
def test_reference_mrope_is_transformers_bit_for_bit(section, dtype):
    q, k, gen = _qk(section, dtype, batch=2)
    positions = _positions(2, q.shape[2], gen)
    cos3 = torch.randn(3, 2, q.shape[2], q.shape[3], generator=gen).to(dtype)
    sin3 = torch.randn(3, 2, q.shape[2], q.shape[3], generator=gen).to(dtype)
    apply_rotary = it.apply_rotary_pos_emb()
    pairs = [(reference.mrope_mixed(q, k, cos3[0], sin3[1]), apply_rotary(q, k, cos3[0], sin3[1]))]
    apply_multimodal = it.apply_multimodal_rotary_pos_emb()
    if apply_multimodal is not None:
        pairs.append(
            (reference.mrope(q, k, cos3, sin3, section), apply_multimodal(q, k, cos3, sin3, section))
        )
    tables = it.rotary_tables(q, positions, section)
    if tables is not None:
        cos, sin, real_cos3, real_sin3 = tables
        real_mixed = reference.mix_sections(real_cos3, real_sin3, section, 1)
        _assert_same_bits(real_mixed[0], cos.unsqueeze(1), "mixed cos")
        _assert_same_bits(real_mixed[1], sin.unsqueeze(1), "mixed sin")
        pairs.append((reference.mrope(q, k, real_cos3, real_sin3, section), apply_rotary(q, k, cos, sin)))
    for got_pair, want_pair in pairs:
        for name, got, want in zip("qk", got_pair, want_pair, strict=True):
            _assert_same_bits(got, want, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reference_swiglu_mlp_is_transformers_bit_for_bit(dtype):
    mlp = it.swiglu_mlp_module(64, 176, dtype, seed=2)
    x = torch.randn(1, 5, 64, generator=torch.Generator().manual_seed(4)).to(dtype)
    with torch.no_grad():
        _assert_same_bits(reference.swiglu_mlp(mlp, x), mlp(x))
        _assert_same_bits(fused.swiglu_mlp(mlp, x), mlp(x), "fused")


# --- the bit comparison rejects near misses ---------------------------------------------------------


def test_bit_comparison_rejects_a_single_rounding_norm():
    # F.rms_norm straight on bf16 is within the golden tolerance but rounds once, not twice
    x, weight = _rms_inputs((1, 37, 2048))
    with pytest.raises(AssertionError, match="elements differ"):
        _assert_same_bits(F.rms_norm(x, (2048,), weight, 1e-6), it.rms_norm(x, weight, 1e-6))


def test_bit_comparison_rejects_a_fused_multiply_add_rotary():
    # computing q*cos + rotate_half(q)*sin in fp32 and rounding once drifts from the eager bf16 bits
    q, k, gen = _qk([16, 24, 24])
    cos = torch.randn(1, q.shape[2], q.shape[3], generator=gen).to(torch.bfloat16)
    sin = torch.randn(1, q.shape[2], q.shape[3], generator=gen).to(torch.bfloat16)
    one_rounding = reference.mrope_mixed(q.float(), k.float(), cos.float(), sin.float())[0].to(q.dtype)
    with pytest.raises(AssertionError, match="elements differ"):
        _assert_same_bits(one_rounding, it.apply_rotary_pos_emb()(q, k, cos, sin)[0])
