"""pto-patch injection template: the MRoPE guard where cos/sin arrive section-mixed, behind an unused position_ids.

For Qwen3-VL's `apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1)` (transformers 4.57,
where position_ids is deprecated and unused and the rotary embedding module has already interleaved the
sections): cos/sin are [b, s, d]. The body of `guard` is inserted at the top of the function; parameters bind
by position; "SWITCH" becomes the spec's switch.
"""

import sys


def guard(q, k, cos, sin, position_ids, unsqueeze_dim):
    pto_kernels = sys.modules.get("pto_kernels")
    if pto_kernels is not None and getattr(pto_kernels, "SWITCH", False):
        return pto_kernels.mrope_mixed_wrapper(q, k, cos, sin, unsqueeze_dim)
