"""The swiglu_mlp guard at the top of the text MLP's `forward` (`Qwen2MLP` in every release).

Before:

    class Qwen2MLP(nn.Module):
        def forward(self, x):
            down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

After:

    class Qwen2MLP(nn.Module):
        def forward(self, x):
            pto_kernels = sys.modules.get("pto_kernels")
            if pto_kernels is not None and getattr(pto_kernels, "USE_PTO_SWIGLU_MLP", False):
                return pto_kernels.swiglu_mlp_wrapper(self, x)
            down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from pto_patch.errors import AnchorNotFoundError
from pto_patch.patching.codemods.context import PatchContext
from pto_patch.patching.codemods.guards import GuardInjector, has_guard, with_import_sys
from pto_patch.patching.codemods.injection_templates import guard_statements, parameter_names

OP = "swiglu_mlp"
TEMPLATE = "swiglu_mlp"


def class_methods(module: cst.Module, names: Sequence[str], method: str) -> dict[str, cst.FunctionDef]:
    """{class name: its `method`} for the module-level classes among `names` that define it."""
    found = {}
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value in names:
            for item in statement.body.body:
                if isinstance(item, cst.FunctionDef) and item.name.value == method:
                    found[statement.name.value] = item
    return found


class InjectSwigluMlp:
    def transform(self, module: cst.Module, ctx: PatchContext, file_name: str) -> cst.Module:
        injection = ctx.spec.injections[OP]
        where = ctx.where(file_name)
        forwards = class_methods(module, injection.classes, "forward")
        if not forwards:
            raise AnchorNotFoundError(
                f"no MLP class with a forward ({', '.join(injection.classes)}) in {where}",
                "this release renamed the text MLP class; add its name to the spec's swiglu_mlp classes",
            )

        def build(function: cst.FunctionDef) -> Sequence[cst.BaseStatement]:
            try:
                return guard_statements(TEMPLATE, parameter_names(function), injection.switch)
            except ValueError as exc:
                raise AnchorNotFoundError(
                    f"{function.name.value} in {where} does not fit the swiglu_mlp guard ({exc})",
                    "this release changed the MLP forward; update templates/injections/swiglu_mlp.py",
                ) from exc

        builders = {
            (name, "forward"): build
            for name, forward in forwards.items()
            if not has_guard(forward, injection.switch)
        }
        return with_import_sys(GuardInjector(builders).inject(module))
