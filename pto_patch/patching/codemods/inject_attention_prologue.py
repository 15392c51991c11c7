"""The attention_prologue block: the input RMSNorm, the q/k/v projections and MRoPE as one op.

The decoder layer skips its input norm and hands the norm module to its attention; the attention runs
the block in place of its projections and rotary call. With the switch off both run as written.

Before (5.16):

    class Qwen2_5_VLDecoderLayer(GradientCheckpointingLayer):
        def forward(self, hidden_states, ..., **kwargs):
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
            hidden_states, _ = self.self_attn(hidden_states=hidden_states, ..., **kwargs)

    class Qwen2_5_VLAttention(nn.Module):
        def forward(self, hidden_states, ..., **kwargs):
            bsz, q_len, _ = hidden_states.size()
            query_states = self.q_proj(hidden_states)
            ...
            cos, sin = position_embeddings
            query_states, key_states = apply_multimodal_rotary_pos_emb(
                query_states, key_states, cos, sin, self.config.rope_parameters["mrope_section"]
            )

After:

    class Qwen2_5_VLDecoderLayer(GradientCheckpointingLayer):
        def forward(self, hidden_states, ..., **kwargs):
            pto_kernels = sys.modules.get("pto_kernels")
            if pto_kernels is not None and getattr(pto_kernels, "USE_PTO_ATTENTION_PROLOGUE", False):
                kwargs["pto_input_layernorm"] = self.input_layernorm
            residual = hidden_states
            if "pto_input_layernorm" not in kwargs:
                hidden_states = self.input_layernorm(hidden_states)
            hidden_states, _ = self.self_attn(hidden_states=hidden_states, ..., **kwargs)

    class Qwen2_5_VLAttention(nn.Module):
        def forward(self, hidden_states, ..., **kwargs):
            pto_input_layernorm = kwargs.pop("pto_input_layernorm", None)
            bsz, q_len, _ = hidden_states.size()
            if pto_input_layernorm is not None:
                cos, sin = position_embeddings
                query_states, key_states, value_states = sys.modules["pto_kernels"].attention_prologue_wrapper(
                    self, pto_input_layernorm, hidden_states, cos, sin, self.config.rope_parameters["mrope_section"]
                )
            else:
                query_states = self.q_proj(hidden_states)
                ...  # as before, through the rotary call
"""

from __future__ import annotations

import libcst as cst

from pto_patch.errors import AnchorNotFoundError
from pto_patch.patching.codemods import decoder_layer as dl
from pto_patch.patching.codemods.context import PatchContext
from pto_patch.patching.codemods.guards import with_import_sys
from pto_patch.patching.codemods.injection_templates import template_piece

OP = "attention_prologue"
TEMPLATE = "decoder_blocks"


class InjectAttentionPrologue:
    def transform(self, module: cst.Module, ctx: PatchContext, file_name: str) -> cst.Module:
        found = dl.layer_to_patch(module, ctx, file_name, OP)
        if found is None:
            return module
        injection, where, layer = found
        if layer.input_norm is None:
            raise AnchorNotFoundError(
                f"{layer.class_name}.forward in {where} has no `{layer.hidden} = self.<norm>({layer.hidden})` "
                "before its attention call",
                "this release changed the decoder layer; the attention_prologue injection cannot place its block",
            )
        prologue = dl.find_prologue(module, layer.attention_class, injection.functions, where, OP)
        kwargs = cst.Name(layer.kwargs)

        statements = dl.body_statements(layer.forward)
        statements[layer.input_norm : layer.input_norm + 1] = template_piece(
            TEMPLATE, "prologue_input_norm", {"KWARGS": kwargs}, {"ORIGINAL": [statements[layer.input_norm]]}
        )
        norm = cst.parse_expression(f"self.{layer.input_norm_attr}")
        guard = template_piece(
            TEMPLATE, "prologue_guard", {"KWARGS": kwargs, "INPUT_NORM": norm}, switch=injection.switch
        )
        module = dl.with_layer_body(module, layer, statements, guard)

        attention = dl.body_statements(prologue.forward)
        wrapped = attention[prologue.first_projection : prologue.rotary + 1]
        # what the block does not replace (`cos, sin = position_embeddings`), without its blank lines and
        # comments: those stay with the original statements in the else branch
        kept = [
            s.with_changes(leading_lines=())
            for s in wrapped
            if not set(dl.assigned_names(s)) & set(prologue.qkv)
        ]
        args = [arg.value for arg in prologue.rotary_call.args]
        sectioned = dl.rotary_is_sectioned(module, prologue.rotary_call)
        if len(args) < (5 if sectioned else 4):
            raise AnchorNotFoundError(
                f"the rotary call in {layer.attention_class}.forward in {where} does not pass q, k, cos, sin"
                + (" and the sections" if sectioned else ""),
                "this release changed the rotary call; update templates/injections/decoder_blocks.py",
            )
        names = {"HIDDEN": cst.Name(prologue.hidden), "COS": args[2], "SIN": args[3]}
        names |= dict(zip(("Q", "K", "V"), map(cst.Name, prologue.qkv), strict=True))
        if sectioned:
            names["SECTION"] = args[4]
        piece = "prologue_sectioned" if sectioned else "prologue_mixed"
        received = template_piece(TEMPLATE, "prologue_received", {"KWARGS": cst.Name(prologue.kwargs)})
        update = dl.find_cache_update(prologue.forward, prologue.rotary + 1, prologue.qkv)
        if update is not None:  # the op writes a static cache itself; the update then runs only if it did not
            piece += "_cached"
            position = cst.Name(update.position or "None")
            names |= {"CACHE": cst.Name(update.cache), "POSITION": position}
            attention[update.index : update.index + 1] = template_piece(
                TEMPLATE, "prologue_cache_update", {}, {"ORIGINAL": [attention[update.index]]}
            )
            received += template_piece(TEMPLATE, "prologue_cache_received", {})
        block = template_piece(TEMPLATE, piece, names, {"KEPT": kept, "ORIGINAL": wrapped})
        attention[prologue.first_projection : prologue.rotary + 1] = block
        forward = dl.with_body(prologue.forward, dl.insert_after_docstring(attention, received))
        return with_import_sys(dl.replace_method(module, layer.attention_class, forward))
