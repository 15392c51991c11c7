"""The entries a serving engine's own layers call (serving_ops.py): residual RMSNorm, the SwiGLU activation
alone and MRoPE on flat [tokens, heads * head_dim] tensors; as custom ops, counted, traced whole."""

from __future__ import annotations

import sys

import pto_kernels
import pytest
import stand_in_torch_npu
import torch
import torch.nn.functional as F
from pto_kernels import ops, serving_ops
from pto_kernels.backends import reference

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SECTION = [4, 6, 6]  # temporal, height, width: 16 = head_size // 2
HEAD = 32


def _inputs(dtype=torch.float32):
    torch.manual_seed(0)
    return {
        "add_rms_norm": (
            torch.randn(5, 64, dtype=dtype),
            torch.randn(5, 64, dtype=dtype),
            torch.randn(64),
            1e-6,
        ),
        "silu_and_mul": (torch.randn(5, 2 * 96, dtype=dtype),),
    }


def _token_mrope_inputs(tokens=7):
    torch.manual_seed(1)
    query, key = torch.randn(tokens, 4 * HEAD), torch.randn(tokens, 2 * HEAD)
    cos, sin = torch.randn(3, tokens, HEAD // 2), torch.randn(3, tokens, HEAD // 2)
    return query, key, cos, sin


def _neox_mrope(x, cos, sin, section):
    """MRoPE from its definition, one rotary half at a time: dimension j of the half takes its angle from the
    position row (temporal, height, width) its section assigns; then x1*c - x2*s, x2*c + x1*s."""
    rows = [i for i, width in enumerate(section) for _ in range(width)]
    c = torch.stack([cos[row, :, j] for j, row in enumerate(rows)], dim=-1)[:, None, :]  # [tokens, 1, half]
    s = torch.stack([sin[row, :, j] for j, row in enumerate(rows)], dim=-1)[:, None, :]
    heads = x.view(x.shape[0], -1, HEAD)
    x1, x2 = heads[..., : HEAD // 2], heads[..., HEAD // 2 :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).reshape(x.shape)


def test_the_serving_entries_are_registered_custom_ops():
    for name in serving_ops.NAMES:
        assert ops.registered(name)


@pytest.mark.parametrize("backend", ["torch", "fused"])
@pytest.mark.parametrize("name", ["add_rms_norm", "silu_and_mul"])
def test_op_passes_torch_opcheck_and_matches_the_reference(backend, name):
    pto_kernels.enable(backend=backend)
    args = _inputs()[name]
    op = getattr(torch.ops.pto_kernels, name).default
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
    torch.testing.assert_close(op(*args), getattr(reference, name)(*args))


def test_the_residual_form_is_the_norm_of_the_sum_and_hands_the_sum_back():
    x, residual, weight, eps = _inputs()["add_rms_norm"]
    normed, summed = reference.add_rms_norm(x, residual, weight, eps)
    torch.testing.assert_close(summed, x + residual)
    torch.testing.assert_close(normed, reference.rms_norm(x + residual, weight, eps))
    assert not torch.allclose(normed, reference.rms_norm(x, weight, eps))  # the residual is not ignored


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_gives_the_reference_bits(dtype):
    args = _inputs(dtype)
    for name, call in (
        ("add_rms_norm", serving_ops.add_rms_norm),
        ("silu_and_mul", serving_ops.silu_and_mul),
    ):
        pto_kernels.enable(backend="fused")
        fused = call(*args[name])
        expected = getattr(reference, name)(*args[name])
        torch.testing.assert_close(fused, expected, atol=0, rtol=0)


def test_silu_and_mul_is_silu_of_the_first_half_times_the_second():
    (gate_up,) = _inputs()["silu_and_mul"]
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(reference.silu_and_mul(gate_up), F.silu(gate) * up)
    assert not torch.allclose(reference.silu_and_mul(gate_up), F.silu(up) * gate)


def test_calls_are_counted_under_the_op_that_switches_them():
    pto_kernels.enable(backend="fused")
    args = _inputs()
    serving_ops.add_rms_norm(*args["add_rms_norm"])
    serving_ops.rms_norm(args["add_rms_norm"][0], args["add_rms_norm"][2], 1e-6)
    serving_ops.silu_and_mul(*args["silu_and_mul"])
    serving_ops.token_mrope(*_token_mrope_inputs(), SECTION, HEAD)
    stats = pto_kernels.stats()
    assert stats["rms_norm"]["backends"] == {"fused": 2}
    assert stats["swiglu_mlp"]["backends"] == {"fused": 1}
    assert stats["mrope"]["backends"] == {"fused": 1}


@pytest.mark.parametrize("backend", ["torch", "fused"])
def test_token_mrope_matches_mrope_from_its_definition(backend):
    pto_kernels.enable(backend=backend)
    query, key, cos, sin = _token_mrope_inputs()
    q, k = serving_ops.token_mrope(query, key, cos, sin, SECTION, HEAD)
    assert q.shape == query.shape and k.shape == key.shape
    torch.testing.assert_close(q, _neox_mrope(query, cos, sin, SECTION))
    torch.testing.assert_close(k, _neox_mrope(key, cos, sin, SECTION))


def test_the_definition_tells_sections_apart():
    """The check above can fail: the same tables with the sections in another order give other values."""
    query, key, cos, sin = _token_mrope_inputs()
    q, _ = serving_ops.token_mrope(query, key, cos, sin, SECTION, HEAD)
    assert not torch.allclose(q, _neox_mrope(query, cos, sin, [6, 6, 4]))


def test_npu_backend_calls_the_fused_torch_npu_ops(monkeypatch):
    npu = stand_in_torch_npu.make_module()
    monkeypatch.setitem(sys.modules, "torch_npu", npu)
    monkeypatch.setenv("PTO_KERNELS_STRICT", "1")
    pto_kernels.enable(backend="npu")
    args = _inputs()
    normed, summed = serving_ops.add_rms_norm(*args["add_rms_norm"])
    torch.testing.assert_close((normed, summed), reference.add_rms_norm(*args["add_rms_norm"]))
    torch.testing.assert_close(
        serving_ops.silu_and_mul(*args["silu_and_mul"]), reference.silu_and_mul(*args["silu_and_mul"])
    )
    assert npu.calls["npu_add_rms_norm"] == 1 and npu.calls["npu_swiglu"] == 1
    assert pto_kernels.stats()["rms_norm"]["backends"] == {"npu": 1}


def _layer_like(x, residual, weight, gate_up, query, key, cos, sin):
    normed, residual = serving_ops.add_rms_norm(x, residual, weight, 1e-6)
    q, k = serving_ops.token_mrope(query, key, cos, sin, SECTION, HEAD)
    return normed, residual, serving_ops.silu_and_mul(gate_up), q, k


def test_compiled_calls_trace_whole_are_counted_and_match_eager():
    pto_kernels.enable(backend="fused")
    x, residual, weight, _ = _inputs()["add_rms_norm"]
    args = (x, residual, weight, *_inputs()["silu_and_mul"], *_token_mrope_inputs())
    eager = _layer_like(*args)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(_layer_like)(*args)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    pto_kernels.reset_stats()
    compiled = torch.compile(_layer_like, backend="eager", fullgraph=True)(*args)
    torch.testing.assert_close(compiled, eager, atol=0, rtol=0)
    stats = pto_kernels.stats()
    assert (
        stats["rms_norm"]["calls"] == 1 and stats["swiglu_mlp"]["calls"] == 1 and stats["mrope"]["calls"] == 1
    )
