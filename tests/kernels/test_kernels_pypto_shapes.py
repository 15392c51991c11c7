"""A head width the PyPTO rotary kernels cannot take is refused with the widths that fit."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))

from pto_kernels.backends import pypto_pieces  # noqa: E402


@pytest.mark.parametrize(("dtype", "fits", "step"), [(torch.bfloat16, 32, 32), (torch.float32, 16, 16)])
def test_a_head_too_narrow_for_whole_blocks_names_the_widths_that_fit(dtype, fits, step):
    pypto_pieces.check_half_blocks(fits, dtype, "kernel")
    pypto_pieces.check_half_blocks(128, dtype, "kernel")  # GutenOCR-3B's head
    narrow = fits // 2
    with pytest.raises(ValueError) as refused:
        pypto_pieces.check_half_blocks(narrow, dtype, "pypto MRoPE kernel")
    message = str(refused.value)
    assert f"head_dim {narrow} in {dtype}" in message and f"head_dim {step}, {2 * step}" in message
