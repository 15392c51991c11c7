"""Build the file's sub-models by their own classes where the file builds them through AutoModel.

From transformers 5.16 Qwen3-VL's model builds its towers with `AutoModel.from_config(config.vision_config)`
and `AutoModel.from_config(config.text_config)`. AutoModel looks the model up by the config's class; a renamed
config class is in none of its tables, so loading the patched folder fails with "Unrecognized configuration
class". This points those calls at the function of templates/injections/sub_model_from_config.py, appended
with {renamed config class name: model class} for every sub-model: a class whose body annotates `config: X`
where no other class of the file annotates the same X, leaving out the config of the file's base model class
(the composite config, never a sub-model's). A file that never calls `AutoModel.from_config` is left alone.

Before (5.24):

    self.visual = AutoModel.from_config(config.vision_config)
    ...
    __all__ = [...]

After:

    self.visual = _pto_patch_sub_model_from_config(config.vision_config)
    ...
    __all__ = [...]


    def _pto_patch_sub_model_from_config(config, **kwargs):
        model_class = {"ChandraOcrVisionConfig": Qwen3VLVisionModel, ...}.get(type(config).__name__)
        ...

Must run before rename_classes, which then renames the model classes in the appended function.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from pto_patch.patching.codemods.checkpoint_conversion import MODEL_BASE
from pto_patch.patching.codemods.context import PatchContext
from pto_patch.patching.codemods.injection_templates import PlaceholderSubstituter, template_body
from pto_patch.patching.codemods.node_walk import find_all, outer_statements

TEMPLATE = "sub_model_from_config"
PLACEHOLDER = "SUB_MODELS"
BUILD_FUNCTION = "_pto_patch_sub_model_from_config"
BUILDER = "AutoModel.from_config"


def is_builder_call(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and get_full_name_for_node(node.func) == BUILDER


def class_config_annotation(node: cst.ClassDef) -> str | None:
    """The X of a class body's `config: X`, if it has one."""
    for line in node.body.body:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            if (
                isinstance(small, cst.AnnAssign)
                and isinstance(small.target, cst.Name)
                and small.target.value == "config"
                and isinstance(small.annotation.annotation, cst.Name)
            ):
                return small.annotation.annotation.value
    return None


def sub_models(module: cst.Module) -> dict[str, str]:
    """Facts only: {config class: model class} for the config classes exactly one class body annotates,
    the base model class's (a direct PreTrainedModel subclass) left out."""
    annotated: dict[str, list[str]] = {}
    base_configs = set()
    for node in outer_statements(module):
        if not isinstance(node, cst.ClassDef):
            continue
        config = class_config_annotation(node)
        if config is None:
            continue
        if any(isinstance(base.value, cst.Name) and base.value.value == MODEL_BASE for base in node.bases):
            base_configs.add(config)
        annotated.setdefault(config, []).append(node.name.value)
    return {
        config: classes[0]
        for config, classes in annotated.items()
        if len(classes) == 1 and config not in base_configs
    }


class _PointBuilderCalls(cst.CSTTransformer):
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if is_builder_call(original_node):
            return updated_node.with_changes(func=cst.Name(BUILD_FUNCTION))
        return updated_node


class SubModelFromConfig:
    def transform(self, module: cst.Module, ctx: PatchContext, file_name: str) -> cst.Module:
        done = any(isinstance(s, cst.FunctionDef) and s.name.value == BUILD_FUNCTION for s in module.body)
        if done or not find_all(module, is_builder_call):
            return module
        pairs = sub_models(module)
        if not pairs:
            return module
        table = cst.Dict(
            [
                cst.DictElement(cst.SimpleString(f'"{ctx.spec.renamed(config)}"'), cst.Name(model))
                for config, model in pairs.items()
            ]
        )
        module = module.visit(_PointBuilderCalls())
        substitute = PlaceholderSubstituter({PLACEHOLDER: table}, {})
        appended = [statement.visit(substitute) for statement in template_body(TEMPLATE)]
        return module.with_changes(body=[*module.body, *appended])
