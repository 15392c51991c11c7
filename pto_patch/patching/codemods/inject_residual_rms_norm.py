"""The residual_rms_norm block: a decoder layer's residual add and the RMSNorm after it, as one op.

Inside a layer, the post-attention norm follows the residual add. The input norm and the model's final
norm follow an add made in another function (the previous layer, or the layers' loop): fusing across that
boundary would change what a decoder layer returns, so those two are left to attention_prologue (the input
norm) and to mlp_block (which ends every layer with its add). Where mlp_block is patched too, this block
sits in its `else` branch: the one that runs with mlp_block switched off.

Before:

    hidden_states = residual + hidden_states
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)

After (with a guard at the top of the forward that sets `pto_residual_rms_norm`):

    if pto_residual_rms_norm is not None:
        hidden_states, residual = pto_residual_rms_norm(hidden_states, residual, self.post_attention_layernorm)
    else:
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from pto_patch.errors import AnchorNotFoundError
from pto_patch.patching.codemods import decoder_layer as dl
from pto_patch.patching.codemods.context import PatchContext
from pto_patch.patching.codemods.guards import with_import_sys
from pto_patch.patching.codemods.injection_templates import template_piece

OP = "residual_rms_norm"
TEMPLATE = "decoder_blocks"


def _wrap_first_add_norm(statements: Sequence[cst.BaseStatement], layer: dl.DecoderLayer):
    """`statements` with the first add / copy / norm triple (searched in nested if-blocks too) wrapped."""
    out = list(statements)
    for index, statement in enumerate(out):
        triple = out[index : index + 3]
        norm = dl.is_module_call(triple[2], layer.hidden) if len(triple) == 3 else None
        if (
            norm is not None
            and dl.is_residual_add(triple[0], layer.hidden, layer.residual)
            and dl.is_copy(triple[1], layer.residual, layer.hidden)
        ):
            names = {
                "HIDDEN": cst.Name(layer.hidden),
                "RESIDUAL": cst.Name(layer.residual),
                "POST_NORM": cst.parse_expression(f"self.{norm}"),
            }
            out[index : index + 3] = template_piece(TEMPLATE, "residual_norm", names, {"ORIGINAL": triple})
            return out, True
        if isinstance(statement, cst.If) and isinstance(statement.orelse, cst.Else):
            inner, done = _wrap_first_add_norm(statement.orelse.body.body, layer)
            if done:
                orelse = statement.orelse.with_changes(body=statement.orelse.body.with_changes(body=inner))
                out[index] = statement.with_changes(orelse=orelse)
                return out, True
    return out, False


class InjectResidualRmsNorm:
    def transform(self, module: cst.Module, ctx: PatchContext, file_name: str) -> cst.Module:
        found = dl.layer_to_patch(module, ctx, file_name, OP)
        if found is None:
            return module
        injection, where, layer = found
        statements, done = _wrap_first_add_norm(dl.body_statements(layer.forward), layer)
        if not done:
            raise AnchorNotFoundError(
                f"{layer.class_name}.forward in {where} has no `{layer.hidden} = {layer.residual} + {layer.hidden}` "
                "followed by the residual copy and a norm",
                "this release changed the decoder layer; the residual_rms_norm injection cannot place its block",
            )
        guard = template_piece(TEMPLATE, "residual_guard", {}, switch=injection.switch)
        return with_import_sys(dl.with_layer_body(module, layer, statements, guard))
