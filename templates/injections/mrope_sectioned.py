"""pto-patch injection template: the MRoPE guard where cos/sin are not yet section-mixed.

For `apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section, unsqueeze_dim=1)` (transformers
up to 5.16): cos/sin are [3, b, s, d] and the kernel does the section mixing. The body of `guard` is
inserted at the top of the function; parameters bind by position; "SWITCH" becomes the spec's switch.
"""

import sys


def guard(q, k, cos, sin, mrope_section, unsqueeze_dim):
    pto_kernels = sys.modules.get("pto_kernels")
    if pto_kernels is not None and getattr(pto_kernels, "SWITCH", False):
        return pto_kernels.mrope_pto_correct(q, k, cos, sin, mrope_section, unsqueeze_dim)
