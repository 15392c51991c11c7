"""pto-patch injection template: the RMSNorm guard.

The body of `guard` is inserted at the top of the RMSNorm class's `forward` (after its docstring).
The codemod binds `guard`'s parameters to the forward's parameters by position, and substitutes
WEIGHT and EPS (the module's weight and epsilon attributes) and the string "SWITCH" (the spec's
switch name).
"""

import sys


def guard(self, hidden_states):
    pto_kernels = sys.modules.get("pto_kernels")
    if pto_kernels is not None and getattr(pto_kernels, "SWITCH", False):
        return pto_kernels.rms_norm_wrapper(hidden_states, WEIGHT, EPS)
