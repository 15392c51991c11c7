"""The rms_norm guard at the top of the RMSNorm class's `forward`.

Where the file defines the class (4.49 - 4.52, 5.4+), its own forward gets the guard, with the
weight and epsilon attributes read from its `__init__`. Where the file imports it (4.57, 5.0:
`from ..qwen2.modeling_qwen2 import Qwen2RMSNorm`), a local subclass named by the spec's
renames gets a guarded forward that otherwise calls `super().forward`, and every use in the
file points at the subclass.

Before (local class):

    class Qwen2_5_VLRMSNorm(nn.Module):
        def forward(self, hidden_states):
            input_dtype = hidden_states.dtype

After:

    class Qwen2_5_VLRMSNorm(nn.Module):
        def forward(self, hidden_states):
            pto_kernels = sys.modules.get("pto_kernels")
            if pto_kernels is not None and getattr(pto_kernels, "USE_PTO_RMS_NORM", False):
                return pto_kernels.rms_norm_wrapper(hidden_states, self.weight, self.variance_epsilon)
            input_dtype = hidden_states.dtype
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import libcst as cst

from pto_patch.errors import AnchorNotFoundError, SpecError
from pto_patch.patching.codemods.context import PatchContext
from pto_patch.patching.codemods.guards import GuardInjector, has_guard, with_import_sys
from pto_patch.patching.codemods.injection_templates import guard_statements, parameter_names, template_body
from pto_patch.patching.codemods.node_walk import find_all, outer_statements
from pto_patch.patching.codemods.rename_classes import rename_references

OP = "rms_norm"
TEMPLATE = "rms_norm"
SUBCLASS_TEMPLATE = "rms_norm_subclass"
# The imported class's attributes (transformers' Qwen2RMSNorm in every release that imports it).
IMPORTED_ATTRIBUTES = ("weight", "variance_epsilon")


def is_self_attribute_assign(node: cst.CSTNode) -> bool:
    """`self.x = ...` (one target)."""
    return (
        isinstance(node, cst.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0].target, cst.Attribute)
        and isinstance(node.targets[0].target.value, cst.Name)
        and node.targets[0].target.value.value == "self"
    )


def is_parameter_call(node: cst.BaseExpression) -> bool:
    """`Parameter(...)` or `x.Parameter(...)`, e.g. `nn.Parameter(torch.ones(hidden_size))`."""
    if not isinstance(node, cst.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, cst.Attribute) else func
    return isinstance(name, cst.Name) and name.value == "Parameter"


def self_attribute(name: str) -> cst.Attribute:
    return cst.Attribute(value=cst.Name("self"), attr=cst.Name(name))


class RmsNormFacts:
    """Facts only: module-level classes among `targets` (with their weight / eps attributes and
    forward), and which of the targets are imported."""

    def __init__(self, targets: Sequence[str]):
        self.targets = set(targets)
        self.local: dict[str, tuple[str | None, str | None, bool]] = {}
        self.imported: list[str] = []
        self.defined: set[str] = set()

    def collect(self, module: cst.Module) -> RmsNormFacts:
        for statement in outer_statements(module):
            if isinstance(statement, cst.ClassDef):
                self._class(statement)
            elif isinstance(statement, cst.ImportFrom):
                self._import_from(statement)
        return self

    def _class(self, node: cst.ClassDef) -> None:
        self.defined.add(node.name.value)
        if node.name.value not in self.targets:
            return
        weight = eps = None
        has_forward = False
        for statement in cast(cst.IndentedBlock, node.body).body:
            if not isinstance(statement, cst.FunctionDef):
                continue
            if statement.name.value == "forward":
                has_forward = True
            if statement.name.value != "__init__":
                continue
            eps_params = {name for name in parameter_names(statement) if "eps" in name}
            for assign in find_all(statement, is_self_attribute_assign):
                assign = cast(cst.Assign, assign)
                attribute = cast(cst.Attribute, assign.targets[0].target).attr.value
                if is_parameter_call(assign.value):
                    weight = attribute
                elif isinstance(assign.value, cst.Name) and assign.value.value in eps_params:
                    eps = attribute
        self.local[node.name.value] = (weight, eps, has_forward)

    def _import_from(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            if alias.asname is None and alias.evaluated_name in self.targets:
                self.imported.append(alias.evaluated_name)


def guard_builder(ctx: PatchContext, weight: str, eps: str, where: str):
    switch = ctx.spec.injections[OP].switch
    extra = {"WEIGHT": self_attribute(weight), "EPS": self_attribute(eps)}

    def build(function: cst.FunctionDef) -> Sequence[cst.BaseStatement]:
        try:
            return guard_statements(TEMPLATE, parameter_names(function), switch, extra)
        except ValueError as exc:
            raise AnchorNotFoundError(
                f"{where}: forward does not fit the rms_norm guard ({exc})",
                "this release changed the RMSNorm signature; update templates/injections/rms_norm.py",
            ) from exc

    return build


def subclass_definition(subclass: str, base: str) -> cst.ClassDef:
    template = next(s for s in template_body(SUBCLASS_TEMPLATE) if isinstance(s, cst.ClassDef))
    renamed = rename_references(template, {"RMS_NORM_CLASS": subclass, "IMPORTED_RMS_NORM": base})
    return cast(cst.ClassDef, renamed).with_changes(name=cst.Name(subclass))


class InjectRmsNorm:
    def transform(self, module: cst.Module, ctx: PatchContext, file_name: str) -> cst.Module:
        targets = ctx.spec.injections[OP].classes
        facts = RmsNormFacts(targets).collect(module)
        where = ctx.where(file_name)
        builders = {}
        for name, (weight, eps, has_forward) in facts.local.items():
            if not (weight and eps and has_forward):
                raise AnchorNotFoundError(
                    f"{name} in {where} has no forward, or no weight/eps attributes set in __init__",
                    "this release changed the RMSNorm class; update the rms_norm codemod or pin transformers",
                )
            builders[(name, "forward")] = guard_builder(ctx, weight, eps, f"{name} in {where}")
        if not builders and facts.imported:
            module, subclass = self._add_subclass(module, facts, ctx, where)
            builders[(subclass, "forward")] = guard_builder(
                ctx, *IMPORTED_ATTRIBUTES, f"{subclass} in {where}"
            )
        if not builders:
            raise AnchorNotFoundError(
                f"no RMSNorm class ({', '.join(targets)}) defined or imported in {where}",
                "this release renamed the RMSNorm class; add its name to the spec's rms_norm classes",
            )
        return with_import_sys(GuardInjector(self._pending(module, builders, ctx)).inject(module))

    @staticmethod
    def _pending(module: cst.Module, builders: dict, ctx: PatchContext) -> dict:
        """Builders for the targets that do not hold the guard yet (a second run changes nothing)."""
        switch = ctx.spec.injections[OP].switch
        done = set()
        for statement in module.body:
            if isinstance(statement, cst.ClassDef) and (statement.name.value, "forward") in builders:
                for item in cast(cst.IndentedBlock, statement.body).body:
                    if (
                        isinstance(item, cst.FunctionDef)
                        and item.name.value == "forward"
                        and has_guard(item, switch)
                    ):
                        done.add((statement.name.value, "forward"))
        return {key: build for key, build in builders.items() if key not in done}

    @staticmethod
    def _add_subclass(
        module: cst.Module, facts: RmsNormFacts, ctx: PatchContext, where: str
    ) -> tuple[cst.Module, str]:
        base = facts.imported[0]
        subclass = ctx.spec.renamed(base)
        if subclass == base:
            raise SpecError(
                f"spec '{ctx.spec.name}' gives the imported {base} no new name for its local subclass",
                f"add a class_renames prefix that matches {base}",
            )
        if subclass in facts.defined:
            return module, subclass
        module = cast(cst.Module, rename_references(module, {base: subclass}))
        body = list(module.body)
        definitions = (i for i, s in enumerate(body) if isinstance(s, cst.ClassDef | cst.FunctionDef))
        position = next(definitions, len(body))
        body.insert(position, subclass_definition(subclass, base))
        return module.with_changes(body=body), subclass
