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
from libcst.helpers import get_full_name_for_node

from pto_patch.errors import SpecError
from pto_patch.patching.codemods.context import PatchContext
from pto_patch.patching.codemods.node_walk import copy_on_write, outer_statements

# Class attributes (and `__all__`) whose string elements are class names transformers compares
# with `type(module).__name__`: stale names there silently break device maps or star imports.
CLASS_NAME_LISTS = ("__all__", "_no_split_modules")


class DefinedNamesCollector:
    """Facts only: module-level class names, every name bound by an import, names from the sibling."""

    def __init__(self, sibling_module: str):
        self.sibling_module = sibling_module
        self.classes: list[str] = []
        self.imported: set[str] = set()
        self.from_sibling: list[str] = []

    def collect(self, module: cst.Module) -> DefinedNamesCollector:
        for statement in outer_statements(module):
            if isinstance(statement, cst.ClassDef):
                self.classes.append(statement.name.value)
            elif isinstance(statement, cst.ImportFrom):
                self._import_from(statement)
        return self

    def _import_from(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        module = get_full_name_for_node(node.module) if node.module else ""
        for alias in node.names:
            bound = alias.evaluated_alias or alias.evaluated_name
            self.imported.add(bound)
            if len(node.relative) == 1 and module == self.sibling_module:
                self.from_sibling.append(alias.evaluated_name)


def is_sibling_import(node: cst.ImportFrom, sibling_module: str | None) -> bool:
    module = get_full_name_for_node(node.module) if node.module else ""
    return sibling_module is not None and len(node.relative) == 1 and module == sibling_module


def is_class_name_list(node: cst.Assign) -> bool:
    """`__all__ = [...]` or `_no_split_modules = (...)`: one target, a list or tuple literal."""
    return (
        len(node.targets) == 1
        and isinstance(node.targets[0].target, cst.Name)
        and node.targets[0].target.value in CLASS_NAME_LISTS
        and isinstance(node.value, cst.List | cst.Tuple)
    )


def rename_references(node: cst.CSTNode, renames: dict[str, str], sibling_module: str | None = None):
    """`node` with every `Name` reference in `renames` renamed; attribute names, keyword names and
    imports keep their names. With `sibling_module`, also the names imported from that sibling module
    (`from .sibling import ...`) and the class-name lists' strings. Untouched subtrees stay the same
    objects (node_walk.copy_on_write), so a rename costs little more than one look at each name."""

    def rename(node: cst.CSTNode) -> cst.CSTNode | None:
        if isinstance(node, cst.Name):
            new = renames.get(node.value)
            return node.with_changes(value=new) if new else node
        if isinstance(node, cst.Attribute):
            return copy_on_write(node, rename, skip=("attr",))
        if isinstance(node, cst.Arg):
            return copy_on_write(node, rename, skip=("keyword",))
        if isinstance(node, cst.Import):
            return node
        if isinstance(node, cst.ImportFrom):
            return copy_on_write(node, rename) if is_sibling_import(node, sibling_module) else node
        if isinstance(node, cst.SimpleString):
            return node
        if isinstance(node, cst.Assign) and sibling_module is not None and is_class_name_list(node):
            updated = copy_on_write(node, rename)
            value = updated.value
            elements = [_renamed_element(element, renames) for element in value.elements]
            if all(new is old for new, old in zip(elements, value.elements, strict=True)):
                return updated
            return updated.with_changes(value=value.with_changes(elements=elements))
        return None

    return copy_on_write(node, rename)


def _renamed_element(element: cst.BaseElement, renames: dict[str, str]) -> cst.BaseElement:
    string = element.value
    if not isinstance(string, cst.SimpleString):
        return element
    new = renames.get(str(string.evaluated_value))
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
        facts = DefinedNamesCollector(sibling).collect(module)
        renames = class_renames(facts, ctx, file_name)
        if not renames:
            return module
        return rename_references(module, renames, sibling)
