"""pto-patch injection template: the MRoPE guard where cos/sin arrive already section-mixed.

For `apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)` (transformers 5.20+, where the rotary
embedding module mixes the sections): cos/sin are [b, s, d]. The body of `guard` is inserted at the
top of the function; parameters bind by position; "SWITCH" becomes the spec's switch.
"""

import sys


def guard(q, k, cos, sin, unsqueeze_dim):
    pto_kernels = sys.modules.get("pto_kernels")
    if pto_kernels is not None and getattr(pto_kernels, "SWITCH", False):
        return pto_kernels.mrope_mixed_wrapper(q, k, cos, sin, unsqueeze_dim)
