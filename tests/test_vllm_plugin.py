"""The vLLM plugin without vLLM: its switch, its idempotent registration, every platform path, and its turn
after vllm-ascend, against the stand-in registry in tests/stand_in_vllm.py (vLLM itself: tests/vllm_lane/)."""

from __future__ import annotations

import logging

import pytest
import stand_in_vllm as vllm
import torch

from pto_patch.errors import EXIT_USAGE
from pto_patch.serving import vllm_plugin
from pto_patch.serving.vllm_layers import PLATFORM_FORWARDS, is_pto_layer
from pto_patch.serving.vllm_plugin import SERVED_OPS, PluginSettingsError, plugin_settings, take_turn

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def kernels(monkeypatch):
    """pto_kernels with every op on (fused), the stand-in registry empty and its register_oot unhooked."""
    for name in ("PTO_KERNELS_STRICT", "PTO_KERNELS_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    pto_kernels = vllm_plugin.import_kernels()
    pto_kernels.enable(backend="fused")
    pto_kernels.reset_stats()
    original = vllm.CustomOp.__dict__["register_oot"]
    vllm.reset()
    yield pto_kernels
    vllm.CustomOp.register_oot = original
    vllm.reset()
    pto_kernels.disable()
    pto_kernels.enable(ops=(), backend="auto")


def _calls(pto_kernels) -> dict[str, int]:
    """Calls of the ops vLLM's layers can run (the decoder-layer blocks never run there)."""
    return {op: entry["calls"] for op, entry in pto_kernels.stats().items() if op in SERVED_OPS}


def _inputs():
    torch.manual_seed(0)
    return {
        "RMSNorm": ((torch.randn(5, 64), torch.randn(5, 64)), lambda: vllm.RMSNorm(64)),
        "SiluAndMul": ((torch.randn(5, 96),), lambda: vllm.SiluAndMul()),
        "MRotaryEmbedding": (
            (torch.randint(0, 64, (3, 5)), torch.randn(5, 4 * 32), torch.randn(5, 2 * 32)),
            lambda: vllm.MRotaryEmbedding(32, [4, 6, 6]),
        ),
    }


# --- the switch ----------------------------------------------------------------------------------


def test_unset_or_empty_switches_nothing_on():
    assert plugin_settings({}).ops == ()
    assert plugin_settings({"PTO_KERNELS_VLLM_OPS": " "}).keys() == ()


def test_all_and_lists_name_ops_and_the_layers_they_replace():
    settings = plugin_settings({"PTO_KERNELS_VLLM_OPS": "all", "PTO_KERNELS_BACKEND": "Torch"})
    assert settings.ops == ("rms_norm", "mrope", "swiglu_mlp") and settings.backend == "torch"
    settings = plugin_settings({"PTO_KERNELS_VLLM_OPS": "swiglu_mlp, rms_norm"})
    assert settings.ops == ("rms_norm", "swiglu_mlp") and settings.keys() == ("RMSNorm", "SiluAndMul")


@pytest.mark.parametrize(
    "environ, named",
    [
        ({"PTO_KERNELS_VLLM_OPS": "rms_norm,silu"}, "'silu'"),
        ({"PTO_KERNELS_VLLM_OPS": ","}, "PTO_KERNELS_VLLM_OPS=','"),
        ({"PTO_KERNELS_VLLM_OPS": "all", "PTO_KERNELS_BACKEND": "cuda"}, "PTO_KERNELS_BACKEND='cuda'"),
    ],
)
def test_an_unknown_op_or_backend_is_an_error_naming_it(environ, named):
    with pytest.raises(PluginSettingsError) as raised:
        plugin_settings(environ)
    assert named in raised.value.message and raised.value.hint and raised.value.exit_code == EXIT_USAGE


def test_register_with_the_switch_unset_registers_nothing(kernels, monkeypatch):
    monkeypatch.delenv("PTO_KERNELS_VLLM_OPS", raising=False)
    vllm_plugin.register()  # returns before importing vLLM, which is absent here
    assert vllm.registry() == {}


def test_register_with_a_bad_switch_raises_at_start_up(monkeypatch):
    monkeypatch.setenv("PTO_KERNELS_VLLM_OPS", "rmsnorm")
    with pytest.raises(PluginSettingsError, match="rmsnorm"):
        vllm_plugin.register()


# --- registration --------------------------------------------------------------------------------


def test_each_key_gets_a_pto_class_over_vllms_own_and_registering_again_changes_nothing(kernels):
    first = take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)
    second = take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)  # vLLM may load plugins twice
    assert first == second
    for key, cls in first.items():
        assert is_pto_layer(cls) and issubclass(cls, vllm.IN_TREE[key]) and cls.name == key


def test_without_the_plugin_taking_turns_a_second_registration_fails():
    """The stand-in refuses a taken key as vLLM does: what registering before vllm-ascend would cause."""
    vllm.reset()
    vllm.CustomOp.register_oot(_decorated_op_cls=vllm.RMSNorm, name="RMSNorm")
    with pytest.raises(AssertionError, match="Duplicate op name: RMSNorm"):
        vllm.register_ascend_customop()
    vllm.reset()


@pytest.mark.parametrize("platform", ["cpu", "cuda", "oot", "compiled"])
@pytest.mark.parametrize("key", ["RMSNorm", "SiluAndMul", "MRotaryEmbedding"])
def test_every_platform_path_runs_pto_kernels_and_computes_what_vllms_class_does(kernels, key, platform):
    args, build = _inputs()[key]
    expected = build().forward_native(*args)  # vLLM's class, nothing registered yet
    take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)
    vllm.PLATFORM["name"] = platform
    layer = build()
    assert is_pto_layer(type(layer)) and layer.pto_kernels_on
    torch.testing.assert_close(layer(*args), expected)
    op = type(layer).pto_kernels_op
    assert _calls(kernels)[op] == 1


def test_every_forward_vllm_dispatches_to_is_routed():
    from pto_patch.serving.vllm_layers import PtoLayer

    assert {name for name in dir(vllm.CustomOp) if name.startswith("forward_")} <= set(PLATFORM_FORWARDS)
    for name in PLATFORM_FORWARDS:
        assert name in PtoLayer.__dict__


def test_the_residual_form_returns_the_norm_and_the_sum(kernels):
    take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)
    (x, residual), _ = _inputs()["RMSNorm"]
    normed, summed = vllm.RMSNorm(64)(x, residual)
    torch.testing.assert_close(summed, x + residual)
    torch.testing.assert_close(normed, vllm.RMSNorm(64).forward_native(x + residual))


def test_a_layer_built_with_its_op_off_runs_the_class_underneath(kernels):
    kernels.enable(["mrope"], backend="fused")
    take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)
    (x, residual), _ = _inputs()["RMSNorm"]
    layer = vllm.RMSNorm(64)
    assert is_pto_layer(type(layer)) and not layer.pto_kernels_on
    layer(x, residual)
    assert _calls(kernels)["rms_norm"] == 0


def test_configurations_the_kernels_do_not_compute_run_the_class_underneath(kernels):
    take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)
    assert not vllm.RMSNorm(64, has_weight=False).pto_kernels_on
    (positions, query, key), build = _inputs()["MRotaryEmbedding"]
    rope = build()
    offsets = torch.ones_like(positions)
    expected = vllm.MRotaryEmbedding.forward_native(rope, positions, query, key, offsets)
    torch.testing.assert_close(rope(positions, query, key, offsets), expected)  # offsets: not the kernel's
    assert _calls(kernels)["mrope"] == 0


# --- beside vllm-ascend --------------------------------------------------------------------------


def test_vllm_ascend_registering_after_the_plugin_goes_through_and_pto_kernels_runs_in_front(kernels, caplog):
    take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)  # general plugins load first
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.pto_kernels"):
        vllm.register_ascend_customop()  # then vllm-ascend's worker: no "Duplicate op name"
    vllm.PLATFORM["name"] = "oot"
    for key, ascend in vllm.ASCEND.items():
        cls = vllm.registry()[key]
        assert is_pto_layer(cls) and issubclass(cls, ascend) and cls.name == key
        assert f"vllm_ascend.ops.{ascend.__qualname__}" in caplog.text
        args, build = _inputs()[key]
        layer = build()
        layer(*args)
        assert ascend.calls == 0  # pto_kernels ran, not the Ascend forward underneath
    assert all(calls == 1 for calls in _calls(kernels).values())


def test_beside_vllm_ascend_what_pto_kernels_does_not_compute_runs_ascends_forward(kernels):
    take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)
    vllm.register_ascend_customop()
    vllm.PLATFORM["name"] = "oot"
    (x, _), _ = _inputs()["RMSNorm"]
    vllm.RMSNorm(64, has_weight=False)(x)
    assert vllm.AscendRMSNorm.calls == 1 and _calls(kernels)["rms_norm"] == 0


def test_vllm_ascend_registered_before_the_plugin_is_wrapped_at_once(kernels, caplog):
    vllm.register_ascend_customop()
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.pto_kernels"):
        registered = take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)
    assert all(issubclass(registered[key], vllm.ASCEND[key]) for key in registered)
    assert "AscendSiluAndMul" in caplog.text
    assert take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE) == registered


def test_other_keys_register_as_before(kernels):
    take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)

    class QuickGELU(vllm.CustomOp):
        pass

    vllm.CustomOp.register_oot(_decorated_op_cls=QuickGELU, name="QuickGELU")
    assert vllm.registry()["QuickGELU"] is QuickGELU
    with pytest.raises(AssertionError, match="Duplicate op name: QuickGELU"):
        vllm.CustomOp.register_oot(_decorated_op_cls=QuickGELU, name="QuickGELU")


@pytest.mark.parametrize("text", ["mlp_block", "rms_norm,attention_prologue"])
def test_a_decoder_layer_block_in_the_environment_is_refused(text):
    with pytest.raises(vllm_plugin.PluginSettingsError, match="decoder-layer block") as caught:
        vllm_plugin.plugin_settings({vllm_plugin.OPS_ENV: text})
    assert "rms_norm, mrope, swiglu_mlp" in caught.value.hint


def test_all_means_the_ops_vllm_can_run():
    assert vllm_plugin.plugin_settings({vllm_plugin.OPS_ENV: "all"}).ops == (
        "rms_norm",
        "mrope",
        "swiglu_mlp",
    )


# --- vLLM releases: the registry in either shape -------------------------------------------------


@pytest.mark.parametrize("release", vllm.RELEASES)
def test_register_finds_the_registry_in_the_shape_of_each_vllm_release(kernels, monkeypatch, caplog, release):
    vllm.reset(release)
    vllm.install(monkeypatch)
    monkeypatch.setenv("PTO_KERNELS_VLLM_OPS", "all")
    monkeypatch.setenv("PTO_KERNELS_BACKEND", "fused")
    with caplog.at_level(logging.INFO, logger="vllm.plugins.pto_kernels"):
        vllm_plugin.register()
        vllm.register_ascend_customop()  # vllm-ascend's worker, after the general plugins
    assert f"vLLM {release} (" in caplog.text
    for key, ascend in vllm.ASCEND.items():
        assert is_pto_layer(vllm.registry()[key]) and issubclass(vllm.registry()[key], ascend)


def test_each_shape_of_the_stand_in_lacks_the_other_registry():
    """The <= 0.13 stand-in has no module attribute and the >= 0.16 one no class attribute: a plugin that read
    one place only would fail against one of them."""
    vllm.reset("0.13.0")
    assert not hasattr(vllm, "op_registry_oot") and "op_registry_oot" in vars(vllm.CustomOp)
    vllm.reset("0.16.0")
    assert hasattr(vllm, "op_registry_oot") and "op_registry_oot" not in vars(vllm.CustomOp)


def test_a_vllm_without_either_registry_is_refused_with_its_release_named(kernels, monkeypatch):
    vllm.reset("0.16.0")
    vllm.install(monkeypatch)
    monkeypatch.delattr(vllm, "op_registry_oot")
    with pytest.raises(vllm_plugin.RegistryNotFoundError, match="vLLM 0.16.0 has no out-of-tree") as raised:
        vllm_plugin.oot_registry(vllm)
    assert "PTO_KERNELS_VLLM_OPS" in raised.value.hint


# --- beside vllm-ascend: what its layers take and run --------------------------------------------


def test_the_mrope_fallback_calls_vllm_ascends_three_argument_forward_oot(kernels):
    take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)
    vllm.register_ascend_customop()
    vllm.PLATFORM["name"] = "oot"
    (positions, query, _), build = _inputs()["MRotaryEmbedding"]
    rope = build()
    assert rope.pto_kernels_on
    out, no_key = rope(positions, query, None)  # no key: not the kernel's, so vllm-ascend's forward_oot
    assert no_key is None and vllm.AscendMRotaryEmbedding.calls == 1
    torch.testing.assert_close(out, vllm.MRotaryEmbedding.forward_native(rope, positions, query)[0])


def test_gutenocrs_sections_are_left_to_vllm_ascends_npu_mrope_and_the_log_says_so(kernels, caplog):
    take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)
    vllm.register_ascend_customop()
    vllm.PLATFORM["name"] = "oot"
    torch.manual_seed(0)
    positions, query, key = torch.randint(0, 64, (3, 4)), torch.randn(4, 2 * 128), torch.randn(4, 128)
    with caplog.at_level(logging.INFO, logger="vllm.plugins.pto_kernels"):
        rope = vllm.MRotaryEmbedding(128, [16, 24, 24])
    assert not rope.pto_kernels_on and "npu_mrope" in rope.pto_runs
    assert (
        "AscendMRotaryEmbedding (mrope_section [16, 24, 24]: one torch_npu.npu_mrope kernel)" in caplog.text
    )
    rope(positions, query, key)
    assert vllm.AscendMRotaryEmbedding.npu_mrope_calls == 1 and _calls(kernels)["mrope"] == 0
    assert vllm.MRotaryEmbedding(32, [4, 6, 6]).pto_kernels_on  # other sections: pto_kernels runs them


def test_gutenocrs_sections_without_vllm_ascend_run_pto_kernels(kernels):
    take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)
    assert vllm.MRotaryEmbedding(128, [16, 24, 24]).pto_kernels_on


@pytest.mark.parametrize("residual", [False, True])
def test_a_norm_with_vllm_ascends_bias_keeps_the_bias(kernels, residual):
    take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)
    vllm.register_ascend_customop()
    vllm.PLATFORM["name"] = "oot"
    (x, res), _ = _inputs()["RMSNorm"]
    norm = vllm.RMSNorm(64)
    assert norm.pto_kernels_on  # no bias (an unquantized checkpoint): pto_kernels runs it
    vllm.QUANT_CONFIG["norm.bias"] = True
    biased = vllm.RMSNorm(64)
    biased.load_bias(torch.full((64,), 0.25))
    assert not biased.pto_kernels_on and "a norm bias" in biased.pto_runs
    got = biased(x, res) if residual else biased(x)
    plain = (
        vllm.RMSNorm.forward_native(biased, x, res) if residual else vllm.RMSNorm.forward_native(biased, x)
    )
    expected = (plain[0] + 0.25, plain[1]) if residual else plain + 0.25
    torch.testing.assert_close(got, expected)
    assert _calls(kernels)["rms_norm"] == 0


def test_a_cos_sin_cache_matched_in_place_is_read_from_the_layer(kernels, monkeypatch):
    """vLLM releases whose `_match_cos_sin_cache_dtype` sets the attribute and returns None."""
    take_turn(vllm.CustomOp, vllm.registry(), vllm.IN_TREE)
    (positions, query, key), build = _inputs()["MRotaryEmbedding"]
    rope = build()
    expected = vllm.MRotaryEmbedding.forward_native(rope, positions, query, key)
    monkeypatch.setattr(rope, "_match_cos_sin_cache_dtype", lambda query: None)
    torch.testing.assert_close(rope(positions, query, key), expected)
    assert _calls(kernels)["mrope"] == 1


def test_the_stand_ins_refuse_what_vllm_and_vllm_ascend_refuse():
    """vllm-ascend's forward_oot takes no offsets; a registry read in the other release's place is absent."""
    vllm.reset("0.13.0")
    (positions, query, key), _ = _inputs()["MRotaryEmbedding"]
    rope = vllm.AscendMRotaryEmbedding(32, [4, 6, 6])
    with pytest.raises(TypeError):
        rope.forward_oot(positions, query, key, None)
    with pytest.raises(AttributeError):
        vllm.op_registry_oot  # noqa: B018 - the module attribute came with vLLM 0.16
    vllm.reset()
