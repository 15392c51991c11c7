"""The mlp_block block: the attention's output projection, the residual add, the post-attention RMSNorm,
the SwiGLU MLP and the residual add after it, as one op.

The decoder layer tells its attention to hand back its output before o_proj, and runs the block in place
of its five post-attention statements. With the switch off both run as written.

Before:

    hidden_states, _ = self.self_attn(hidden_states=hidden_states, ..., **kwargs)
    hidden_states = residual + hidden_states
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)
    hidden_states = self.mlp(hidden_states)
    hidden_states = residual + hidden_states

After (the layer's forward; its guard sits at the top, before `residual = hidden_states`):

    pto_kernels = sys.modules.get("pto_kernels")
    if pto_kernels is not None and getattr(pto_kernels, "USE_PTO_MLP_BLOCK", False):
        kwargs["pto_defer_o_proj"] = True
    ...
    hidden_states, _ = self.self_attn(hidden_states=hidden_states, ..., **kwargs)
    if kwargs.get("pto_defer_o_proj", False):
        hidden_states = sys.modules["pto_kernels"].mlp_block_wrapper(
            residual, hidden_states, self.self_attn.o_proj, self.post_attention_layernorm, self.mlp
        )
    else:
        hidden_states = residual + hidden_states
        ...  # the five statements as before

and in the attention's forward, `pto_defer_o_proj = kwargs.pop("pto_defer_o_proj", False)` at the top and
`if not pto_defer_o_proj:` around `attn_output = self.o_proj(attn_output)`.
"""

from __future__ import annotations

import libcst as cst

from pto_patch.errors import AnchorNotFoundError
from pto_patch.patching.codemods import decoder_layer as dl
from pto_patch.patching.codemods.context import PatchContext
from pto_patch.patching.codemods.guards import with_import_sys
from pto_patch.patching.codemods.injection_templates import template_piece

OP = "mlp_block"
TEMPLATE = "decoder_blocks"


class InjectMlpBlock:
    def transform(self, module: cst.Module, ctx: PatchContext, file_name: str) -> cst.Module:
        found = dl.layer_to_patch(module, ctx, file_name, OP)
        if found is None:
            return module
        injection, where, layer = found
        if layer.post_run is None:
            raise AnchorNotFoundError(
                f"{layer.class_name}.forward in {where} has no residual add, norm, MLP, residual add in a row "
                "after its attention call",
                "this release changed the decoder layer; the mlp_block injection cannot place its block",
            )
        forward, attention_kwargs, o_proj = dl.find_o_proj(module, layer.attention_class, where, OP)
        kwargs = cst.Name(layer.kwargs)
        statements = dl.body_statements(layer.forward)
        names = {
            "KWARGS": kwargs,
            "HIDDEN": cst.Name(layer.hidden),
            "RESIDUAL": cst.Name(layer.residual),
            "O_PROJ": cst.parse_expression(f"self.{layer.attention_attr}.o_proj"),
            "POST_NORM": cst.parse_expression(f"self.{layer.post_norm_attr}"),
            "MLP": cst.parse_expression(f"self.{layer.mlp_attr}"),
        }
        run = slice(layer.post_run, layer.post_run + 5)
        statements[run] = template_piece(TEMPLATE, "mlp_block_run", names, {"ORIGINAL": statements[run]})
        guard = template_piece(TEMPLATE, "mlp_block_guard", {"KWARGS": kwargs}, switch=injection.switch)
        module = dl.with_layer_body(module, layer, statements, guard)

        attention = dl.body_statements(forward)
        attention[o_proj : o_proj + 1] = template_piece(
            TEMPLATE, "mlp_block_o_proj", {}, {"ORIGINAL": [attention[o_proj]]}
        )
        received = template_piece(TEMPLATE, "mlp_block_received", {"KWARGS": cst.Name(attention_kwargs)})
        forward = dl.with_body(forward, dl.insert_after_docstring(attention, received))
        return with_import_sys(dl.replace_method(module, layer.attention_class, forward))
