"""pto-patch injection template: the decoder-layer blocks (attention prologue, attention core, MLP block,
residual add + norm).

A block spans two methods: the decoder layer's `forward` decides (a guard at its top reads the switch)
and its attention's `forward` follows (it pops what the layer handed it through **kwargs). Each function
below is one piece; the codemod takes its body and fills in:
- names: KWARGS (the forward's **kwargs), HIDDEN, RESIDUAL, Q, K, V, MASK, OUT, WEIGHTS, CACHE (the
  source's own variables and expressions), POSITION (the attention's `cache_position`, or None), INPUT_NORM,
  POST_NORM, MLP, O_PROJ, ATTENTION (module expressions such as `self.input_layernorm`),
  COS, SIN, SECTION (the rotary call's own arguments);
- statements: ORIGINAL (the statements a piece wraps; with the switch off they run as written), KEPT
  (statements of the wrapped range the block does not replace, such as `cos, sin = position_embeddings`);
- the string "SWITCH": the spec's switch name.
"""

import sys


def prologue_guard(KWARGS):
    pto_kernels = sys.modules.get("pto_kernels")
    if pto_kernels is not None and getattr(pto_kernels, "SWITCH", False):
        KWARGS["pto_input_layernorm"] = INPUT_NORM


def prologue_input_norm(KWARGS):
    if "pto_input_layernorm" not in KWARGS:
        ORIGINAL


def prologue_received(KWARGS):
    pto_input_layernorm = KWARGS.pop("pto_input_layernorm", None)


def prologue_sectioned(self, HIDDEN):
    if pto_input_layernorm is not None:
        KEPT
        Q, K, V = sys.modules["pto_kernels"].attention_prologue_wrapper(
            self, pto_input_layernorm, HIDDEN, COS, SIN, SECTION
        )
    else:
        ORIGINAL


def prologue_mixed(self, HIDDEN):
    if pto_input_layernorm is not None:
        KEPT
        Q, K, V = sys.modules["pto_kernels"].attention_prologue_mixed_wrapper(
            self, pto_input_layernorm, HIDDEN, COS, SIN
        )
    else:
        ORIGINAL


def prologue_cache_received():
    pto_cache_written = False


def prologue_sectioned_cached(self, HIDDEN):
    if pto_input_layernorm is not None:
        KEPT
        Q, K, V, pto_cache_written = sys.modules["pto_kernels"].attention_prologue_cache_wrapper(
            self, pto_input_layernorm, HIDDEN, COS, SIN, SECTION, CACHE, POSITION
        )
    else:
        ORIGINAL


def prologue_mixed_cached(self, HIDDEN):
    if pto_input_layernorm is not None:
        KEPT
        Q, K, V, pto_cache_written = sys.modules["pto_kernels"].attention_prologue_mixed_cache_wrapper(
            self, pto_input_layernorm, HIDDEN, COS, SIN, CACHE, POSITION
        )
    else:
        ORIGINAL


def prologue_cache_update():
    if not pto_cache_written:
        ORIGINAL


def mlp_block_guard(KWARGS):
    pto_kernels = sys.modules.get("pto_kernels")
    if pto_kernels is not None and getattr(pto_kernels, "SWITCH", False):
        KWARGS["pto_defer_o_proj"] = True


def mlp_block_run(KWARGS, HIDDEN, RESIDUAL):
    if KWARGS.get("pto_defer_o_proj", False):
        HIDDEN = sys.modules["pto_kernels"].mlp_block_wrapper(RESIDUAL, HIDDEN, O_PROJ, POST_NORM, MLP)
    else:
        ORIGINAL


def mlp_block_received(KWARGS):
    pto_defer_o_proj = KWARGS.pop("pto_defer_o_proj", False)


def mlp_block_o_proj():
    if not pto_defer_o_proj:
        ORIGINAL


def residual_guard():
    pto_kernels = sys.modules.get("pto_kernels")
    if pto_kernels is not None and getattr(pto_kernels, "SWITCH", False):
        pto_residual_rms_norm = pto_kernels.residual_rms_norm_wrapper
    else:
        pto_residual_rms_norm = None


def residual_norm(HIDDEN, RESIDUAL):
    if pto_residual_rms_norm is not None:
        HIDDEN, RESIDUAL = pto_residual_rms_norm(HIDDEN, RESIDUAL, POST_NORM)
    else:
        ORIGINAL


def core_guard(KWARGS):
    pto_kernels = sys.modules.get("pto_kernels")
    if pto_kernels is not None and getattr(pto_kernels, "SWITCH", False):
        KWARGS["pto_attention_core"] = True


def core_received(KWARGS):
    pto_attention_core = KWARGS.pop("pto_attention_core", False)


def core_run(self):
    OUT = None
    if pto_attention_core and Q.shape[2] <= 16 and not getattr(self, "sliding_window", None):
        OUT = sys.modules["pto_kernels"].attention_core_model_wrapper(self, Q, K, V, MASK)
        WEIGHTS = None
    if OUT is None:
        ORIGINAL
