"""The spec's class renames, for every class the model's own files define.

Renamed: the class definitions, every `Name` that refers to them, the names imported from the
sibling configuration module, and the class-name lists transformers matches against class
`__name__`s (`__all__`, `_no_split_modules`). Attribute names, keyword names, imports from other
modules and free text (docstrings) are left alone.

Before:

    from .configuration_qwen2_5_vl import Qwen2_5_VLConfig
    class Qwen2MLP(nn.Module): ...
    class Qwen2_5_VLModel(Qwen2_5_VLPreTrainedModel):
        config: Qwen2_5_VLConfig
        _no_split_modules = ["Qwen2_5_VLDecoderLayer"]

After (spec gutenocr_3b):

    from .configuration_qwen2_5_vl import GutenOcr3BVLConfig
    class GutenOcr3BMLP(nn.Module): ...
    class GutenOcr3BVLModel(GutenOcr3BVLPreTrainedModel):
        config: GutenOcr3BVLConfig
        _no_split_modules = ["GutenOcr3BVLDecoderLayer"]
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node

from pto_patch.codemods.context import PatchContext
from pto_patch.errors import SpecError

# Class attributes (and `__all__`) whose string elements are class names transformers compares
# with `type(module).__name__`: stale names there silently break device maps or star imports.
CLASS_NAME_LISTS = ("__all__", "_no_split_modules")

CLASS_NAME_LIST_ASSIGN = m.Assign(
    targets=[m.AssignTarget(target=m.OneOf(*(m.Name(name) for name in CLASS_NAME_LISTS)))],
    value=m.List() | m.Tuple(),
)


class DefinedNamesCollector(cst.CSTVisitor):
    """Facts only: module-level class names, every name bound by an import, names from the sibling."""

    def __init__(self, sibling_module: str):
        super().__init__()
        self.sibling_module = sibling_module
        self.classes: list[str] = []
        self.imported: set[str] = set()
        self.from_sibling: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.classes.append(node.name.value)
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        return any(isinstance(small, cst.ImportFrom) for small in node.body)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        module = get_full_name_for_node(node.module) if node.module else ""
        for alias in node.names:
            bound = alias.evaluated_alias or alias.evaluated_name
            self.imported.add(bound)
            if len(node.relative) == 1 and module == self.sibling_module:
                self.from_sibling.append(alias.evaluated_name)


class ReferenceRenamer(cst.CSTTransformer):
    """Renames `Name` references; attribute names, keyword names and imports keep their names."""

    def __init__(self, renames: dict[str, str]):
        super().__init__()
        self.renames = renames

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        new = self.renames.get(original_node.value)
        return updated_node.with_changes(value=new) if new else updated_node

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)

    def leave_Import(self, original_node: cst.Import, updated_node: cst.Import) -> cst.Import:
        return original_node

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom) -> cst.ImportFrom:
        return original_node


class ClassRenameTransformer(ReferenceRenamer):
    """Also renames the names imported from the sibling module, and the class-name lists."""

    def __init__(self, renames: dict[str, str], sibling_module: str):
        super().__init__(renames)
        self.sibling_module = sibling_module

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom) -> cst.ImportFrom:
        module = get_full_name_for_node(original_node.module) if original_node.module else ""
        if len(original_node.relative) == 1 and module == self.sibling_module:
            return updated_node
        return original_node

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if not m.matches(original_node, CLASS_NAME_LIST_ASSIGN):
            return updated_node
        value = cst.ensure_type(updated_node.value, cst.List | cst.Tuple)
        elements = [self._renamed_element(element) for element in value.elements]
        return updated_node.with_changes(value=value.with_changes(elements=elements))

    def _renamed_element(self, element: cst.BaseElement) -> cst.BaseElement:
        string = element.value
        if not isinstance(string, cst.SimpleString):
            return element
        new = self.renames.get(str(string.evaluated_value))
        if new is None:
            return element
        return element.with_changes(
            value=string.with_changes(value=f"{string.prefix}{string.quote}{new}{string.quote}")
        )


def class_renames(facts: DefinedNamesCollector, ctx: PatchContext, file_name: str) -> dict[str, str]:
    """{old: new} for the file's classes; raises SpecError when a new name clashes."""
    renames = {}
    for name in (*facts.classes, *facts.from_sibling):
        new = ctx.spec.renamed(name)
        if new != name:
            renames[name] = new
    taken = (set(facts.classes) | facts.imported) - set(renames)
    seen: dict[str, str] = {}
    for old, new in renames.items():
        if new in taken or new in renames:
            raise SpecError(
                f"spec '{ctx.spec.name}' renames {old} to {new}, a name {ctx.where(file_name)} already uses",
                "choose class_renames whose new prefix is not a transformers class prefix",
            )
        if new in seen and seen[new] != old:
            raise SpecError(
                f"spec '{ctx.spec.name}' renames {seen[new]} and {old} alike ({new}), "
                f"in {ctx.where(file_name)}",
                "make the class_renames prefixes distinct",
            )
        seen[new] = old
    return renames


class RenameClasses:
    def transform(self, module: cst.Module, ctx: PatchContext, file_name: str) -> cst.Module:
        sibling = ctx.spec.configuration_file.removesuffix(".py")
        facts = DefinedNamesCollector(sibling)
        module.visit(facts)
        renames = class_renames(facts, ctx, file_name)
        if not renames:
            return module
        return module.visit(ClassRenameTransformer(renames, sibling))
