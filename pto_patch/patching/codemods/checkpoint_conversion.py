"""Keep every checkpoint weight loading into the renamed classes.

transformers finds a model's checkpoint key conversions by class name: through the VLMS list
and `_checkpoint_conversion_mapping` on 4.57 / 5.0, through class-name-keyed conversion mappings
on 5.16+ (custom code only gets mappings registered under its own class name). Renamed classes
match neither, and the decoder silently stays random. This appends the function of
templates/injections/checkpoint_conversion.py and a call with the file's PreTrainedModel classes.

Before: (end of module)

    __all__ = ["Qwen2_5_VLForConditionalGeneration", ...]

After:

    __all__ = ["Qwen2_5_VLForConditionalGeneration", ...]


    def _pto_patch_keep_checkpoint_conversions(renamed_classes): ...


    _pto_patch_keep_checkpoint_conversions(
        {"Qwen2_5_VLForConditionalGeneration": "GutenOcr3BVLForConditionalGeneration", ...}
    )

Must run before rename_classes, which needs the original names to still be in the file.
"""

from __future__ import annotations

import libcst as cst

from pto_patch.errors import AnchorNotFoundError
from pto_patch.patching.codemods.context import PatchContext
from pto_patch.patching.codemods.injection_templates import PlaceholderSubstituter, template_body
from pto_patch.patching.codemods.node_walk import outer_statements

TEMPLATE = "checkpoint_conversion"
PLACEHOLDER = "RENAMED_CLASSES"
REGISTER_FUNCTION = "_pto_patch_keep_checkpoint_conversions"
MODEL_BASE = "PreTrainedModel"


def pretrained_model_classes(module: cst.Module) -> list[str]:
    """Facts only: module-level classes deriving (in this file) from PreTrainedModel, in order."""
    classes: list[str] = []
    for node in outer_statements(module):
        if not isinstance(node, cst.ClassDef):
            continue
        known = {MODEL_BASE, *classes}
        if any(isinstance(base.value, cst.Name) and base.value.value in known for base in node.bases):
            classes.append(node.name.value)
    return classes


def _is_register_function(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.FunctionDef) and statement.name.value == REGISTER_FUNCTION


def _line_break(indent: str) -> cst.ParenthesizedWhitespace:
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(), indent=True, last_line=cst.SimpleWhitespace(indent)
    )


def string_dict(pairs: dict[str, str]) -> cst.Dict:
    """A dict literal of strings, one entry per line."""
    elements = [
        cst.DictElement(
            cst.SimpleString(f'"{key}"'),
            cst.SimpleString(f'"{value}"'),
            comma=cst.Comma(whitespace_after=_line_break("    " if i < len(pairs) - 1 else "")),
        )
        for i, (key, value) in enumerate(pairs.items())
    ]
    return cst.Dict(elements, lbrace=cst.LeftCurlyBrace(whitespace_after=_line_break("    ")))


class CheckpointConversion:
    def transform(self, module: cst.Module, ctx: PatchContext, file_name: str) -> cst.Module:
        if any(_is_register_function(statement) for statement in module.body):
            return module
        classes = pretrained_model_classes(module)
        renamed = {name: ctx.spec.renamed(name) for name in classes if ctx.spec.renamed(name) != name}
        if not classes:
            raise AnchorNotFoundError(
                f"no {MODEL_BASE} subclass in {ctx.where(file_name)}",
                "the source is not a transformers modeling file; point pto-patch at an unmodified release",
            )
        if not renamed:
            return module
        substitute = PlaceholderSubstituter({PLACEHOLDER: string_dict(renamed)}, {})
        appended = [statement.visit(substitute) for statement in template_body(TEMPLATE)]
        return module.with_changes(body=[*module.body, *appended])
