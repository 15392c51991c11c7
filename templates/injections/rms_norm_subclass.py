"""pto-patch injection template: a local RMSNorm subclass, for releases that import the class.

The codemod renames RMS_NORM_CLASS (the spec's name for the imported class) and
IMPORTED_RMS_NORM (the imported class), then injects the rms_norm guard into `forward`
like into any local RMSNorm class.
"""


class RMS_NORM_CLASS(IMPORTED_RMS_NORM):
    """The imported RMSNorm with a pto-patch guard in `forward`."""

    def forward(self, hidden_states):
        return super().forward(hidden_states)
