"""pto-patch injection template: the text MLP (SwiGLU) guard.

The body of `guard` is inserted at the top of the MLP class's `forward`. Parameters bind to the
forward's parameters by position; the string "SWITCH" becomes the spec's switch name.
"""

import sys


def guard(self, hidden_states):
    pto_kernels = sys.modules.get("pto_kernels")
    if pto_kernels is not None and getattr(pto_kernels, "SWITCH", False):
        return pto_kernels.swiglu_mlp_wrapper(self, hidden_states)
