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
import libcst.matchers as m

from pto_patch.codemods.context import PatchContext
from pto_patch.codemods.injection_templates import PlaceholderSubstituter, template_body
from pto_patch.errors import AnchorNotFoundError

TEMPLATE = "checkpoint_conversion"
PLACEHOLDER = "RENAMED_CLASSES"
REGISTER_FUNCTION = "_pto_patch_keep_checkpoint_conversions"
MODEL_BASE = "PreTrainedModel"
ALREADY_ADDED = m.FunctionDef(name=m.Name(REGISTER_FUNCTION))


class PreTrainedModelClasses(cst.CSTVisitor):
    """Facts only: module-level classes deriving (in this file) from PreTrainedModel, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.classes: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        known = {MODEL_BASE, *self.classes}
        if any(isinstance(base.value, cst.Name) and base.value.value in known for base in node.bases):
            self.classes.append(node.name.value)
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False


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
        if any(m.matches(statement, ALREADY_ADDED) for statement in module.body):
            return module
        facts = PreTrainedModelClasses()
        module.visit(facts)
        renamed = {name: ctx.spec.renamed(name) for name in facts.classes if ctx.spec.renamed(name) != name}
        if not facts.classes:
            raise AnchorNotFoundError(
                f"no {MODEL_BASE} subclass in {ctx.where(file_name)}",
                "the source is not a transformers modeling file; point pto-patch at an unmodified release",
            )
        if not renamed:
            return module
        substitute = PlaceholderSubstituter({PLACEHOLDER: string_dict(renamed)}, {})
        appended = [statement.visit(substitute) for statement in template_body(TEMPLATE)]
        return module.with_changes(body=[*module.body, *appended])
