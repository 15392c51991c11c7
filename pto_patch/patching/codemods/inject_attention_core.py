"""The attention_core op: a decode step's attention over the KV cache, in place of the attention function.

The decoder layer tells its attention to use the op; the attention calls it instead of its attention
function (eager or sdpa) when the call is a decode step (at most 16 new rows a sequence, at any batch: each
sequence's range of the cache, left padding included, is read from the mask) and the layer attends over
the whole cache (a sliding-window layer runs the model's own). The op's wrapper hands back None for a mask
that is not one range a sequence (a hole inside one), and the attention then runs its own function.
The KV-cache update before it and o_proj after it stay as written. With the switch off both run as
written.

Before (5.16):

    class Qwen2_5_VLAttention(nn.Module):
        def forward(self, hidden_states, attention_mask, ..., **kwargs):
            ...
            if past_key_values is not None:
                key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx)
            attention_interface = ...
            attn_output, attn_weights = attention_interface(
                self, query_states, key_states, value_states, attention_mask, dropout=..., scaling=self.scaling, ...
            )

After (the decoder layer's forward gets the guard at its top):

    class Qwen2_5_VLDecoderLayer(GradientCheckpointingLayer):
        def forward(self, hidden_states, ..., **kwargs):
            pto_kernels = sys.modules.get("pto_kernels")
            if pto_kernels is not None and getattr(pto_kernels, "USE_PTO_ATTENTION_CORE", False):
                kwargs["pto_attention_core"] = True
            ...

    class Qwen2_5_VLAttention(nn.Module):
        def forward(self, hidden_states, attention_mask, ..., **kwargs):
            pto_attention_core = kwargs.pop("pto_attention_core", False)
            ...
            attn_output = None
            if pto_attention_core and query_states.shape[2] <= 16 and not getattr(self, "sliding_window", None):
                attn_output = sys.modules["pto_kernels"].attention_core_model_wrapper(
                    self, query_states, key_states, value_states, attention_mask
                )
                attn_weights = None
            if attn_output is None:
                attn_output, attn_weights = attention_interface(...)
"""

from __future__ import annotations

import libcst as cst

from pto_patch.errors import AnchorNotFoundError
from pto_patch.patching.codemods import decoder_layer as dl
from pto_patch.patching.codemods.context import PatchContext
from pto_patch.patching.codemods.guards import with_import_sys
from pto_patch.patching.codemods.injection_templates import template_piece

OP = "attention_core"
TEMPLATE = "decoder_blocks"
ATTENTION_FUNCTION = "attention_interface"


def find_attention_call(forward: cst.FunctionDef) -> tuple[int, cst.Call, tuple[str, ...]] | None:
    """(index, call, targets) of `out, weights = attention_interface(self, q, k, v, mask, ...)`."""
    for index, statement in enumerate(dl.body_statements(forward)):
        assign = dl.single_assign(statement)
        if assign is None or not isinstance(assign.value, cst.Call):
            continue
        call, targets = assign.value, dl.target_names(assign)
        positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
        if dl.is_name(call.func, ATTENTION_FUNCTION) and len(targets) == 2 and len(positional) >= 5:
            return index, call, targets
    return None


class InjectAttentionCore:
    def transform(self, module: cst.Module, ctx: PatchContext, file_name: str) -> cst.Module:
        found = dl.layer_to_patch(module, ctx, file_name, OP)
        if found is None:
            return module
        injection, where, layer = found
        forward, attention_kwargs = dl.attention_forward(module, layer.attention_class, where, OP)
        anchor = find_attention_call(forward)
        if anchor is None:
            raise AnchorNotFoundError(
                f"{layer.attention_class}.forward in {where} has no `attn_output, attn_weights = "
                f"{ATTENTION_FUNCTION}(self, query, key, value, attention_mask, ...)`",
                "this release changed the attention call; the attention_core injection cannot replace it",
            )
        index, call, (out, weights) = anchor
        guard = template_piece(
            TEMPLATE, "core_guard", {"KWARGS": cst.Name(layer.kwargs)}, switch=injection.switch
        )
        module = dl.with_layer_body(module, layer, dl.body_statements(layer.forward), guard)

        attention = dl.body_statements(forward)
        q, k, v, mask = (arg.value for arg in call.args[1:5])
        names = {"Q": q, "K": k, "V": v, "MASK": mask, "OUT": cst.Name(out), "WEIGHTS": cst.Name(weights)}
        attention[index : index + 1] = template_piece(
            TEMPLATE, "core_run", names, {"ORIGINAL": [attention[index]]}
        )
        received = template_piece(TEMPLATE, "core_received", {"KWARGS": cst.Name(attention_kwargs)})
        forward = dl.with_body(forward, dl.insert_after_docstring(attention, received))
        return with_import_sys(dl.replace_method(module, layer.attention_class, forward))
