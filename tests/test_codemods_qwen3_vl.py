"""The codemods Qwen3-VL adds, on small sources: before / after, a no-op, and what they leave alone."""

from __future__ import annotations

from textwrap import dedent

import libcst as cst
import pytest

from pto_patch.model.spec import load_spec
from pto_patch.patching.codemods import PatchContext
from pto_patch.patching.codemods.inject_mrope import InjectMrope
from pto_patch.patching.codemods.sub_model_from_config import BUILD_FUNCTION, SubModelFromConfig, sub_models

FILE = "modeling_qwen3_vl.py"

TOWERS = """\
    from ..auto.modeling_auto import AutoModel
    from .configuration_qwen3_vl import Qwen3VLConfig, Qwen3VLTextConfig, Qwen3VLVisionConfig


    class Qwen3VLPreTrainedModel(PreTrainedModel):
        config: Qwen3VLConfig


    class Qwen3VLVisionModel(Qwen3VLPreTrainedModel):
        config: Qwen3VLVisionConfig


    class Qwen3VLTextModel(Qwen3VLPreTrainedModel):
        config: Qwen3VLTextConfig


    class Qwen3VLModel(Qwen3VLPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.visual = AutoModel.from_config(config.vision_config)
            self.language_model = AutoModel.from_config(config.text_config)
    """


@pytest.fixture(scope="module")
def ctx() -> PatchContext:
    return PatchContext(spec=load_spec("qwen3_vl_4b_instruct"), release="9.9.9", source_sha256="ab" * 32)


def run(codemod, source: str, ctx: PatchContext) -> str:
    return codemod.transform(cst.parse_module(dedent(source)), ctx, FILE).code


def test_sub_models_are_the_classes_one_config_annotation_names_but_the_base_models():
    assert sub_models(cst.parse_module(dedent(TOWERS))) == {
        "Qwen3VLVisionConfig": "Qwen3VLVisionModel",
        "Qwen3VLTextConfig": "Qwen3VLTextModel",
    }


def test_sub_model_from_config_points_the_calls_at_the_renamed_classes(ctx):
    after = run(SubModelFromConfig(), TOWERS, ctx)
    assert "AutoModel.from_config(config.vision_config)" not in after.split(f"def {BUILD_FUNCTION}")[0]
    assert f"self.visual = {BUILD_FUNCTION}(config.vision_config)" in after
    assert f"self.language_model = {BUILD_FUNCTION}(config.text_config)" in after
    table = '{"Qwen3Vl4BInstructVisionConfig": Qwen3VLVisionModel, "Qwen3Vl4BInstructTextConfig": Qwen3VLTextModel}'
    assert f"model_class = {table}.get(type(config).__name__)" in after
    compile(after, FILE, "exec")


def test_sub_model_from_config_builds_by_the_config_class_name():
    """The appended function, run: a config of the renamed class name builds its model; another goes to
    AutoModel."""
    module = cst.parse_module(dedent(TOWERS))
    after = SubModelFromConfig().transform(module, PatchContext(spec=load_spec("qwen3_vl_4b_instruct")), FILE)
    function = next(
        s for s in after.body if isinstance(s, cst.FunctionDef) and s.name.value == BUILD_FUNCTION
    )
    built = []

    class Model:
        @classmethod
        def _from_config(cls, config, **kwargs):
            built.append((cls.__name__, type(config).__name__))
            return cls

    class AutoModel:
        @staticmethod
        def from_config(config, **kwargs):
            built.append(("AutoModel", type(config).__name__))

    scope = {
        "Qwen3VLVisionModel": type("Qwen3VLVisionModel", (Model,), {}),
        "Qwen3VLTextModel": type("Qwen3VLTextModel", (Model,), {}),
        "AutoModel": AutoModel,
    }
    exec(cst.Module(body=[function]).code, scope)
    scope[BUILD_FUNCTION](type("Qwen3Vl4BInstructVisionConfig", (), {})())
    scope[BUILD_FUNCTION](type("Qwen3VLVisionConfig", (), {})())
    assert built == [
        ("Qwen3VLVisionModel", "Qwen3Vl4BInstructVisionConfig"),
        ("AutoModel", "Qwen3VLVisionConfig"),
    ]


def test_sub_model_from_config_noop(ctx):
    without_auto_model = TOWERS.replace("AutoModel.from_config", "Qwen3VLVisionModel._from_config")
    assert run(SubModelFromConfig(), without_auto_model, ctx) == dedent(without_auto_model)
    once = run(SubModelFromConfig(), TOWERS, ctx)
    assert run(SubModelFromConfig(), once, ctx) == once


def test_inject_mrope_takes_the_mixed_tables_behind_an_unused_position_ids(ctx):
    before = """\
        def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            cos = cos.unsqueeze(unsqueeze_dim)
        """
    after = run(InjectMrope(), before, ctx)
    assert "return pto_kernels.mrope_mixed_wrapper(q, k, cos, sin, unsqueeze_dim)" in after
    assert "position_ids" not in after.split("mrope_mixed_wrapper")[1]
    assert run(InjectMrope(), after, ctx) == after
