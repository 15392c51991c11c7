"""The stand-in `kernels` (tests/stand_in_kernels/) refuses what the real one refuses, and has every name
transformers 5.25 imports from it; loaded under another module name, so no other test sees a `kernels`."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.release_envs import EnvUnavailable, release_env

STAND_IN = Path(__file__).resolve().parent / "stand_in_kernels" / "kernels" / "__init__.py"


@pytest.fixture(scope="module")
def kernels():
    name = "stand_in_kernels_under_test"
    spec = importlib.util.spec_from_file_location(name, STAND_IN)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(name, None)


class Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))
        self.variance_epsilon = 1e-6

    def forward(self, hidden_states):
        return hidden_states * 2


def mapped(kernels, layer_name: str, device: str = "cpu"):
    repo = kernels.LayerRepository("kernels-community/liger-kernels", layer_name=layer_name, version=4)
    return kernels.use_kernel_mapping({"Norm": {device: repo}}, inherit_mapping=False)


def test_transformers_5_25_finds_every_name_it_imports(kernels):
    try:
        site = release_env("5.25.0").site
    except EnvUnavailable as exc:
        pytest.skip(str(exc))
    tree = ast.parse((site / "transformers" / "integrations" / "hub_kernels.py").read_text(encoding="utf-8"))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "kernels"
        for alias in node.names
    }
    assert imported >= {"kernelize", "LayerRepository", "Mode", "use_kernel_forward_from_hub"}, imported
    assert sorted(name for name in imported if not hasattr(kernels, name)) == []


def test_a_repository_takes_exactly_one_of_revision_and_version(kernels):
    with pytest.raises(ValueError, match="not both"):
        kernels.LayerRepository("r/x", layer_name="X", revision="main", version=1)
    with pytest.raises(ValueError, match="must be specified"):
        kernels.LayerRepository("r/x", layer_name="X")


def test_modes_that_exclude_each_other_and_a_fallback_kernelize(kernels):
    with pytest.raises(ValueError, match="mutually exclusive"):
        kernels.Mode.INFERENCE | kernels.Mode.TRAINING
    with pytest.raises(ValueError, match="FALLBACK"):
        kernels.kernelize(nn.Linear(2, 2), mode=kernels.Mode.FALLBACK, device="cpu")
    with pytest.raises(ValueError, match="Unsupported device type"):
        kernels.kernelize(nn.Linear(2, 2), mode=kernels.Mode.INFERENCE, device="gpu")


def test_kernelize_sets_the_hub_forward_on_the_instance(kernels):
    kernels.use_kernel_forward_from_hub("Norm")(Norm)
    model = nn.Sequential(Norm())
    with mapped(kernels, "LigerRMSNorm"):
        kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu")
    forward = model[0].__dict__["forward"]
    assert forward.__func__.__qualname__.endswith("LigerRMSNorm.forward")
    x = torch.randn(3, 4)
    assert not torch.equal(model(x), x * 2)  # no longer the class's own forward


def test_no_mapping_for_the_device_falls_back_or_refuses(kernels):
    kernels.use_kernel_forward_from_hub("Norm")(Norm)
    model = nn.Sequential(Norm())
    with mapped(kernels, "LigerRMSNorm", device="npu"):
        kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu")
        assert model[0].__dict__["forward"].__func__ is Norm.forward
        with pytest.raises(ValueError, match="No layer mapping"):
            kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu", use_fallback=False)


def test_a_layer_not_on_the_hub_or_not_stateless_is_refused(kernels):
    with pytest.raises(FileNotFoundError, match="not on the stand-in hub"):
        kernels.get_kernel("someone/else", version=1)
    kernels.use_kernel_forward_from_hub("Norm")(Norm)

    class Stateful(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, hidden_states):
            return hidden_states

    class OtherArity(nn.Module):
        def forward(self, hidden_states, residual):
            return hidden_states

    for layer, message in ((Stateful, "must not override"), (OtherArity, "different number of arguments")):
        kernels.STAND_IN_HUB["test/bad"] = lambda layer=layer: type(
            "Kernel", (), {"layers": type("Layers", (), {"Bad": layer})}
        )
        repo = kernels.LayerRepository("test/bad", layer_name="Bad", version=1)
        with kernels.use_kernel_mapping({"Norm": {"cpu": repo}}, inherit_mapping=False):
            with pytest.raises(TypeError, match=message):
                kernels.kernelize(nn.Sequential(Norm()), mode=kernels.Mode.INFERENCE, device="cpu")
    del kernels.STAND_IN_HUB["test/bad"]


def test_a_hub_decorated_function_becomes_a_module_that_calls_it(kernels):
    def rotate(q, k):
        return q + 1, k + 1

    layer = kernels.use_kernel_forward_from_hub("rotary_pos_emb")(rotate)
    assert isinstance(layer, nn.Module) and type(layer).kernel_layer_name == "rotary_pos_emb"
    assert layer(torch.zeros(1), torch.zeros(1))[0].item() == 1.0
