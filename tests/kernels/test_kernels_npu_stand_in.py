"""The torch_npu stand-in refuses what op-plugin's ops refuse, and the `npu` backend runs within those rules
on both op-plugin releases it mirrors, with the launches it is meant to make."""

from __future__ import annotations

import sys

import pto_kernels
import pytest
import stand_in_torch_npu
import torch
from pto_kernels import reference
from pto_kernels.backends import npu as npu_backend

F32, BF16 = torch.float32, torch.bfloat16


@pytest.fixture(params=stand_in_torch_npu.RELEASES)
def npu(request, monkeypatch):
    module = stand_in_torch_npu.make_module(request.param)
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setenv("PTO_KERNELS_STRICT", "1")
    return module


def _mrope_args(dtype=BF16, tokens=3, head=128, section=(16, 24, 24)):
    positions = torch.randint(0, 8, (len(section), tokens)) if section else torch.arange(tokens)
    q, k = torch.randn(tokens, 4 * head, dtype=dtype), torch.randn(tokens, 2 * head, dtype=dtype)
    return positions, q, k, torch.rand(8, head, dtype=dtype), head


# one refused input per op: what the real op's parameter check stops
REFUSED = {
    "npu_rms_norm 1-D": lambda m: m.npu_rms_norm(torch.randn(8), torch.ones(8)),
    "npu_rms_norm fp32 x, bf16 gamma": lambda m: m.npu_rms_norm(torch.randn(2, 8), torch.ones(8, dtype=BF16)),
    "npu_add_rms_norm gamma dtype": lambda m: m.npu_add_rms_norm(
        torch.randn(2, 8, dtype=BF16), torch.randn(2, 8, dtype=BF16), torch.ones(8)
    ),
    "npu_swiglu non-contiguous": lambda m: m.npu_swiglu(torch.randn(8, 4).t()),
    "npu_swiglu odd dim": lambda m: m.npu_swiglu(torch.randn(2, 7)),
    "npu_rotary_mul 2-D": lambda m: m.npu_rotary_mul(torch.randn(3, 8), torch.randn(3, 8), torch.randn(3, 8)),
    "npu_rotary_mul broadcast table": lambda m: m.npu_rotary_mul(
        torch.randn(2, 2, 3, 8), torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    ),
    "npu_rotary_mul mixed dtypes": lambda m: m.npu_rotary_mul(
        torch.randn(1, 3, 2, 8), torch.randn(1, 3, 1, 8, dtype=BF16), torch.randn(1, 3, 1, 8, dtype=BF16)
    ),
    "npu_mrope unlisted section": lambda m: m.npu_mrope(*_mrope_args(head=32, section=(4, 6, 6)), mrope_section=[4, 6, 6]),
    "npu_mrope bf16 head 16": lambda m: m.npu_mrope(*_mrope_args(head=16, section=None)),
    "npu_mrope rotary_mode interleaved": lambda m: m.npu_mrope(*_mrope_args(section=None), rotary_mode="interleaved"),
    "npu_rotary_mul B 1000": lambda m: m.npu_rotary_mul(
        torch.randn(1000, 1, 2, 8), torch.randn(1000, 1, 1, 8), torch.randn(1000, 1, 1, 8)
    ),
    "npu_rotary_mul N 1000 (BSND)": lambda m: m.npu_rotary_mul(
        torch.randn(1, 2, 1000, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    ),
    "npu_mrope float positions": lambda m: m.npu_mrope(
        torch.zeros(3), *_mrope_args(section=None)[1:]
    ),
    "npu_apply_rotary_pos_emb D 80": lambda m: m.npu_apply_rotary_pos_emb(
        torch.randn(1, 2, 4, 80), torch.randn(1, 2, 1, 80), torch.randn(1, 2, 1, 80), torch.randn(1, 2, 1, 80),
        layout="BSND",
    ),
    "npu_apply_rotary_pos_emb BNSD": lambda m: m.npu_apply_rotary_pos_emb(
        *(torch.randn(1, 1, 2, 128) for _ in range(4)), layout="BNSD"
    ),
}  # fmt: skip


def test_what_the_real_ops_take_is_taken(npu):
    """The other side of the refusals above: the schema's own spelling and sizes just inside the limits."""
    # each call raises (the stand-in's refusal) where the stand-in refuses what the real op takes
    q, k = npu.npu_mrope(*_mrope_args(section=None), rotary_mode="interleave")
    assert q.shape == (3, 4 * 128) and k.shape == (3, 2 * 128)
    out = npu.npu_rotary_mul(torch.randn(999, 1, 2, 8), torch.randn(999, 1, 1, 8), torch.randn(999, 1, 1, 8))
    assert out.shape == (999, 1, 2, 8)
    table = torch.randn(1, 1000, 1, 8)  # S of 1000 is no limit
    assert npu.npu_rotary_mul(torch.randn(1, 1000, 2, 8), table, table).shape == (1, 1000, 2, 8)


@pytest.mark.parametrize("case", REFUSED)
def test_each_op_refuses_what_the_real_one_refuses(case, npu):
    with pytest.raises(RuntimeError, match=r"stand-in for torch_npu\.npu_"):
        REFUSED[case](npu)


def test_keywords_are_checked_as_the_schemas_name_them(npu):
    with pytest.raises(TypeError):
        npu.npu_rms_norm(torch.randn(2, 8), torch.ones(8), eps=1e-6)  # the schema names it epsilon
    with pytest.raises(TypeError):  # mrope_section is keyword-only
        npu.npu_mrope(*_mrope_args(), [16, 24, 24])
    if npu.release < "26":
        with pytest.raises(TypeError):  # cache_mode came with op-plugin 26.0.0
            npu.npu_mrope(*_mrope_args(), mrope_section=[16, 24, 24], cache_mode="default")
    else:
        npu.npu_mrope(*_mrope_args(), mrope_section=[16, 24, 24], cache_mode="default")
    bsnd = [
        torch.randn(1, 2, 4, 128),
        torch.randn(1, 2, 2, 128),
        torch.rand(1, 2, 1, 128),
        torch.rand(1, 2, 1, 128),
    ]
    if npu.release < "26.1":  # the default layout was 'BSH' before 26.1.0: BSND must be named
        with pytest.raises(RuntimeError, match="layout 'BSH'"):
            npu.npu_apply_rotary_pos_emb(*bsnd)
    q, k = npu.npu_apply_rotary_pos_emb(*bsnd, "BSND")
    assert q is bsnd[0] and k is bsnd[1]  # in place


def test_npu_mrope_mixes_sections_as_its_api_page_writes():
    """The stand-in's kernel against the reference's MRoPE on the same neox tables."""
    npu = stand_in_torch_npu.make_module()
    torch.manual_seed(0)
    tokens, head, section = 5, 32, [4, 6, 6]  # any 3-section split, checked here only through the math
    positions = torch.randint(0, 16, (3, tokens))
    inv = 1.0 / 1e4 ** (torch.arange(0, head, 2, dtype=torch.float64) / head)
    angles = torch.arange(16, dtype=torch.float64)[:, None] * inv
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1).float()
    q, k = torch.randn(tokens, 2 * head), torch.randn(tokens, head)
    cos_full = torch.cat((angles.cos(), angles.cos()), -1).float()[positions][:, None]  # [3, 1, T, D]
    sin_full = torch.cat((angles.sin(), angles.sin()), -1).float()[positions][:, None]
    cos_m, sin_m = reference.mix_sections(cos_full, sin_full, section, 1)
    want_q, want_k = reference.apply_rotary(
        q.view(1, tokens, 2, head).transpose(1, 2), k.view(1, tokens, 1, head).transpose(1, 2), cos_m, sin_m
    )
    npu_mrope = stand_in_torch_npu.MROPE_SECTIONS
    stand_in_torch_npu.MROPE_SECTIONS = (*npu_mrope, section)  # let the math run on a small section
    try:
        got_q, got_k = npu.npu_mrope(positions, q, k, cache, head, mrope_section=section)
    finally:
        stand_in_torch_npu.MROPE_SECTIONS = npu_mrope
    torch.testing.assert_close(got_q, want_q.transpose(1, 2).reshape(tokens, -1))
    torch.testing.assert_close(got_k, want_k.transpose(1, 2).reshape(tokens, -1))


def test_add_rms_norm_rounds_the_bf16_sum_first_as_a_910b_does():
    npu = stand_in_torch_npu.make_module()
    x1 = torch.full((1, 8), 1.0, dtype=BF16)
    x2 = torch.full((1, 8), 2.0**-9, dtype=BF16)  # below half a bf16 step at 1.0: the rounded sum is 1.0
    _, _, summed = npu.npu_add_rms_norm(x1, x2, torch.ones(8, dtype=BF16))
    assert torch.equal(summed, x1)


# --- the npu backend within those rules -----------------------------------------------------------


def _tables(b, s, d, dtype):
    inv = 1.0 / 1e6 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.randint(0, 512, (3, b, s)).double()[..., None] * inv
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize(
    "dtype, head, kernel",
    [(BF16, 128, "npu_mrope"), (F32, 16, "npu_mrope"), (BF16, 80, "npu_rotary_mul")],
    ids=["bf16-128", "fp32-16", "bf16-80"],
)
def test_mrope_runs_the_cheapest_op_on_the_layout_the_projections_wrote(npu, dtype, head, kernel):
    torch.manual_seed(1)
    b, s = 2, 3
    q = torch.randn(b, s, 4, head, dtype=dtype).transpose(1, 2)  # [B, N, S, D] view of BSND, as the model
    k = torch.randn(b, s, 2, head, dtype=dtype).transpose(1, 2)
    cos, sin = _tables(b, s, head, dtype)
    q_before, k_before = q.clone(), k.clone()
    with pto_kernels.enabled(["mrope"], backend="npu"):
        got = pto_kernels.mrope_pto_correct(q, k, cos, sin, [head // 8, 3 * head // 16, 3 * head // 16], 1)
    want = reference.apply_rotary(
        q, k, *reference.mix_sections(cos, sin, [head // 8, 3 * head // 16, 3 * head // 16], 1)
    )
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == BF16 else {}
    torch.testing.assert_close(got, want, **tol)
    assert torch.equal(q, q_before) and torch.equal(k, k_before)  # never in place
    launches = {"npu_mrope": 1, "npu_rotary_mul": 2}[kernel]
    assert npu.calls[kernel] == launches and not npu.copies  # no copy in front of it


def test_the_mlp_runs_one_gemm_over_merged_gate_and_up_and_rebuilds_it_when_a_weight_changes(npu):
    torch.manual_seed(2)
    mlp = torch.nn.Module()
    mlp.gate_proj, mlp.up_proj = torch.nn.Linear(16, 24, bias=False), torch.nn.Linear(16, 24, bias=False)
    mlp.down_proj, mlp.act_fn = torch.nn.Linear(24, 16, bias=False), torch.nn.SiLU()
    x = torch.randn(3, 16)
    builds = npu_backend.MERGED_GATE_UP.builds
    with pto_kernels.enabled(["swiglu_mlp"], backend="npu"), torch.no_grad():
        torch.testing.assert_close(pto_kernels.swiglu_mlp_wrapper(mlp, x), reference.swiglu_mlp(mlp, x))
        pto_kernels.swiglu_mlp_wrapper(mlp, x)
        assert npu_backend.MERGED_GATE_UP.builds == builds + 1  # once per weight pair
        mlp.up_proj.weight.mul_(2)  # changed in place: the merged copy must follow
        torch.testing.assert_close(pto_kernels.swiglu_mlp_wrapper(mlp, x), reference.swiglu_mlp(mlp, x))
    assert npu_backend.MERGED_GATE_UP.builds == builds + 2 and npu.calls["npu_swiglu"] == 3


def test_the_npu_name_a_tuning_records_is_the_asked_devices(monkeypatch):
    """torch_npu/npu/__init__.py (Ascend/pytorch master): get_device_name(index) checks the index, then names
    the current device; get_device_properties(index).name names the device asked for."""
    import types

    names = ["Ascend910B3", "Ascend910B4"]
    current = 0
    stand_in = types.SimpleNamespace(
        is_available=lambda: True,
        get_device_name=lambda index=None: names[current],
        get_device_properties=lambda index=None: types.SimpleNamespace(
            name=names[current if index is None else index]
        ),
    )
    monkeypatch.setattr(torch, "npu", stand_in, raising=False)
    assert pto_kernels.tuning.npu_name(1) == "Ascend910B4" and stand_in.get_device_name(1) == "Ascend910B3"
