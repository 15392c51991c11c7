"""The mrope guard at the top of the text rotary function, chosen by the function's parameters.

Among the spec's mrope functions defined at module level, one that takes `mrope_section`
(`apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section, unsqueeze_dim=1)`, up to 5.16)
gets the guard calling `mrope_pto_correct` on unmixed cos/sin; otherwise one taking
(q, k, cos, sin, unsqueeze_dim) (`apply_rotary_pos_emb`, 5.20+, and Qwen3-VL from 5.0, where the rotary
module already mixed the sections) or (q, k, cos, sin, position_ids, unsqueeze_dim) (Qwen3-VL on 4.57,
position_ids unused) gets the guard calling `mrope_mixed_wrapper`. Decorators are kept.

Before (5.24):

    @use_kernel_forward_from_hub("rotary_pos_emb")
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        '''...'''
        cos = cos.unsqueeze(unsqueeze_dim)

After:

    @use_kernel_forward_from_hub("rotary_pos_emb")
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        '''...'''
        pto_kernels = sys.modules.get("pto_kernels")
        if pto_kernels is not None and getattr(pto_kernels, "USE_PTO_MROPE", False):
            return pto_kernels.mrope_mixed_wrapper(q, k, cos, sin, unsqueeze_dim)
        cos = cos.unsqueeze(unsqueeze_dim)
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from pto_patch.errors import AnchorNotFoundError
from pto_patch.patching.codemods.context import PatchContext
from pto_patch.patching.codemods.guards import GuardInjector, has_guard, with_import_sys
from pto_patch.patching.codemods.injection_templates import guard_statements, parameter_names

OP = "mrope"
# (template, the target's parameters must start with these), most specific layout first.
LAYOUTS = (
    ("mrope_sectioned", ("q", "k", "cos", "sin", "mrope_section")),
    ("mrope_mixed", ("q", "k", "cos", "sin", "unsqueeze_dim")),
    ("mrope_mixed_position_ids", ("q", "k", "cos", "sin", "position_ids", "unsqueeze_dim")),
)


def module_functions(module: cst.Module, names: Sequence[str]) -> dict[str, cst.FunctionDef]:
    return {
        statement.name.value: statement
        for statement in module.body
        if isinstance(statement, cst.FunctionDef) and statement.name.value in names
    }


def choose_target(functions: dict[str, cst.FunctionDef]) -> tuple[str, cst.FunctionDef] | None:
    """(template, function) for the first layout some function's parameters start with."""
    for template, prefix in LAYOUTS:
        for function in functions.values():
            if tuple(parameter_names(function)[: len(prefix)]) == prefix:
                return template, function
    return None


class InjectMrope:
    def transform(self, module: cst.Module, ctx: PatchContext, file_name: str) -> cst.Module:
        injection = ctx.spec.injections[OP]
        where = ctx.where(file_name)
        chosen = choose_target(module_functions(module, injection.functions))
        if chosen is None:
            layouts = "; ".join(f"({', '.join(prefix)}, ...)" for _, prefix in LAYOUTS)
            raise AnchorNotFoundError(
                f"no rotary function {' / '.join(injection.functions)} taking {layouts} in {where}",
                "this release moved the multimodal rotary embedding; update the spec's mrope functions",
            )
        template, function = chosen
        if has_guard(function, injection.switch):
            return module

        def build(target: cst.FunctionDef) -> Sequence[cst.BaseStatement]:
            return guard_statements(template, parameter_names(target), injection.switch)

        return with_import_sys(GuardInjector({(None, function.name.value): build}).inject(module))
