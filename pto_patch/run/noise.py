"""A timing ratio with its noise: the median of per-round ratios and a band from their spread.

verify and bench time the two modes in rounds (one run of each, the order reversed every other
round), so each round gives one ratio of speeds, PTO over baseline, with the machine's load alike
for both. tune measures its candidates the same way and decides from the same band.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Normal-approximation standard error of a median is 1.2533 sigma / sqrt(n); sigma from the MAD.
_MEDIAN_SE = 1.2533
_MAD_TO_SIGMA = 1.4826
MIN_ROUNDS = 3  # fewer ratios have no spread to speak of

FASTER = "faster"
SLOWER = "slower"
WITHIN_NOISE = "within noise"
TOO_FEW = "too few runs to tell"
NOTHING_ON = "nothing switched on"


@dataclass(frozen=True)
class Band:
    """A gain estimate: the median per-round ratio (candidate / baseline tokens per second) and its
    noise band [low, high]."""

    ratio: float
    low: float
    high: float
    rounds: int
    nothing_on: bool = False  # both modes ran the same code: no ratio of theirs is a gain

    @property
    def verdict(self) -> str:
        """What the band alone says: faster or slower where it clears 1, else within noise."""
        if self.nothing_on:
            return NOTHING_ON
        if self.rounds < MIN_ROUNDS:
            return TOO_FEW
        if self.low > 1.0:
            return FASTER
        if self.high < 1.0:
            return SLOWER
        return WITHIN_NOISE

    def to_json(self) -> dict[str, float | int | str | None]:
        finite = math.isfinite(self.low) and math.isfinite(self.high) and not self.nothing_on
        return {
            "median": None if math.isnan(self.ratio) or self.nothing_on else round(self.ratio, 4),
            "low": round(self.low, 4) if finite else None,
            "high": round(self.high, 4) if finite else None,
            "rounds": self.rounds,
            "verdict": self.verdict,
        }


def band(ratios: Sequence[float], z: float = 2.0) -> Band:
    """Median of the per-round ratios, +- z standard errors of a median (sigma estimated from the MAD).

    With fewer than 3 ratios there is no spread to speak of: the band is infinitely wide.
    """
    import statistics  # only where a band is made: the quick commands' JSON imports this module

    if not ratios:
        return Band(math.nan, -math.inf, math.inf, 0)
    median = statistics.median(ratios)
    if len(ratios) < MIN_ROUNDS:
        return Band(median, -math.inf, math.inf, len(ratios))
    mad = statistics.median(abs(r - median) for r in ratios)
    half = z * _MEDIAN_SE * _MAD_TO_SIGMA * mad / math.sqrt(len(ratios))
    return Band(median, median - half, median + half, len(ratios))


def speed_band(
    baseline_latencies: Sequence[float], pto_latencies: Sequence[float], switched_on: bool = True
) -> Band:
    """PTO's speed over the baseline's, round by round (same round, same load), with its band; with
    nothing switched on, no ratio at all (two runs of the same code differ by noise and order only)."""
    ratios = [base / pto for base, pto in zip(baseline_latencies, pto_latencies, strict=False) if pto > 0]
    if not switched_on:
        return Band(math.nan, -math.inf, math.inf, len(ratios), nothing_on=True)
    return band(ratios)


def describe(estimate: Band) -> str:
    """`1.04x [0.98, 1.10] within noise`, or the ratio and why it says nothing yet."""
    if estimate.nothing_on:
        return "no ratio: nothing was switched on, so both modes ran the same code"
    if estimate.rounds == 0:
        return "-"
    if estimate.rounds < MIN_ROUNDS:
        return f"{estimate.ratio:.2f}x ({estimate.rounds} timed run(s): too few to tell; --iters {MIN_ROUNDS} or more)"
    return f"{estimate.ratio:.2f}x [{estimate.low:.2f}, {estimate.high:.2f}] {estimate.verdict}"
