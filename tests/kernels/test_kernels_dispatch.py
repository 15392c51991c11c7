"""Switches, backend choice, stats, fallback and strict mode, caches, and that a wrong kernel fails."""

import logging
import subprocess
import sys
import textwrap

import golden_cases as gc
import pto_kernels
import pytest
import torch
from pto_kernels import _dispatch
from pto_kernels.backends import fused, pypto_pieces

KERNELS_DIR = str(gc.GOLDEN_DIR.parents[1] / "kernels")


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": KERNELS_DIR, "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize(
    "blocker",
    [
        "sys.modules['pypto'] = None; sys.modules['torch_npu'] = None",  # absent
        "class F:\n    def find_spec(self, name, *a):\n        if name in ('pypto', 'torch_npu'):\n"
        "            raise OSError('libc_sec.so: cannot open shared object file')\n"
        "sys.meta_path.insert(0, F())",  # installed but broken
    ],
    ids=["absent", "broken"],
)
def test_import_needs_torch_only(blocker):
    proc = _run_python(
        "import sys\n" + blocker + "\n"
        """
import torch, pto_kernels
x = torch.randn(2, 8)
pto_kernels.enable()
pto_kernels.rms_norm_wrapper(x, torch.ones(8))
pto_kernels.enable(backend="pypto")
pto_kernels.rms_norm_wrapper(x, torch.ones(8))
s = pto_kernels.stats()["rms_norm"]
assert s["backends"] == {"fused": 1, "torch": 1} and s["fallbacks"] == 1, s
assert "pypto" in s["first_fallback_error"], s
assert not pto_kernels._dispatch.pypto_importable()
print("OK")
"""
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr


def test_switches_default_off_and_enable_disable():
    assert (pto_kernels.USE_PTO_RMS_NORM, pto_kernels.USE_PTO_MROPE, pto_kernels.USE_PTO_SWIGLU_MLP) == (
        False,
    ) * 3
    pto_kernels.enable(["mrope", "swiglu_mlp"], backend="torch")
    assert (pto_kernels.USE_PTO_RMS_NORM, pto_kernels.USE_PTO_MROPE, pto_kernels.USE_PTO_SWIGLU_MLP) == (
        False,
        True,
        True,
    )
    assert pto_kernels.backend() == "torch"
    with pto_kernels.enabled("rms_norm", backend="fused"):
        assert pto_kernels.USE_PTO_RMS_NORM and not pto_kernels.USE_PTO_MROPE
        assert pto_kernels.backend() == "fused"
    assert pto_kernels.USE_PTO_MROPE and not pto_kernels.USE_PTO_RMS_NORM and pto_kernels.backend() == "torch"
    pto_kernels.disable()
    assert not any((pto_kernels.USE_PTO_RMS_NORM, pto_kernels.USE_PTO_MROPE, pto_kernels.USE_PTO_SWIGLU_MLP))


def test_enable_rejects_unknown_names():
    with pytest.raises(ValueError, match="rmsnorm"):
        pto_kernels.enable(["rmsnorm"])
    with pytest.raises(ValueError, match="cuda"):
        pto_kernels.enable(backend="cuda")


def test_backend_env_is_the_default(monkeypatch):
    monkeypatch.setenv("PTO_KERNELS_BACKEND", "torch")
    pto_kernels.enable()
    assert pto_kernels.backend() == "torch"
    pto_kernels.enable(backend="fused")
    assert pto_kernels.backend() == "fused"


def test_auto_picks_by_device(monkeypatch):
    assert _dispatch.resolve("auto", "cpu") == "fused"
    assert _dispatch.resolve("auto", "cuda") == "fused"
    monkeypatch.setattr(_dispatch, "_pypto_importable", True)
    assert _dispatch.resolve("auto", "npu") == "pypto"
    monkeypatch.setattr(_dispatch, "_pypto_importable", False)
    assert _dispatch.resolve("auto", "npu") == "npu"
    assert _dispatch.resolve("torch", "npu") == "torch"


def test_failing_kernel_falls_back_counted_and_logged_once(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # npu backend cannot import torch_npu
    x, w = torch.randn(3, 16), torch.randn(16)
    pto_kernels.enable(backend="npu")
    with caplog.at_level(logging.WARNING, logger="pto_kernels"):
        outs = [pto_kernels.rms_norm_wrapper(x, w) for _ in range(3)]
    s = pto_kernels.stats()["rms_norm"]
    assert (
        s["calls"] == 3 and s["fallbacks"] == 3 and s["backend"] == "torch" and s["backends"] == {"torch": 3}
    )
    assert s["first_fallback_error"].startswith("npu: ModuleNotFoundError")
    assert len([r for r in caplog.records if "failed" in r.getMessage()]) == 1
    torch.testing.assert_close(outs[0], gc.rms_norm_expected(x, w, 1e-6).float())
    pto_kernels.reset_stats()
    assert pto_kernels.stats()["rms_norm"] == {
        "calls": 0,
        "backend": None,
        "backends": {},
        "fallbacks": 0,
        "first_fallback_error": None,
        "captured": 0,
        "replays": 0,
        "cache_writes": 0,
        "pypto_kernels": {
            "built": 0,
            "compiles": 0,
            "compile_s": 0.0,
            "cache_hits": 0,
            "evicted": 0,
            "cached": 0,
        },
    }


def test_strict_mode_raises(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setenv("PTO_KERNELS_STRICT", "1")
    pto_kernels.enable(backend="npu")
    with pytest.raises(pto_kernels.KernelFailedError, match="rms_norm on backend 'npu'"):
        pto_kernels.rms_norm_wrapper(torch.randn(2, 8), torch.ones(8))


def test_stats_cover_every_op():
    assert set(pto_kernels.stats()) == {
        "rms_norm",
        "mrope",
        "swiglu_mlp",
        "residual_rms_norm",
        "mlp_block",
        "attention_prologue",
        "attention_core",
    }


def test_mrope_tables_mixed_once_per_forward():
    case = gc.load("mrope")[0]
    q, k, cos, sin, section = gc.mrope_inputs(case)
    fused.MIXED_TABLES.clear()
    before = fused.MIXED_TABLES.builds
    pto_kernels.enable(["mrope"], backend="fused")
    first = [pto_kernels.mrope_pto_correct(q, k, cos, sin, section) for _ in range(36)]  # 36 decoder layers
    assert fused.MIXED_TABLES.builds == before + 1
    cos.mul_(-1.0)  # changed in place: the version counter moves, the tables are rebuilt
    changed = pto_kernels.mrope_pto_correct(q, k, cos, sin, section)
    assert fused.MIXED_TABLES.builds == before + 2
    assert not torch.equal(changed[0], first[0][0])
    pto_kernels.mrope_pto_correct(q, k, cos.clone(), sin, section)  # a new forward's tables
    assert fused.MIXED_TABLES.builds == before + 3


def test_mlp_weights_laid_out_once_and_again_after_a_change():
    case = {"seed": 3, "hidden": 32, "intermediate": 48, "dtype": "float32", "tokens": [1, 2]}
    mlp = gc.mlp_module(case)
    layouts = pypto_pieces.WeightLayouts()
    first = layouts.get(mlp, torch.float32)
    again = layouts.get(mlp, torch.float32)
    assert layouts.builds == 1 and all(a is b for a, b in zip(first, again, strict=True))
    assert first[0].data_ptr() == mlp.gate_proj.weight.data_ptr()  # nn.Linear layout used as is: no copy
    with torch.no_grad():
        mlp.up_proj.weight.mul_(2.0)
    layouts.get(mlp, torch.float32)
    assert layouts.builds == 2


def test_fused_mlp_keeps_autograd_working():
    mlp, x = gc.mlp_inputs(
        {"seed": 5, "hidden": 16, "intermediate": 24, "dtype": "float32", "tokens": [1, 3]}
    )
    x.requires_grad_(True)
    pto_kernels.enable(backend="fused")
    pto_kernels.swiglu_mlp_wrapper(mlp, x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


# --- the comparison must reject wrong kernels ---------------------------------------------------------


def _perturbed_rms_norm(x, w, eps=1e-6):
    return fused.reference.rms_norm(x, w, eps) * 1.02


def _unwritten_rms_norm(x, w, eps=1e-6):
    out = fused.reference.rms_norm(x, w, eps).clone()
    out.view(-1)[-1] = float("nan")  # one element the kernel "forgot" to write (poisoned buffer)
    return out


def _wrong_sign_rotary(q, k, cos, sin, mrope_section, unsqueeze_dim=1):
    cos_m, sin_m = fused.reference.mix_sections(cos, sin, mrope_section, unsqueeze_dim)
    return q * cos_m - fused.reference.rotate_half(q) * sin_m, k * cos_m - fused.reference.rotate_half(
        k
    ) * sin_m


def _wrong_section_rotary(q, k, cos, sin, mrope_section, unsqueeze_dim=1):
    return fused.reference.mrope(q, k, cos, sin, list(reversed(mrope_section)), unsqueeze_dim)


@pytest.mark.parametrize("bad", [_perturbed_rms_norm, _unwritten_rms_norm], ids=["2-percent-off", "one-nan"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_wrong_rms_norm_kernel_fails(monkeypatch, bad, dtype):
    monkeypatch.setattr(fused, "rms_norm", bad)
    case = dict(gc.load("rms_norm")[0], dtype=dtype)
    x, w, eps = gc.rms_norm_inputs(case)
    pto_kernels.enable(backend="fused")
    with pytest.raises(AssertionError):
        gc.check_close(pto_kernels.rms_norm_wrapper(x, w, eps), gc.rms_norm_expected(x, w, eps), x.dtype)


@pytest.mark.parametrize("bad", [_wrong_sign_rotary, _wrong_section_rotary], ids=["sign", "section-order"])
def test_wrong_mrope_kernel_fails(monkeypatch, bad):
    monkeypatch.setattr(fused, "mrope", bad)
    q, k, cos, sin, section = gc.mrope_inputs(gc.load("mrope")[0])
    pto_kernels.enable(backend="fused")
    q_embed, _ = pto_kernels.mrope_pto_correct(q, k, cos, sin, section)
    expected = gc.rotary_expected(q, gc.mix_tables(cos, section), gc.mix_tables(sin, section))
    with pytest.raises(AssertionError):
        gc.check_close(q_embed, expected, q.dtype)


def test_wrong_mlp_kernel_fails(monkeypatch):
    def gelu_mlp(mlp, x):
        return mlp.down_proj(torch.nn.functional.gelu(mlp.gate_proj(x)) * mlp.up_proj(x))

    monkeypatch.setattr(fused, "swiglu_mlp", gelu_mlp)
    mlp, x = gc.mlp_inputs(gc.load("swiglu_mlp")[5])
    pto_kernels.enable(backend="fused")
    with torch.no_grad(), pytest.raises(AssertionError):
        gc.check_close(pto_kernels.swiglu_mlp_wrapper(mlp, x), gc.mlp_expected(mlp, x), x.dtype)


def test_independent_mixing_matches_transformers_layout():
    # the test's own table mixing against a hand-worked column map for section [2, 3, 3] (d = 16)
    table = torch.arange(3 * 16, dtype=torch.float64).reshape(3, 1, 1, 16)
    mixed = gc.mix_tables(table, [2, 3, 3])[0, 0]
    streams = [0, 0, 1, 1, 1, 2, 2, 2, 0, 0, 1, 1, 1, 2, 2, 2]
    assert mixed.tolist() == [float(s * 16 + c) for c, s in enumerate(streams)]


def test_fused_mrope_runs_under_inference_mode(monkeypatch):
    monkeypatch.setenv("PTO_KERNELS_STRICT", "1")  # a fallback would raise
    pto_kernels.enable(ops=("mrope",), backend="fused")
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 4, 5, 16, generator=gen), torch.randn(1, 2, 5, 16, generator=gen)
    cos, sin = torch.randn(3, 1, 5, 16, generator=gen), torch.randn(3, 1, 5, 16, generator=gen)
    with torch.inference_mode():
        q_embed, _ = pto_kernels.mrope_pto_correct(q, k, cos.clone(), sin.clone(), [2, 3, 3])
    from pto_kernels.backends import reference

    expected, _ = reference.mrope(q, k, cos, sin, [2, 3, 3])
    assert torch.allclose(q_embed, expected, atol=1e-6)
    assert pto_kernels.stats()["mrope"]["backends"] == {"fused": 1}


# --- routes bound at enable() ---------------------------------------------------------------------------


def test_route_is_bound_at_enable_not_per_call(monkeypatch):
    x, w = torch.randn(2, 8), torch.ones(8)
    pto_kernels.enable("rms_norm", backend="fused")
    monkeypatch.setattr(_dispatch, "resolve", lambda requested, device_type: pytest.fail("routed per call"))
    for _ in range(3):
        pto_kernels.rms_norm_wrapper(x, w)
    assert pto_kernels.stats()["rms_norm"]["backends"] == {"fused": 3}
    pto_kernels.reset_stats()  # in place: the bound route keeps counting into the same stats
    pto_kernels.rms_norm_wrapper(x, w)
    assert pto_kernels.stats()["rms_norm"]["backends"] == {"fused": 1}
    monkeypatch.undo()
    pto_kernels.enable("rms_norm", backend="torch")  # a new backend is a new route
    pto_kernels.rms_norm_wrapper(x, w)
    assert pto_kernels.stats()["rms_norm"]["backends"] == {"fused": 1, "torch": 1}
    assert pto_kernels.stats()["rms_norm"]["backend"] == "torch"


def test_auto_routes_other_devices_once_per_device_type(monkeypatch):
    resolved = []

    def resolve(requested, device_type):
        resolved.append(device_type)
        return "torch" if device_type == "meta" else "fused"

    monkeypatch.setattr(_dispatch, "resolve", resolve)
    pto_kernels.enable("rms_norm", backend="auto")
    w = torch.ones(8)
    for _ in range(3):
        pto_kernels.rms_norm_wrapper(torch.randn(2, 8), w)
        pto_kernels.rms_norm_wrapper(torch.empty(2, 8, device="meta"), w.to("meta"))
    assert pto_kernels.stats()["rms_norm"]["backends"] == {"fused": 3, "torch": 3}
    assert resolved.count("meta") == 1
    pto_kernels.disable()
    pto_kernels.enable("rms_norm", backend="auto")  # rebinding forgets the device types seen
    pto_kernels.rms_norm_wrapper(torch.empty(2, 8, device="meta"), w.to("meta"))
    assert resolved.count("meta") == 2


def test_enabled_block_restores_the_bound_backend():
    x, w = torch.randn(2, 8), torch.ones(8)
    pto_kernels.enable("rms_norm", backend="torch")
    with pto_kernels.enabled("rms_norm", backend="fused"):
        pto_kernels.rms_norm_wrapper(x, w)
    pto_kernels.rms_norm_wrapper(x, w)
    assert pto_kernels.stats()["rms_norm"]["backends"] == {"fused": 1, "torch": 1}
