"""The decoder-layer blocks (residual_rms_norm, mlp_block, attention_prologue) on every backend that runs
here, against float64 math restated in this file, and one launch each under a dispatch counter."""

import math
import sys

import golden_cases as gc
import pto_kernels
import pytest
import stand_in_torch_npu
import torch
from torch.utils._python_dispatch import TorchDispatchMode

BACKENDS_HERE = ("torch", "fused", "npu")
HIDDEN, INTER, Q_HEADS, K_HEADS, HEAD_DIM, SECTION = 64, 128, 4, 2, 16, [2, 3, 3]
SHAPES = [(1, 1), (2, 3)]  # (batch, seq): decode, and a few rows
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture
def npu(monkeypatch):
    monkeypatch.setenv("PTO_KERNELS_STRICT", "1")  # a failing kernel raises instead of falling back
    module = stand_in_torch_npu.make_module()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return module


def _rand(gen, *shape, dtype, scale=1.0, offset=0.0):
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + offset).to(dtype)


def _linear(gen, out_features, in_features, dtype, bias=False):
    w = _rand(gen, out_features, in_features, dtype=dtype, scale=1 / math.sqrt(in_features))
    return w, (_rand(gen, out_features, dtype=dtype, scale=0.1) if bias else None)


def _norm64(x, w, eps):
    x = x.double()
    return w.double() * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _lin64(x, w, b):
    out = x.double() @ w.double().T
    return out if b is None else out + b.double()


def _mlp64(x, gate, up, down):
    g, u = _lin64(x, *gate), _lin64(x, *up)
    return _lin64(g / (1 + torch.exp(-g)) * u, *down)


def _tables(gen, batch, seq, dtype):
    positions = torch.randint(0, 4096, (3, batch, seq), generator=gen).double()
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM))
    angles = positions[..., None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("backend", BACKENDS_HERE)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_residual_rms_norm(backend, dtype, shape, npu):
    gen = torch.Generator().manual_seed(1)
    x, residual = _rand(gen, *shape, HIDDEN, dtype=dtype), _rand(gen, *shape, HIDDEN, dtype=dtype, scale=2.0)
    w = _rand(gen, HIDDEN, dtype=dtype, scale=0.2, offset=1.0)
    with pto_kernels.enabled(["residual_rms_norm"], backend=backend):
        normed, summed = pto_kernels.residual_rms_norm_wrapper(x, residual, _Norm(w))
    summed64 = residual.double() + x.double()
    gc.check_close(summed, summed64, dtype, f"residual_rms_norm[{backend}] sum")
    gc.check_close(normed, _norm64(summed64, w, 1e-6), dtype, f"residual_rms_norm[{backend}] normed")
    assert pto_kernels.stats()["residual_rms_norm"]["backends"] == {backend: 1}
    if backend == "npu":
        assert npu.calls["npu_add_rms_norm"] == 1


def _mlp_block_inputs(gen, shape, dtype, bias):
    attn = _rand(gen, *shape, Q_HEADS * HEAD_DIM, dtype=dtype)
    residual = _rand(gen, *shape, HIDDEN, dtype=dtype, scale=2.0)
    o = _linear(gen, HIDDEN, Q_HEADS * HEAD_DIM, dtype, bias)
    norm_w = _rand(gen, HIDDEN, dtype=dtype, scale=0.2, offset=1.0)
    gate, up = _linear(gen, INTER, HIDDEN, dtype, bias), _linear(gen, INTER, HIDDEN, dtype, bias)
    down = _linear(gen, HIDDEN, INTER, dtype, bias)
    return residual, attn, o, norm_w, gate, up, down


def _mlp_block_expected(residual, attn, o, norm_w, gate, up, down, eps=1e-6):
    summed = residual.double() + _lin64(attn, *o)
    return summed + _mlp64(_norm64(summed, norm_w, eps), gate, up, down)


class _Norm(torch.nn.Module):
    def __init__(self, weight, eps=1e-6):
        super().__init__()
        self.weight, self.variance_epsilon = torch.nn.Parameter(weight), eps

    def forward(self, x):
        return pto_kernels.reference.rms_norm(x, self.weight, self.variance_epsilon)


class _Mlp(torch.nn.Module):
    def __init__(self, gate, up, down, act=None):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = (
            _linear_module(*gate),
            _linear_module(*up),
            _linear_module(*down),
        )
        self.act_fn = act or torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def _linear_module(w, b):
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=b is not None, dtype=w.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
        if b is not None:
            lin.bias.copy_(b)
    return lin


def _modules(o, norm_w, gate, up, down, act=None):
    """The modules a decoder layer hands mlp_block_wrapper: o_proj, the post-attention norm, the MLP."""
    return _linear_module(*o), _Norm(norm_w), _Mlp(gate, up, down, act)


@pytest.mark.parametrize("backend", BACKENDS_HERE)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_mlp_block(backend, dtype, shape, bias, npu):
    gen = torch.Generator().manual_seed(2)
    residual, attn, o, norm_w, gate, up, down = _mlp_block_inputs(gen, shape, dtype, bias)
    o_proj, norm, mlp = _modules(o, norm_w, gate, up, down)
    with pto_kernels.enabled(["mlp_block"], backend=backend), torch.no_grad():
        out = pto_kernels.mlp_block_wrapper(residual, attn, o_proj, norm, mlp)
    gc.check_close(
        out, _mlp_block_expected(residual, attn, o, norm_w, gate, up, down), dtype, f"mlp_block[{backend}]"
    )
    assert out.dtype == dtype
    assert pto_kernels.stats()["mlp_block"]["backends"] == {backend: 1}
    if backend == "npu":
        assert npu.calls["npu_add_rms_norm"] == 1 and npu.calls["npu_swiglu"] == 1


def test_mlp_block_check_fails_on_a_wrong_result(npu):
    """The comparison above can fail: the block without its first residual add is caught."""
    gen = torch.Generator().manual_seed(2)
    residual, attn, o, norm_w, gate, up, down = _mlp_block_inputs(gen, (1, 1), torch.float32, False)
    wrong = (
        _mlp_block_expected(torch.zeros_like(residual), attn, o, norm_w, gate, up, down) + residual.double()
    )
    with pytest.raises(AssertionError, match="relative error"):
        gc.check_close(
            wrong.float(), _mlp_block_expected(residual, attn, o, norm_w, gate, up, down), torch.float32
        )


def test_mlp_block_with_another_activation_runs_the_modules_math_uncounted():
    gen = torch.Generator().manual_seed(3)
    residual, attn, o, norm_w, gate, up, down = _mlp_block_inputs(gen, (1, 2), torch.float32, False)
    o_proj, norm, mlp = _modules(o, norm_w, gate, up, down, act=torch.nn.GELU())
    with pto_kernels.enabled(["mlp_block"], backend="fused"), torch.no_grad():
        out = pto_kernels.mlp_block_wrapper(residual, attn, o_proj, norm, mlp)
        summed = residual + o_proj(attn)
        expected = summed + mlp(norm(summed))
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert pto_kernels.stats()["mlp_block"]["calls"] == 0


def _prologue_inputs(gen, shape, dtype):
    x = _rand(gen, *shape, HIDDEN, dtype=dtype, scale=2.0, offset=0.3)
    norm_w = _rand(gen, HIDDEN, dtype=dtype, scale=0.2, offset=1.0)
    q = _linear(gen, Q_HEADS * HEAD_DIM, HIDDEN, dtype, bias=True)
    k = _linear(gen, K_HEADS * HEAD_DIM, HIDDEN, dtype, bias=True)
    v = _linear(gen, K_HEADS * HEAD_DIM, HIDDEN, dtype, bias=True)
    return x, norm_w, q, k, v


def _prologue_expected(x, norm_w, q, k, v, cos_mixed, sin_mixed, eps=1e-6):
    normed = _norm64(x, norm_w, eps)
    b, s = x.shape[0], x.shape[1]
    heads = [_lin64(normed, *wb).view(b, s, -1, HEAD_DIM).transpose(1, 2) for wb in (q, k, v)]
    return (
        gc.rotary_expected(heads[0], cos_mixed, sin_mixed),
        gc.rotary_expected(heads[1], cos_mixed, sin_mixed),
        heads[2],
    )


class _Attention(torch.nn.Module):
    def __init__(self, q, k, v):
        super().__init__()
        for name, (w, b) in zip(("q_proj", "k_proj", "v_proj"), (q, k, v), strict=True):
            lin = torch.nn.Linear(w.shape[1], w.shape[0], dtype=w.dtype)
            with torch.no_grad():
                lin.weight.copy_(w)
                lin.bias.copy_(b)
            setattr(self, name, lin)
        self.head_dim = HEAD_DIM


@pytest.mark.parametrize("backend", BACKENDS_HERE)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_attention_prologue(backend, dtype, shape, npu):
    gen = torch.Generator().manual_seed(4)
    x, norm_w, q, k, v = _prologue_inputs(gen, shape, dtype)
    cos, sin = _tables(gen, *shape, dtype)
    cos_m, sin_m = gc.mix_tables(cos, SECTION), gc.mix_tables(sin, SECTION)
    attention, norm = _Attention(q, k, v), _Norm(norm_w)
    with pto_kernels.enabled(["attention_prologue"], backend=backend), torch.no_grad():
        sectioned = pto_kernels.attention_prologue_wrapper(attention, norm, x, cos, sin, SECTION)
        mixed = pto_kernels.attention_prologue_mixed_wrapper(attention, norm, x, cos_m, sin_m)
    expected = _prologue_expected(x, norm_w, q, k, v, cos_m, sin_m)
    for form, result in (("sectioned", sectioned), ("mixed", mixed)):
        for name, actual, want in zip("qkv", result, expected, strict=True):
            gc.check_close(actual, want, dtype, f"attention_prologue[{backend}] {form} {name}")
    assert pto_kernels.stats()["attention_prologue"]["backends"] == {backend: 2}
    if backend == "npu":
        # head_dim 16: npu_mrope takes it in fp32 (a multiple of 16), not in bf16 (32): BSND npu_rotary_mul
        one_kernel = dtype == torch.float32
        assert npu.calls["npu_rms_norm"] == 2 and npu.calls["npu_mrope"] == (2 if one_kernel else 0)
        assert npu.calls["npu_rotary_mul"] == (0 if one_kernel else 4) and not npu.copies


def test_attention_prologue_check_fails_on_swapped_sections(npu):
    """The comparison can fail: the tables mixed with another section order are caught."""
    gen = torch.Generator().manual_seed(4)
    x, norm_w, q, k, v = _prologue_inputs(gen, (1, 1), torch.float32)
    cos, sin = _tables(gen, 1, 1, torch.float32)
    attention, norm = _Attention(q, k, v), _Norm(norm_w)
    with pto_kernels.enabled(["attention_prologue"], backend="torch"), torch.no_grad():
        q_out, _, _ = pto_kernels.attention_prologue_wrapper(attention, norm, x, cos, sin, [3, 3, 2])
    cos_m, sin_m = gc.mix_tables(cos, SECTION), gc.mix_tables(sin, SECTION)
    with pytest.raises(AssertionError, match="relative error"):
        gc.check_close(q_out, _prologue_expected(x, norm_w, q, k, v, cos_m, sin_m)[0], torch.float32)


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("op", ["residual_rms_norm", "mlp_block", "attention_prologue"])
def test_each_block_is_one_launch_as_a_custom_op(op):
    """Called as torch.ops.pto_kernels.*, a block is one dispatched op (how a captured graph launches it),
    while its eager body dispatches many."""
    gen = torch.Generator().manual_seed(5)
    if op == "residual_rms_norm":
        args = (
            *(_rand(gen, 1, 1, HIDDEN, dtype=torch.float32) for _ in range(2)),
            _rand(gen, HIDDEN, dtype=torch.float32),
            1e-6,
        )
    elif op == "mlp_block":
        residual, attn, o, norm_w, gate, up, down = _mlp_block_inputs(gen, (1, 1), torch.float32, False)
        args = (residual, attn, *o, norm_w, 1e-6, *gate, *up, *down)
    else:
        x, norm_w, q, k, v = _prologue_inputs(gen, (1, 1), torch.float32)
        args = (x, norm_w, 1e-6, *q, *k, *v, *_tables(gen, 1, 1, torch.float32), SECTION, HEAD_DIM)
    with pto_kernels.enabled([op], backend="fused"):
        with _Count() as as_op:
            getattr(torch.ops.pto_kernels, op)(*args)
        with _Count() as eager:
            getattr(pto_kernels.reference, op)(*args)
    assert as_op.ops == [f"pto_kernels.{op}"]
    assert len(eager.ops) > 3
    assert pto_kernels.stats()[op]["calls"] == 1
