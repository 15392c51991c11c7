"""Each codemod on small sources: before / after, a no-op, and the failure when its anchor is missing."""

from __future__ import annotations

import sys
import types
from textwrap import dedent

import libcst as cst
import pytest

from pto_patch.errors import AnchorNotFoundError, SpecError
from pto_patch.model.injections_found import find_injections
from pto_patch.model.spec import load_spec
from pto_patch.patching.codemods import PatchContext, rewrite_configuration, rewrite_modeling
from pto_patch.patching.codemods.absolute_imports import AbsoluteImports
from pto_patch.patching.codemods.banner import Banner
from pto_patch.patching.codemods.checkpoint_conversion import REGISTER_FUNCTION, CheckpointConversion
from pto_patch.patching.codemods.inject_mrope import InjectMrope
from pto_patch.patching.codemods.inject_rms_norm import InjectRmsNorm
from pto_patch.patching.codemods.inject_swiglu_mlp import InjectSwigluMlp
from pto_patch.patching.codemods.node_walk import copy_on_write, find_all
from pto_patch.patching.codemods.rename_classes import RenameClasses
from tests.helpers.decoder_source import DECODER

FILE = "modeling_qwen2_5_vl.py"


@pytest.fixture(scope="module")
def ctx() -> PatchContext:
    return PatchContext(spec=load_spec("gutenocr_3b"), release="9.9.9", source_sha256="ab" * 32)


def run(codemod, source: str, ctx: PatchContext) -> str:
    return codemod.transform(cst.parse_module(dedent(source)), ctx, FILE).code


def guard(switch: str, call: str, indent: str = "    ") -> str:
    return (
        f'{indent}pto_kernels = sys.modules.get("pto_kernels")\n'
        f'{indent}if pto_kernels is not None and getattr(pto_kernels, "{switch}", False):\n'
        f"{indent}    return pto_kernels.{call}\n"
    )


# --- absolute_imports ---------------------------------------------------------------------------


def test_absolute_imports_resolves_every_relative_import_but_the_sibling_configuration(ctx):
    before = """\
        from ... import initialization as init
        from ...modeling_utils import PreTrainedModel
        from ..qwen2.modeling_qwen2 import Qwen2RMSNorm
        from .configuration_qwen2_5_vl import Qwen2_5_VLConfig
        from .processing_qwen2_5_vl import Processor


        def load():
            from ...utils.generic import check_model_inputs

            return check_model_inputs
        """
    after = """\
        from transformers import initialization as init
        from transformers.modeling_utils import PreTrainedModel
        from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
        from .configuration_qwen2_5_vl import Qwen2_5_VLConfig
        from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Processor


        def load():
            from transformers.utils.generic import check_model_inputs

            return check_model_inputs
        """
    assert run(AbsoluteImports(), before, ctx) == dedent(after)


def test_absolute_imports_noop(ctx):
    source = "import torch\nfrom transformers.utils import logging\nfrom .configuration_qwen2_5_vl import C\n"
    assert run(AbsoluteImports(), source, ctx) == source


def test_absolute_imports_fails_above_the_transformers_package(ctx):
    with pytest.raises(AnchorNotFoundError, match="9.9.9"):
        run(AbsoluteImports(), "from .... import outside\n", ctx)


# --- rename_classes -----------------------------------------------------------------------------


def test_rename_classes_renames_definitions_references_and_class_name_lists(ctx):
    before = '''\
        import transformers
        from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
        from .configuration_qwen2_5_vl import Qwen2_5_VLConfig


        class Qwen2MLP(nn.Module):
            """Qwen2MLP stays in free text."""


        class Qwen2_5_VLModel(Qwen2_5_VLPreTrainedModel):
            config: Qwen2_5_VLConfig
            _no_split_modules = ["Qwen2MLP", "Other"]

            def __init__(self, config):
                self.mlp = Qwen2MLP(config, Qwen2MLP=1)
                self.norm = Qwen2RMSNorm(4)
                self.builtin = transformers.Qwen2MLP


        __all__ = ["Qwen2_5_VLModel"]
        '''
    after = '''\
        import transformers
        from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
        from .configuration_qwen2_5_vl import GutenOcr3BVLConfig


        class GutenOcr3BMLP(nn.Module):
            """Qwen2MLP stays in free text."""


        class GutenOcr3BVLModel(Qwen2_5_VLPreTrainedModel):
            config: GutenOcr3BVLConfig
            _no_split_modules = ["GutenOcr3BMLP", "Other"]

            def __init__(self, config):
                self.mlp = GutenOcr3BMLP(config, Qwen2MLP=1)
                self.norm = Qwen2RMSNorm(4)
                self.builtin = transformers.Qwen2MLP


        __all__ = ["GutenOcr3BVLModel"]
        '''
    # Qwen2_5_VLPreTrainedModel is neither defined nor imported from the sibling here: left alone
    assert run(RenameClasses(), before, ctx) == dedent(after)


def test_rename_classes_reaches_names_in_fstrings_and_nested_scopes_only(ctx):
    # CLASS stands for the renamed class; the literal Qwen2MLP (a string, another name) stays
    source = """\
        class CLASS:
            pass


        if True:
            try:
                label = f"{CLASS.__name__}: {'Qwen2MLP'}"
            except Exception as Qwen2MLP_error:
                raise TypeError(CLASS) from Qwen2MLP_error


        def make(CLASS=CLASS):
            return lambda: [CLASS for _ in range(1)]
        """
    before, after = (dedent(source).replace("CLASS", name) for name in ("Qwen2MLP", "GutenOcr3BMLP"))
    assert run(RenameClasses(), before, ctx) == after


def test_rename_rebuilds_only_the_statements_it_changes(ctx):
    """Copy on write: an untouched statement is the very object the parser made (libcst's own
    transformers rebuild every node, which is what made this pass slow)."""
    module = cst.parse_module("class Qwen2MLP:\n    pass\n\n\ndef other(x):\n    return x + 1\n")
    renamed = RenameClasses().transform(module, ctx, FILE)
    assert renamed.body[0] is not module.body[0] and renamed.body[0].name.value == "GutenOcr3BMLP"
    assert renamed.body[1] is module.body[1]
    assert RenameClasses().transform(cst.parse_module("x = 1\n"), ctx, FILE).code == "x = 1\n"


def test_node_walk_finds_in_source_order_and_skips_formatting():
    module = cst.parse_module("a = b(c, d)  # e\n")
    names = [node.value for node in find_all(module, lambda node: isinstance(node, cst.Name))]
    assert names == ["a", "b", "c", "d"]
    assert not find_all(module, lambda node: isinstance(node, cst.Comment | cst.Comma))
    same = copy_on_write(module, lambda node: node if isinstance(node, cst.Name) else None)
    assert same is module


def test_rename_classes_noop(ctx):
    source = "class Unrelated:\n    pass\n\n\n__all__ = ['Unrelated']\n"
    assert run(RenameClasses(), source, ctx) == source


def test_rename_classes_refuses_a_new_name_that_is_already_taken(ctx):
    source = "from transformers import GutenOcr3BMLP\n\n\nclass Qwen2MLP:\n    pass\n"
    with pytest.raises(SpecError, match="GutenOcr3BMLP"):
        run(RenameClasses(), source, ctx)


def test_rename_classes_refuses_two_classes_renamed_alike(ctx):
    # "Qwen2_5_VL" -> "GutenOcr3BVL" and "Qwen2" -> "GutenOcr3B" both give GutenOcr3BVLFoo
    source = "class Qwen2_5_VLFoo:\n    pass\n\n\nclass Qwen2VLFoo:\n    pass\n"
    with pytest.raises(SpecError, match="GutenOcr3BVLFoo"):
        run(RenameClasses(), source, ctx)


def test_rewrite_configuration_renames_and_absolutizes(ctx):
    source = dedent(
        """\
        from ...configuration_utils import PreTrainedConfig


        class Qwen2_5_VLVisionConfig(PreTrainedConfig):
            model_type = "qwen2_5_vl"


        class Qwen2_5_VLConfig(PreTrainedConfig):
            sub_configs = {"vision_config": Qwen2_5_VLVisionConfig}
        """
    )
    result = rewrite_configuration(source, ctx)
    assert "from transformers.configuration_utils import PreTrainedConfig" in result
    assert "class GutenOcr3BVLConfig(PreTrainedConfig)" in result
    assert '{"vision_config": GutenOcr3BVLVisionConfig}' in result
    assert 'model_type = "qwen2_5_vl"' in result
    assert "Qwen2_5_VLConfig" not in result


# --- inject_rms_norm ----------------------------------------------------------------------------

LOCAL_RMS_NORM = '''\
    class Qwen2_5_VLRMSNorm(nn.Module):
        def __init__(self, hidden_size, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden_size))
            self.variance_epsilon = eps

        def forward(self, hidden_states):
            """Normalize."""
            return hidden_states
    '''


def test_inject_rms_norm_into_a_local_class(ctx):
    after = "import sys\n" + dedent(LOCAL_RMS_NORM).replace(
        '"""Normalize."""\n',
        '"""Normalize."""\n'
        + guard(
            "USE_PTO_RMS_NORM",
            "rms_norm_wrapper(hidden_states, self.weight, self.variance_epsilon)",
            " " * 8,
        ),
    )
    assert run(InjectRmsNorm(), LOCAL_RMS_NORM, ctx) == after


def test_inject_rms_norm_reads_the_attribute_names_from_init(ctx):
    source = LOCAL_RMS_NORM.replace("self.weight", "self.scale").replace("variance_epsilon", "epsilon")
    assert "rms_norm_wrapper(hidden_states, self.scale, self.epsilon)" in run(InjectRmsNorm(), source, ctx)


def test_inject_rms_norm_subclasses_an_imported_class_and_repoints_its_uses(ctx):
    before = """\
        from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

        logger = None


        class Block(nn.Module):
            def __init__(self):
                self.norm = Qwen2RMSNorm(8, eps=1e-6)
        """
    result = run(InjectRmsNorm(), before, ctx)
    assert "from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm\n" in result
    assert "class GutenOcr3BRMSNorm(Qwen2RMSNorm):" in result
    assert "self.norm = GutenOcr3BRMSNorm(8, eps=1e-6)" in result
    assert result.index("class GutenOcr3BRMSNorm") < result.index("class Block")
    assert find_injections(result) == {"rms_norm": ["GutenOcr3BRMSNorm"]}
    assert "return super().forward(hidden_states)" in result


def test_inject_rms_norm_noop_when_already_guarded(ctx):
    once = run(InjectRmsNorm(), LOCAL_RMS_NORM, ctx)
    assert run(InjectRmsNorm(), once, ctx) == once
    imported = "from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm\n\n\nclass B:\n    pass\n"
    once = run(InjectRmsNorm(), imported, ctx)
    assert run(InjectRmsNorm(), once, ctx) == once


def test_inject_rms_norm_fails_without_the_class(ctx):
    with pytest.raises(AnchorNotFoundError, match="Qwen2_5_VLRMSNorm.*9.9.9") as error:
        run(InjectRmsNorm(), "class LayerNorm:\n    pass\n", ctx)
    assert error.value.hint


def test_inject_rms_norm_fails_when_init_sets_no_epsilon(ctx):
    source = LOCAL_RMS_NORM.replace("self.variance_epsilon = eps", "pass")
    with pytest.raises(AnchorNotFoundError, match="Qwen2_5_VLRMSNorm"):
        run(InjectRmsNorm(), source, ctx)


# --- inject_swiglu_mlp --------------------------------------------------------------------------

MLP = """\
    class Qwen2MLP(nn.Module):
        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
    """


def test_inject_swiglu_mlp(ctx):
    after = "import sys\n" + dedent(MLP).replace(
        "def forward(self, x):\n",
        "def forward(self, x):\n" + guard("USE_PTO_SWIGLU_MLP", "swiglu_mlp_wrapper(self, x)", " " * 8),
    )
    assert run(InjectSwigluMlp(), MLP, ctx) == after


def test_inject_swiglu_mlp_noop_when_already_guarded(ctx):
    once = run(InjectSwigluMlp(), MLP, ctx)
    assert run(InjectSwigluMlp(), once, ctx) == once


def test_inject_swiglu_mlp_fails_without_the_class(ctx):
    with pytest.raises(AnchorNotFoundError, match="Qwen2MLP.*9.9.9"):
        run(InjectSwigluMlp(), MLP.replace("Qwen2MLP", "Qwen3MLP"), ctx)


# --- inject_mrope -------------------------------------------------------------------------------

SECTIONED = """\
    def apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section, unsqueeze_dim=1):
        mrope_section = mrope_section * 2
        return q, k
    """
MIXED = """\
    @use_kernel_forward_from_hub("rotary_pos_emb")
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        cos = cos.unsqueeze(unsqueeze_dim)
        return q, k


    @use_kernelized_func(apply_rotary_pos_emb)
    class Attention:
        pass
    """


def test_inject_mrope_sectioned(ctx):
    call = "mrope_pto_correct(q, k, cos, sin, mrope_section, unsqueeze_dim)"
    after = "import sys\n" + dedent(SECTIONED).replace("1):\n", "1):\n" + guard("USE_PTO_MROPE", call), 1)
    assert run(InjectMrope(), SECTIONED, ctx) == after


def test_inject_mrope_mixed_keeps_the_decorators(ctx):
    call = "mrope_mixed_wrapper(q, k, cos, sin, unsqueeze_dim)"
    after = "import sys\n" + dedent(MIXED).replace("1):\n", "1):\n" + guard("USE_PTO_MROPE", call), 1)
    assert run(InjectMrope(), MIXED, ctx) == after


def test_inject_mrope_prefers_the_sectioned_function_when_both_exist(ctx):
    # up to 5.16 both exist; only the multimodal one sees the text attention's cos/sin
    result = run(InjectMrope(), SECTIONED + "\n\n" + MIXED, ctx)
    assert find_injections(result) == {"mrope": ["apply_multimodal_rotary_pos_emb"]}


def test_inject_mrope_noop_when_already_guarded(ctx):
    once = run(InjectMrope(), MIXED, ctx)
    assert run(InjectMrope(), once, ctx) == once


def test_inject_mrope_fails_when_no_function_has_a_known_layout(ctx):
    source = "def apply_rotary_pos_emb(x, position_ids):\n    return x\n"
    with pytest.raises(AnchorNotFoundError, match="apply_multimodal_rotary_pos_emb.*9.9.9"):
        run(InjectMrope(), source, ctx)


# --- checkpoint_conversion ----------------------------------------------------------------------

MODELS = """\
    class Qwen2_5_VLPreTrainedModel(PreTrainedModel):
        pass


    class Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLPreTrainedModel, GenerationMixin):
        pass


    class Qwen2MLP(nn.Module):
        pass
    """


def test_checkpoint_conversion_appends_the_registration_for_model_classes(ctx):
    result = run(CheckpointConversion(), MODELS, ctx)
    assert result.startswith(dedent(MODELS))
    tail = cst.parse_module(result).body[3:]
    assert [type(node).__name__ for node in tail] == ["FunctionDef", "SimpleStatementLine"]
    call = cst.ensure_type(cst.ensure_type(tail[1], cst.SimpleStatementLine).body[0], cst.Expr).value
    assert cst.ensure_type(cst.ensure_type(call, cst.Call).func, cst.Name).value == REGISTER_FUNCTION
    table = eval(cst.Module(body=[]).code_for_node(cst.ensure_type(call, cst.Call).args[0].value))
    assert table == {
        "Qwen2_5_VLPreTrainedModel": "GutenOcr3BVLPreTrainedModel",
        "Qwen2_5_VLForConditionalGeneration": "GutenOcr3BVLForConditionalGeneration",
    }


def test_checkpoint_conversion_registers_through_whatever_transformers_has(ctx, monkeypatch):
    registered = {}
    mapping_module = types.ModuleType("transformers.conversion_mapping")
    mapping_module.VLMS = ["qwen2_5_vl"]
    mapping_module.get_checkpoint_conversion_mapping = lambda key: (
        ["rule"] if key.startswith("Qwen2_5_VLFor") else None
    )
    mapping_module.register_checkpoint_conversion_mapping = lambda key, value, overwrite: registered.update(
        {key: (value, overwrite)}
    )
    utils_module = types.ModuleType("transformers.modeling_utils")  # 5.x: no VLMS here
    monkeypatch.setitem(sys.modules, "transformers.conversion_mapping", mapping_module)
    monkeypatch.setitem(sys.modules, "transformers.modeling_utils", utils_module)
    names = {"PreTrainedModel": object, "GenerationMixin": object, "nn": types.SimpleNamespace(Module=object)}
    exec(compile(run(CheckpointConversion(), MODELS, ctx), "patched", "exec"), names)
    assert registered == {"GutenOcr3BVLForConditionalGeneration": (["rule"], True)}
    assert mapping_module.VLMS == [
        "qwen2_5_vl",
        "gutenocr3bvlpretrainedmodel",
        "gutenocr3bvlforconditionalgeneration",
    ]


def test_checkpoint_conversion_noop_when_already_added(ctx):
    once = run(CheckpointConversion(), MODELS, ctx)
    assert run(CheckpointConversion(), once, ctx) == once


def test_checkpoint_conversion_fails_without_a_model_class(ctx):
    with pytest.raises(AnchorNotFoundError, match="PreTrainedModel.*9.9.9"):
        run(CheckpointConversion(), "class Qwen2MLP(nn.Module):\n    pass\n", ctx)


# --- banner -------------------------------------------------------------------------------------


def test_banner_names_tool_spec_release_and_hash(ctx):
    result = run(Banner(), "# Copyright header\nimport torch\n", ctx)
    lines = result.splitlines()
    assert lines[0].startswith("# Generated by pto-patch ")
    assert ctx.tool_version in lines[0] and "gutenocr_3b" in lines[0] and "9.9.9" in lines[0]
    assert "ab" * 32 in lines[1] and FILE in lines[1]
    assert "do not edit by hand" in lines[2] and "pto-patch restore" in lines[2]
    assert lines[4:] == ["# Copyright header", "import torch"]


def test_banner_noop_when_present(ctx):
    once = run(Banner(), "import torch\n", ctx)
    assert run(Banner(), once, ctx) == once


# --- the whole pipeline -------------------------------------------------------------------------

SMALL_MODELING = (
    "from ...modeling_utils import PreTrainedModel\n"
    "from .configuration_qwen2_5_vl import Qwen2_5_VLConfig\n\n\n"
    + dedent(LOCAL_RMS_NORM)
    + "\n\n"
    + dedent(MLP)
    + "\n\n"
    + dedent(SECTIONED)
    + "\n\n"
    + dedent(MODELS)
    + "\n\n"
    + DECODER  # a decoder layer and its attention, for the blocks
)


def test_rewrite_modeling_keeps_crlf_line_endings(ctx):
    result = rewrite_modeling(SMALL_MODELING.replace("\n", "\r\n"), ctx)
    assert result.count("\n") == result.count("\r\n") > SMALL_MODELING.count("\n")
    assert rewrite_modeling(SMALL_MODELING, ctx) == result.replace("\r\n", "\n")


def test_rewrite_modeling_injects_only_the_chosen_ops(ctx):
    for ops in [("rms_norm",), ("mrope", "swiglu_mlp"), ()]:
        result = rewrite_modeling(SMALL_MODELING, PatchContext(spec=ctx.spec, ops=ops, release="9.9.9"))
        assert sorted(find_injections(result)) == sorted(ops)
        assert ("import sys" in result.splitlines()) == bool(ops)


def test_rewrite_modeling_returns_nothing_when_one_anchor_is_missing(ctx):
    with pytest.raises(AnchorNotFoundError, match="Qwen2MLP"):
        rewrite_modeling(SMALL_MODELING.replace("Qwen2MLP", "OtherMLP"), ctx)
    # the same file without that op goes through
    rewrite_modeling(
        SMALL_MODELING.replace("Qwen2MLP", "OtherMLP"), PatchContext(spec=ctx.spec, ops=("rms_norm",))
    )


def test_find_injections_reads_guards_only_at_the_top_of_functions():
    source = "import sys\n\n\ndef f(x):\n    x = 1\n" + guard("USE_PTO_MROPE", "mrope_mixed_wrapper(x)")
    assert find_injections(source) == {}
    assert find_injections(source.replace("    x = 1\n", "")) == {"mrope": ["f"]}


def test_find_injections_reads_methods_of_classes_inside_blocks_in_source_order():
    method = "    def forward(self, x):\n" + guard("USE_PTO_RMS_NORM", "rms_norm_wrapper(x)", "        ")
    source = (
        "import sys\n\n\ntry:\n    class A:\n"
        + "\n".join("    " + line for line in method.splitlines())
        + "\nexcept ImportError:\n    class B:\n"
        + "\n".join("    " + line for line in method.splitlines())
        + "\nelse:\n    class C:\n"
        + "\n".join("    " + line for line in method.splitlines())
        + "\n"
    )
    assert find_injections(source) == {"rms_norm": ["A", "B", "C"]}
    assert find_injections(source, {"USE_PTO_MROPE": "mrope"}) == {}
