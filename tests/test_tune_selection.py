"""tune's choice from measurements: noise bands, alternating rounds, repeats sized to the spread,
and whole decisions through the real pto_kernels switches with a test backend that spends simulated time."""

import itertools
import math
import sys
import types
from pathlib import Path

import pytest

from pto_patch.tune import selection as ts

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
import pto_kernels  # noqa: E402
from pto_kernels import _dispatch  # noqa: E402

from tests.helpers.tune_runners import lucky_then_even

RMS = ts.Candidate.of({"rms_norm": "fused"})
MLP = ts.Candidate.of({"swiglu_mlp": "fused"})
BOTH = ts.Candidate.of({"rms_norm": "fused", "swiglu_mlp": "fused"})


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def table_runner(speeds, clock=None, noise=None, order=None, seconds_per_run=1.0):
    """run_once from a table of tokens/s per candidate, optional noise and a record of the run order."""
    counter = itertools.count()

    def run_once(candidate):
        if order is not None:
            order.append(candidate)
        if clock is not None:
            clock.now += seconds_per_run
        value = speeds[candidate]
        if noise is not None:
            value *= noise(next(counter))
        return value

    return run_once


def test_band_is_the_median_with_a_mad_based_standard_error():
    estimate = ts.band([1.0, 1.1, 0.9, 1.05, 0.95])
    half = 2 * 1.2533 * 1.4826 * 0.05 / math.sqrt(5)
    assert estimate.ratio == pytest.approx(1.0)
    assert (estimate.low, estimate.high) == pytest.approx((1.0 - half, 1.0 + half))
    assert ts.band([1.2, 1.3]).low == -math.inf  # two runs say nothing about the spread


def test_sign_test():
    assert ts.sign_p([1.1] * 5) == pytest.approx(1 / 32)
    assert ts.sign_p([1.1] * 4 + [0.9]) == pytest.approx(6 / 32)
    assert ts.sign_p([]) == 1.0


@pytest.mark.parametrize(
    ("ratios", "expected"),
    [
        ([1.05, 1.06, 1.04, 1.05, 1.07], ts.FASTER),
        ([0.90, 0.91, 0.89, 0.90, 0.92], ts.SLOWER),
        ([1.001, 0.999, 1.0, 1.002, 0.998], ts.WITHIN_NOISE),
        ([1.2, 0.8, 1.1, 0.9, 1.3], ts.UNDECIDED),
        # a narrow band from ratios that mostly lie on its other side is luck
        ([1.05, 1.05, 1.05, 0.5, 0.5, 0.5, 0.5], ts.UNDECIDED),
        ([0.85, 0.8, 1.28], ts.UNDECIDED),  # three runs cannot call anything slower
    ],
)
def test_verdicts(ratios, expected):
    assert ts.verdict(ratios, ts.Rules()) == expected


def test_min_gain_raises_the_bar():
    ratios = [1.01, 1.012, 1.011, 1.009, 1.01]
    assert ts.verdict(ratios, ts.Rules()) == ts.FASTER
    assert ts.verdict(ratios, ts.Rules(min_gain=0.05)) != ts.FASTER


def test_rounds_alternate_and_ratios_pair_runs_of_the_same_round():
    order = []
    speeds = {ts.BASELINE: 10.0, RMS: 12.0, MLP: 8.0}
    rules = ts.Rules(warmup=1, min_rounds=5, max_rounds=5)
    result = ts.measure([RMS, MLP], table_runner(speeds, order=order), rules)
    warmup, rounds = order[:3], order[3:]
    assert warmup == [ts.BASELINE, RMS, MLP]
    assert rounds[:6] == [ts.BASELINE, RMS, MLP, MLP, RMS, ts.BASELINE]
    assert result[RMS].ratios == [pytest.approx(1.2)] * 5 and result[RMS].verdict == ts.FASTER
    assert result[MLP].verdict == ts.SLOWER
    assert len(result[ts.BASELINE].tokens_per_s) == 5


def test_drift_that_hits_both_sides_of_a_round_cancels():
    # the machine slows down steadily; the candidate is as fast as the baseline
    order = []
    speeds = {ts.BASELINE: 10.0, RMS: 10.0}
    drift = table_runner(speeds, order=order, noise=lambda i: 1.0 - 0.001 * i)
    result = ts.measure([RMS], drift, ts.Rules(warmup=0, max_rounds=12))
    assert result[RMS].verdict in (ts.WITHIN_NOISE, ts.UNDECIDED)
    assert result[RMS].band.ratio == pytest.approx(1.0, abs=0.002)


def test_repeats_grow_with_the_spread():
    speeds = {ts.BASELINE: 10.0, RMS: 10.3}
    rules = ts.Rules(warmup=0, min_rounds=5, max_rounds=40)
    quiet = ts.measure([RMS], table_runner(speeds), rules)
    assert len(quiet[RMS].ratios) == rules.min_rounds and quiet[RMS].verdict == ts.FASTER
    wobble = [1.0, 1.04, 0.97, 1.02, 0.96, 1.03, 0.98, 1.05, 0.99, 0.95, 1.01]
    noisy = ts.measure([RMS], table_runner(speeds, noise=lambda i: wobble[(i * 7) % len(wobble)]), rules)
    assert len(noisy[RMS].ratios) > rules.min_rounds


def test_a_decided_candidate_leaves_the_rounds():
    order = []
    speeds = {ts.BASELINE: 10.0, RMS: 20.0, MLP: 10.0}
    wobble = [1.0, 1.08, 0.93, 1.05, 0.96]
    noise = lambda i: wobble[i % 5] if order[i] == MLP else 1.0  # noqa: E731
    rules = ts.Rules(warmup=0, min_rounds=5, max_rounds=12)
    result = ts.measure([RMS, MLP], table_runner(speeds, order=order, noise=noise), rules)
    assert len(result[RMS].ratios) == 5 and len(result[MLP].ratios) > 5


def test_the_deadline_stops_rounds_and_leaves_them_undecided():
    clock = FakeClock()
    speeds = {ts.BASELINE: 10.0, RMS: 12.0}
    rules = ts.Rules(warmup=1, min_rounds=5, max_rounds=15)
    result = ts.measure([RMS], table_runner(speeds, clock=clock), rules, deadline=7.5, clock=clock)
    # 2 warm-up runs, then 2-run rounds while the next round still ends by the deadline
    assert len(result[RMS].ratios) == 2 and clock.now <= 7.5
    assert result[RMS].verdict == ts.UNDECIDED
    assert ts.choose(result.values()) is None


def test_choose_takes_the_best_faster_candidate_or_nothing():
    def entry(candidate, ratios):
        measured = ts.Measured(candidate, [1.0] * len(ratios), ratios, ts.band(ratios))
        measured.verdict = ts.verdict(ratios, ts.Rules())
        return measured

    slow = [entry(RMS, [0.9] * 5), entry(MLP, [0.95, 0.96, 0.94, 0.95, 0.95])]
    assert ts.choose(slow) is None
    fast = [entry(RMS, [1.02] * 5), entry(MLP, [1.05] * 5), entry(BOTH, [1.2, 0.8, 1.5, 0.7, 1.3])]
    assert ts.choose(fast).candidate == MLP


def test_a_winner_that_does_not_hold_in_fresh_rounds_is_not_switched_on():
    decision = ts.decide_batch(1, [MLP], lucky_then_even(5), ts.Rules(warmup=0))
    assert decision.tried[0].verdict == ts.FASTER  # the rounds that picked it
    assert decision.confirmation.verdict == ts.WITHIN_NOISE and decision.chosen is None
    held = ts.decide_batch(1, [MLP], lucky_then_even(1000), ts.Rules(warmup=0))
    assert held.confirmation.verdict == ts.FASTER and held.chosen_ops == {"swiglu_mlp": "fused"}


def test_a_winner_the_budget_leaves_unconfirmed_is_not_switched_on():
    now = [0.0]

    def run_once(candidate):  # 1 s a run: 5 two-run rounds pick the op, no time is left to confirm it
        now[0] += 1.0
        return 10.0 if candidate.is_baseline else 11.0

    decision = ts.decide_batch(1, [MLP], run_once, ts.Rules(warmup=0), deadline=11.0, clock=lambda: now[0])
    assert decision.tried[0].verdict == ts.FASTER
    assert decision.confirmation.verdict in (ts.UNDECIDED, ts.NOT_MEASURED) and decision.chosen is None


def test_combinations_come_from_the_ops_that_won_alone():
    speeds = {ts.BASELINE: 10.0, RMS: 11.0, MLP: 11.0, BOTH: 12.5}
    speeds[ts.Candidate.of({"mrope": "fused"})] = 9.0
    decision = ts.decide_batch(
        4,
        ts.singles(["rms_norm", "mrope", "swiglu_mlp"], ["fused"]),
        table_runner(speeds),
        ts.Rules(warmup=0),
    )
    assert decision.stages == 2
    assert decision.chosen_ops == {"rms_norm": "fused", "swiglu_mlp": "fused"}
    assert {entry.candidate.label for entry in decision.tried} == {
        "rms_norm=fused",
        "mrope=fused",
        "swiglu_mlp=fused",
        "rms_norm=fused+swiglu_mlp=fused",
    }


# --- whole decisions through the real switches, with a test backend that spends simulated time ---------
# The time each op takes is simulated (a wall-clock sleep is at the mercy of a loaded machine), with a
# deterministic run-to-run wobble of a few percent so that the noise bands are not zero wide.


class _Clock:
    def __init__(self) -> None:
        self.elapsed, self.runs = 0.0, 0

    def spend(self, seconds: float) -> None:
        self.elapsed += seconds

    def rate(self) -> float:
        """Steps per second of the run just made, wobbled by up to 3% (a fixed pattern, not a seed)."""
        self.runs += 1
        wobble = 1.0 + 0.03 * ((self.runs * 7) % 5 - 2) / 2
        spent, self.elapsed = self.elapsed * wobble, 0.0
        return 1.0 / spent


def _simulated_backend(clock: _Clock, kernel_s: dict[str, float]) -> types.ModuleType:
    module = types.ModuleType("simulated_backend")
    module.rms_norm = lambda x, w, eps=1e-6: clock.spend(kernel_s["rms_norm"])
    module.mrope = lambda q, k, cos, sin, section, dim=1: clock.spend(kernel_s["mrope"])
    module.swiglu_mlp = lambda mlp, x: clock.spend(kernel_s["swiglu_mlp"])
    return module


def _model_step(clock: _Clock, eager_s: dict[str, float], layers: int = 1) -> float:
    """A "decode step" whose ops go through the guards as the patched modeling code has them (of the
    package this module switches: an earlier test may have left another `pto_kernels` in sys.modules, a
    patched folder's)."""
    kernels = pto_kernels
    for _ in range(layers):
        if kernels.USE_PTO_RMS_NORM:
            kernels.rms_norm_wrapper(None, None, 1e-6)
        else:
            clock.spend(eager_s["rms_norm"])
        if kernels.USE_PTO_MROPE:
            kernels.mrope_pto_correct(None, None, None, None, [1, 1, 1])
        else:
            clock.spend(eager_s["mrope"])
        if kernels.USE_PTO_SWIGLU_MLP:
            kernels.swiglu_mlp_wrapper(None, None)
        else:
            clock.spend(eager_s["swiglu_mlp"])
    return clock.rate()


def _tune_with_simulated_time(monkeypatch, eager_s, kernel_s):
    clock = _Clock()
    monkeypatch.setitem(_dispatch._modules, "fused", _simulated_backend(clock, kernel_s))

    def run_once(candidate):
        if candidate.is_baseline:
            pto_kernels.disable()
        else:
            pto_kernels.enable(candidate.op_names, backend=candidate.as_dict())
        return _model_step(clock, eager_s)

    try:
        alone = ts.singles(["rms_norm", "mrope", "swiglu_mlp"], ["fused"])
        return ts.decide_batch(1, alone, run_once, ts.Rules())
    finally:
        pto_kernels.disable()
        pto_kernels.enable((), backend="auto")


def test_every_op_made_slower_switches_nothing_on(monkeypatch):
    eager = dict.fromkeys(("rms_norm", "mrope", "swiglu_mlp"), 0.03)
    decision = _tune_with_simulated_time(monkeypatch, eager, dict.fromkeys(eager, 0.06))
    assert decision.chosen is None and decision.chosen_ops == {}
    assert {entry.verdict for entry in decision.tried} == {ts.SLOWER}
    assert decision.stages == 1


def test_the_op_made_faster_is_switched_on(monkeypatch):
    eager = dict.fromkeys(("rms_norm", "mrope", "swiglu_mlp"), 0.03)
    kernel = {"rms_norm": 0.06, "mrope": 0.06, "swiglu_mlp": 0.003}
    decision = _tune_with_simulated_time(monkeypatch, eager, kernel)
    assert decision.chosen_ops == {"swiglu_mlp": "fused"}
    assert decision.chosen.band.low > 1.0 and decision.confirmation.verdict == ts.FASTER
    assert pto_kernels.stats()["swiglu_mlp"]["backends"].get("fused", 0) > 0


def test_a_clear_gain_with_an_outlier_is_measured_again_not_called_noise():
    ratios = [1.40, 1.41, 0.7, 1.40, 1.41]  # the band is narrow, but one run in five went the other way
    assert ts.verdict(ratios, ts.Rules()) == ts.UNDECIDED
    assert ts.verdict([*ratios, 1.40, 1.41, 1.40], ts.Rules()) == ts.FASTER


def test_no_run_starts_that_would_end_past_the_deadline():
    clock = FakeClock()
    speeds = {ts.BASELINE: 10.0, RMS: 12.0}
    rules = ts.Rules(warmup=1)
    runner = table_runner(speeds, clock=clock)
    ts.measure([RMS], runner, rules, deadline=1.5, clock=clock, expected_warm_up_s=1.0)
    assert clock.now == 1.0  # one warm-up run; a second would have ended at 2.0


def test_warm_ups_estimate_the_first_round():
    clock = FakeClock()

    def warm_up(candidate):
        clock.now += 0.1  # a short run that says a measured one takes 2 s
        return 2.0

    speeds = {ts.BASELINE: 10.0, RMS: 12.0}
    runner = table_runner(speeds, clock=clock, seconds_per_run=2.0)
    rules = ts.Rules(warmup=1)
    result = ts.measure([RMS], runner, rules, deadline=3.0, clock=clock, warm_up=warm_up)
    assert clock.now == pytest.approx(0.2) and result[RMS].tokens_per_s == []  # a 4 s round would overrun


def test_warm_ups_come_from_warm_up_when_given():
    warmed, order = [], []
    speeds = {ts.BASELINE: 10.0, RMS: 5.0, MLP: 10.3}
    rules = ts.Rules(warmup=1, min_rounds=5, max_rounds=5)
    result = ts.measure(
        [RMS, MLP], table_runner(speeds, order=order), rules, warm_up=lambda c: warmed.append(c)
    )
    assert warmed == [ts.BASELINE, RMS, MLP] and order.count(ts.BASELINE) == 5
    assert result[RMS].verdict == ts.SLOWER and result[MLP].verdict == ts.FASTER


def test_combinations_never_pair_a_block_with_an_op_it_does_the_work_of():
    won = {
        ts.Candidate.of({op: "fused"}): None
        for op in ("rms_norm", "swiglu_mlp", "mlp_block", "attention_prologue", "mrope")
    }
    measured = {
        candidate: ts.Measured(candidate, verdict=ts.FASTER, band=ts.band([1.1, 1.1, 1.1]), seconds=[1.0])
        for candidate in won
    }
    labels = {candidate.label for candidate in ts.combinations(measured)}
    assert "attention_prologue=fused+mlp_block=fused+rms_norm=fused" in labels
    assert "mlp_block=fused+rms_norm=fused" in labels
    for label in labels:  # a block with its own op never: that op could not run
        assert not ("mlp_block" in label and "swiglu_mlp" in label), label
        assert not ("attention_prologue" in label and "mrope" in label), label
    assert len(ts.combinations({**measured})) < 2 ** len(won) - len(won) - 1  # some sets were left out
