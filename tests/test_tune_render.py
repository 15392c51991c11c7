"""tune's text table: a ratio with too few rounds for a noise band (`--iters 1`) prints without one."""

from __future__ import annotations

import math

import pytest

from pto_patch.cli import tune_render
from pto_patch.run.noise import band


@pytest.mark.parametrize("ratios", [[1.1], [0.9, 1.2]])
def test_a_ratio_without_a_band_prints_its_median_alone(ratios):
    measured = band(ratios)
    assert math.isinf(measured.low)  # below 3 rounds the band is unbounded: no figures to print
    entry = {"ratio_to_baseline": measured.to_json()}
    shown = tune_render._ratio(entry)
    assert shown == f"{measured.ratio:.3f} [no band]"


def test_a_ratio_with_a_band_prints_both_ends():
    measured = band([1.0, 1.1, 1.2, 1.05])
    shown = tune_render._ratio({"ratio_to_baseline": measured.to_json()})
    assert shown == f"{measured.ratio:.3f} [{measured.low:.3f}, {measured.high:.3f}]"


def test_no_ratio_prints_a_dash():
    assert tune_render._ratio({"ratio_to_baseline": None}) == "-"
