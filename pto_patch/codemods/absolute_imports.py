"""Relative imports become absolute `transformers.` imports.

The remote-code loader treats every dotted import as a file beside the modeling file, so the
copied file must import transformers' own modules by their absolute names. The sibling
configuration module stays relative: it is copied beside the modeling file.

Before (transformers/models/qwen2_5_vl/modeling_qwen2_5_vl.py):

    from ... import initialization as init
    from ..qwen2.modeling_qwen2 import Qwen2RMSNorm
    from .configuration_qwen2_5_vl import Qwen2_5_VLConfig

After:

    from transformers import initialization as init
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
    from .configuration_qwen2_5_vl import Qwen2_5_VLConfig
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from pto_patch.codemods.context import PatchContext
from pto_patch.errors import AnchorNotFoundError


def dotted_name(name: str) -> cst.Attribute | cst.Name:
    parts = name.split(".")
    node: cst.Attribute | cst.Name = cst.Name(parts[0])
    for part in parts[1:]:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


class AbsoluteImportsTransformer(cst.CSTTransformer):
    """Resolves every relative `from` import against `package`, except those of `keep_relative`."""

    def __init__(self, package: str, keep_relative: frozenset[str]):
        super().__init__()
        self.package = package.split(".")
        self.keep_relative = keep_relative
        self.too_deep: list[str] = []

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        # imports are statements: skip the expression trees of every other line
        return any(isinstance(small, cst.ImportFrom) for small in node.body)

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom) -> cst.ImportFrom:
        level = len(original_node.relative)
        if level == 0:
            return updated_node
        module = get_full_name_for_node(original_node.module) if original_node.module else None
        if level == 1 and module in self.keep_relative:
            return updated_node
        if level > len(self.package):
            self.too_deep.append("." * level + (module or ""))
            return updated_node
        parts = self.package[: len(self.package) - (level - 1)] + (module.split(".") if module else [])
        return updated_node.with_changes(
            relative=(), module=dotted_name(".".join(parts)), whitespace_after_from=cst.SimpleWhitespace(" ")
        )


class AbsoluteImports:
    def transform(self, module: cst.Module, ctx: PatchContext, file_name: str) -> cst.Module:
        spec = ctx.spec
        sibling = spec.configuration_file.removesuffix(".py")
        transformer = AbsoluteImportsTransformer(
            f"transformers.models.{spec.transformers_model_dir}", frozenset({sibling})
        )
        result = module.visit(transformer)
        if transformer.too_deep:
            raise AnchorNotFoundError(
                f"{ctx.where(file_name)} imports {', '.join(transformer.too_deep)}, "
                "above the transformers package",
                "the source file is not transformers' own; point pto-patch at an unmodified release",
            )
        return result
