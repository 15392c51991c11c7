"""Every backend that runs here against float64 references on every golden case."""

import sys

import golden_cases as gc
import pto_kernels
import pytest
import stand_in_torch_npu
import torch

BACKENDS_HERE = ("torch", "fused", "npu")


@pytest.fixture
def backend_env(request, monkeypatch):
    """Select one backend strictly (a failing kernel raises instead of silently falling back)."""
    monkeypatch.setenv("PTO_KERNELS_STRICT", "1")
    npu = stand_in_torch_npu.make_module()
    monkeypatch.setitem(sys.modules, "torch_npu", npu)
    return npu


def _check_ran(op: str, backend: str, npu, npu_op: str) -> None:
    st = pto_kernels.stats()[op]
    assert st["backend"] == backend and st["fallbacks"] == 0, st
    if backend == "npu":
        assert npu.calls[npu_op] > 0, f"the npu backend never called torch_npu.{npu_op}"


@pytest.mark.parametrize("backend", BACKENDS_HERE)
@pytest.mark.parametrize("case", gc.load("rms_norm"), ids=gc.ids(gc.load("rms_norm")))
def test_rms_norm_golden(case, backend, backend_env):
    x, w, eps = gc.rms_norm_inputs(case)
    expected = gc.rms_norm_expected(x, w, eps)
    with pto_kernels.enabled(["rms_norm"], backend=backend):
        actual = pto_kernels.rms_norm_wrapper(x, w, eps)
    gc.check_close(actual, expected, x.dtype, f"rms_norm[{backend}] {case['id']}")
    assert actual.dtype == x.dtype
    _check_ran("rms_norm", backend, backend_env, "npu_rms_norm")


@pytest.mark.parametrize("backend", BACKENDS_HERE)
@pytest.mark.parametrize("case", gc.load("mrope"), ids=gc.ids(gc.load("mrope")))
def test_mrope_golden(case, backend, backend_env):
    q, k, cos, sin, section = gc.mrope_inputs(case)
    cos_m, sin_m = gc.mix_tables(cos, section), gc.mix_tables(sin, section)
    with pto_kernels.enabled(["mrope"], backend=backend):
        q_embed, k_embed = pto_kernels.mrope_pto_correct(q, k, cos, sin, section, unsqueeze_dim=1)
        q_mixed, k_mixed = pto_kernels.mrope_mixed_wrapper(q, k, cos_m, sin_m, unsqueeze_dim=1)
    for name, actual, x in (
        ("q", q_embed, q),
        ("k", k_embed, k),
        ("q mixed", q_mixed, q),
        ("k mixed", k_mixed, k),
    ):
        gc.check_close(
            actual, gc.rotary_expected(x, cos_m, sin_m), q.dtype, f"mrope[{backend}] {case['id']} {name}"
        )
    assert pto_kernels.stats()["mrope"]["calls"] == 2
    _check_ran("mrope", backend, backend_env, "npu_mrope")


_MLP_MODULES: dict = {}


def _shared_mlp(case):
    key = (case["seed"], case["hidden"], case["intermediate"], case["dtype"])
    if key not in _MLP_MODULES:  # the four GutenOCR-width cases share one set of weights
        _MLP_MODULES.clear()
        _MLP_MODULES[key] = gc.mlp_module(case)
    return _MLP_MODULES[key]


@pytest.mark.parametrize("backend", BACKENDS_HERE)
@pytest.mark.parametrize("case", gc.load("swiglu_mlp"), ids=gc.ids(gc.load("swiglu_mlp")))
def test_swiglu_mlp_golden(case, backend, backend_env):
    mlp, x = gc.mlp_inputs(case, _shared_mlp(case))
    expected = gc.mlp_expected(mlp, x)
    weights_before = [p.data_ptr() for p in mlp.parameters()]
    with torch.no_grad(), pto_kernels.enabled(["swiglu_mlp"], backend=backend):
        actual = pto_kernels.swiglu_mlp_wrapper(mlp, x)
    gc.check_close(actual, expected, x.dtype, f"swiglu_mlp[{backend}] {case['id']}")
    assert [p.data_ptr() for p in mlp.parameters()] == weights_before
    _check_ran("swiglu_mlp", backend, backend_env, "npu_swiglu")
