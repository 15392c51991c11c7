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

from pto_patch.errors import AnchorNotFoundError
from pto_patch.patching.codemods.context import PatchContext
from pto_patch.patching.codemods.node_walk import copy_on_write


def dotted_name(name: str) -> cst.Attribute | cst.Name:
    parts = name.split(".")
    node: cst.Attribute | cst.Name = cst.Name(parts[0])
    for part in parts[1:]:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


class ImportResolver:
    """Resolves every relative `from` import against `package`, except those of `keep_relative`."""

    def __init__(self, package: str, keep_relative: frozenset[str]):
        self.package = package.split(".")
        self.keep_relative = keep_relative
        self.too_deep: list[str] = []

    def rewrite(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """For node_walk.copy_on_write: imports are statements, so expressions are never entered."""
        if isinstance(node, cst.ImportFrom):
            return self.resolved(node)
        if isinstance(node, cst.SimpleStatementLine | cst.SimpleStatementSuite):
            return None if any(isinstance(small, cst.ImportFrom) for small in node.body) else node
        if isinstance(node, EXPRESSION_PARTS):
            return node
        return None

    def resolved(self, node: cst.ImportFrom) -> cst.ImportFrom:
        level = len(node.relative)
        if level == 0:
            return node
        module = get_full_name_for_node(node.module) if node.module else None
        if level == 1 and module in self.keep_relative:
            return node
        if level > len(self.package):
            self.too_deep.append("." * level + (module or ""))
            return node
        parts = self.package[: len(self.package) - (level - 1)] + (module.split(".") if module else [])
        return node.with_changes(
            relative=(), module=dotted_name(".".join(parts)), whitespace_after_from=cst.SimpleWhitespace(" ")
        )


# What a compound statement holds besides its blocks: none of it can hold an import.
EXPRESSION_PARTS = (cst.BaseExpression, cst.Decorator, cst.Parameters, cst.Annotation, cst.Arg, cst.WithItem)


class AbsoluteImports:
    def transform(self, module: cst.Module, ctx: PatchContext, file_name: str) -> cst.Module:
        spec = ctx.spec
        sibling = spec.configuration_file.removesuffix(".py")
        resolver = ImportResolver(f"transformers.models.{spec.transformers_model_dir}", frozenset({sibling}))
        result = copy_on_write(module, resolver.rewrite)
        if resolver.too_deep:
            raise AnchorNotFoundError(
                f"{ctx.where(file_name)} imports {', '.join(resolver.too_deep)}, "
                "above the transformers package",
                "the source file is not transformers' own; point pto-patch at an unmodified release",
            )
        return result
