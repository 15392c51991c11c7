"""Python changes tests make to a patched folder's code or to a loaded model."""

from __future__ import annotations

import shutil
from pathlib import Path

# Appended to the folder's kernel package: RMSNorm comes out 25 % too large.
WRONG_RMS_NORM = """

_correct_rms_norm_wrapper = rms_norm_wrapper


def rms_norm_wrapper(hidden_states, weight, eps=1e-6):
    return _correct_rms_norm_wrapper(hidden_states, weight, eps) * 1.25
"""


# The reference RMSNorm made x1.5 at one-row (decode) calls only: the prefill's step is right, every decode
# step wrong (the fault a prefill-only verify passed).
DECODE_ONLY_FAULT = (
    "    out = weight * hidden_states.to(input_dtype)\n"
    "    return out * 1.5 if hidden_states.numel() // hidden_states.shape[-1] == 1 else out\n"
)


def decode_fault_copy(patched: Path, folder: Path) -> Path:
    """A copy of a patched folder whose reference RMSNorm carries DECODE_ONLY_FAULT."""
    shutil.copytree(patched, folder, symlinks=True)
    path = folder / "pto_kernels" / "backends" / "reference.py"
    text = path.read_text()
    original = "    return weight * hidden_states.to(input_dtype)\n"
    assert original in text
    path.write_text(text.replace(original, DECODE_ONLY_FAULT, 1))
    return folder
