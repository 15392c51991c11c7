"""Which ops to switch on at one batch size, decided from measurements alone (no model in here).

Each candidate is a set of (op, backend) pairs; the empty set is the baseline (every switch off).
Runs are measured in rounds: every round runs the baseline and each live candidate once, the order
reversed every other round, and each candidate run's speed is taken relative to the baseline
interpolated between the baseline runs around it, so a shared machine's drift cancels out. A candidate's gain is the
median of its per-run ratios, with a noise band from their spread; rounds continue until every
candidate's band is clear of 1 (faster or slower, confirmed by a sign test), within 1 +- `resolution`
(no difference worth having), or the time is up. The choice is the candidate with the best median
ratio measured faster; if there is none, nothing is switched on.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pto_patch.model.spec import BLOCKS
from pto_patch.run.noise import Band, band  # noqa: F401 - the band verify and bench give too

FASTER = "faster"
SLOWER = "slower"
WITHIN_NOISE = "within noise"
UNDECIDED = "undecided"  # the time ran out before its band cleared 1
NOT_MEASURED = "not measured"


@dataclass(frozen=True, order=True)
class Candidate:
    """The ops switched on and each one's backend; () is the baseline."""

    ops: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, ops: dict[str, str] | Iterable[tuple[str, str]]) -> Candidate:
        pairs = ops.items() if isinstance(ops, dict) else ops
        return cls(tuple(sorted(pairs)))

    @property
    def is_baseline(self) -> bool:
        return not self.ops

    @property
    def op_names(self) -> tuple[str, ...]:
        return tuple(op for op, _ in self.ops)

    def as_dict(self) -> dict[str, str]:
        return dict(self.ops)

    @property
    def label(self) -> str:
        return "+".join(f"{op}={backend}" for op, backend in self.ops) or "baseline"


BASELINE = Candidate()


@dataclass(frozen=True)
class Rules:
    """How long to measure and what counts as a gain."""

    warmup: int = 1  # unmeasured runs per candidate before the first round
    min_rounds: int = 5  # fewer cannot pass the sign test at alpha 0.05
    max_rounds: int = 15
    resolution: float = 0.005  # a band within 1 +- 0.5 %: no difference worth having
    min_gain: float = 0.0
    z: float = 2.0  # the noise band is +- z standard errors of the median ratio
    alpha: float = 0.05  # sign-test level a "faster" verdict must also pass


def sign_p(ratios: Sequence[float], above: bool = True) -> float:
    """One-sided sign test: the chance of at least this many ratios above 1 (below 1 with
    above=False) if the candidate made no difference."""
    n = len(ratios)
    count = sum(1 for r in ratios if (r > 1.0 if above else r < 1.0))
    return sum(math.comb(n, k) for k in range(count, n + 1)) / 2**n if n else 1.0


def verdict(ratios: Sequence[float], rules: Rules) -> str:
    """faster when the band clears 1 + min_gain and the ratios lie above 1 more often than chance
    allows (a median band from few runs can be narrow by luck); slower likewise below 1; within
    noise once the band lies within 1 +- resolution; undecided otherwise."""
    estimate = band(ratios, rules.z)
    if estimate.low > 1.0 + rules.min_gain and sign_p(ratios) <= rules.alpha:
        return FASTER
    if estimate.high < 1.0 and sign_p(ratios, above=False) <= rules.alpha:
        return SLOWER
    if 1.0 - rules.resolution <= estimate.low and estimate.high <= 1.0 + rules.resolution:
        return WITHIN_NOISE
    return UNDECIDED


@dataclass
class Measured:
    """One candidate's runs at one batch size (tokens per second), paired with the baseline's."""

    candidate: Candidate
    tokens_per_s: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # per run, over the baseline interpolated around it
    band: Band | None = None
    verdict: str = NOT_MEASURED
    seconds: list[float] = field(default_factory=list)  # how long each measured run took

    @property
    def stated_verdict(self) -> str:
        """The verdict as printed, agreeing with the band printed beside it: an undecided candidate whose
        band clears 1 says which way, and that too few rounds (or the sign test) left it unconfirmed."""
        b = self.band
        if self.verdict != UNDECIDED or b is None or b.verdict not in (FASTER, SLOWER):
            return self.verdict
        return f"{UNDECIDED}: {b.verdict} by its band, not confirmed in {b.rounds} round(s)"

    def summary(self) -> dict[str, Any]:
        speeds = self.tokens_per_s
        median = statistics.median(speeds) if speeds else None
        mad = statistics.median(abs(s - median) for s in speeds) if speeds else None
        doc: dict[str, Any] = {
            "ops": self.candidate.as_dict(),
            "label": self.candidate.label,
            "runs": len(speeds),
            "tokens_per_s": {
                "median": _round(median),
                "mad": _round(mad),
                "min": _round(min(speeds)) if speeds else None,
                "max": _round(max(speeds)) if speeds else None,
            },
            "verdict": self.stated_verdict,
        }
        if not self.candidate.is_baseline:
            b = self.band
            doc["ratio_to_baseline"] = (
                None
                if b is None or not b.rounds
                else {
                    "median": _round(b.ratio, 4),
                    "low": _round(b.low, 4),
                    "high": _round(b.high, 4),
                }
            )
        return doc


def _round(value: float | None, digits: int = 3) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


Clock = Callable[[], float]
RunOnce = Callable[[Candidate], float]  # runs the workload with the candidate switched on: tokens/s
WarmUp = Callable[[Candidate], float | None]  # a short unmeasured run: the seconds a measured one would take


def paired_ratios(timeline: Sequence[tuple[Candidate, float]], candidate: Candidate) -> list[float]:
    """Each run of `candidate` over the baseline interpolated to that run's place in the timeline.

    With rounds in alternating order (B C1 C2 | C2 C1 B | B C1 C2 ...) every candidate run lies
    between two baseline runs, so a steady drift of the machine cancels out of each ratio.
    """
    base = [(i, speed) for i, (c, speed) in enumerate(timeline) if c.is_baseline]
    ratios = []
    for position, (c, speed) in enumerate(timeline):
        if c != candidate:
            continue
        before = [(i, b) for i, b in base if i < position]
        after = [(i, b) for i, b in base if i > position]
        if before and after:
            (i0, b0), (i1, b1) = before[-1], after[0]
            reference = b0 + (b1 - b0) * (position - i0) / (i1 - i0)
        else:
            reference = (before or after)[-1 if before else 0][1]
        ratios.append(speed / reference if reference > 0 else math.nan)
    return ratios


def measure(
    candidates: Sequence[Candidate],
    run_once: RunOnce,
    rules: Rules,
    *,
    deadline: float = math.inf,
    clock: Clock = time.perf_counter,
    on_run: Callable[[Candidate], None] | None = None,
    warm_up: WarmUp | None = None,
    expected_warm_up_s: float = 0.0,
) -> dict[Candidate, Measured]:
    """Measure the baseline and `candidates` in alternating rounds until each is decided or time is up.

    Each candidate is first warmed up `rules.warmup` times, unmeasured: by `warm_up`, which returns
    its estimate of one measured run's seconds, or by a measured-length run itself. A candidate leaves
    the rounds once decided (after min_rounds); the baseline stays. A warm-up or round is only started if it should end
    before `deadline`, judged by the runs so far (`expected_warm_up_s` before the first warm-up).
    """
    ordered = [BASELINE] + [c for c in dict.fromkeys(candidates) if not c.is_baseline]
    results = {c: Measured(c) for c in ordered}
    estimates: list[float] = []  # of one measured run, from the warm-ups
    for candidate in ordered:
        for _ in range(rules.warmup):
            if clock() + expected_warm_up_s > deadline:
                return results
            started = clock()
            estimate = warm_up(candidate) if warm_up is not None else None
            if warm_up is None:
                run_once(candidate)
            took = clock() - started
            expected_warm_up_s = max(expected_warm_up_s, took)
            estimates.append(took if warm_up is None else (estimate or 0.0))
            if on_run is not None:
                on_run(candidate)
    timeline: list[tuple[Candidate, float]] = []
    run_times: list[float] = []
    live = ordered[1:]
    for index in range(rules.max_rounds):
        if not live:
            break
        this_round = [BASELINE] + live
        per_run = statistics.median(run_times) if run_times else max(estimates, default=0.0)
        if clock() + per_run * len(this_round) > deadline:
            break
        if index % 2:
            this_round.reverse()
        for candidate in this_round:
            started = clock()
            speed = run_once(candidate)
            run_times.append(clock() - started)
            timeline.append((candidate, speed))
            results[candidate].tokens_per_s.append(speed)
            results[candidate].seconds.append(run_times[-1])
            if on_run is not None:
                on_run(candidate)
        for candidate in ordered[1:]:
            entry = results[candidate]
            if not entry.tokens_per_s:
                continue
            entry.ratios = paired_ratios(timeline, candidate)
            entry.band = band(entry.ratios, rules.z)
            entry.verdict = verdict(entry.ratios, rules)
        if index + 1 >= rules.min_rounds:
            live = [c for c in live if results[c].verdict == UNDECIDED]
    results[BASELINE].verdict = "measured" if results[BASELINE].tokens_per_s else NOT_MEASURED
    for candidate in ordered[1:]:
        entry = results[candidate]
        if entry.verdict in (FASTER, SLOWER, WITHIN_NOISE) and entry.band.rounds < rules.min_rounds:
            entry.verdict = UNDECIDED  # stopped by the deadline before min_rounds
    return results


def singles(ops: Iterable[str], backends: Iterable[str]) -> list[Candidate]:
    """Every op alone, on every backend."""
    backends = tuple(backends)
    return [Candidate.of({op: backend}) for op in ops for backend in backends]


def combinations(measured: dict[Candidate, Measured]) -> list[Candidate]:
    """Sets of two or more ops, each on its best backend, built from the ops that measured faster alone
    (never a decoder-layer block together with an op it does the work of)."""
    best: dict[str, Measured] = {}
    for entry in measured.values():
        if len(entry.candidate.ops) != 1 or entry.verdict != FASTER:
            continue
        op = entry.candidate.op_names[0]
        if op not in best or entry.band.ratio > best[op].band.ratio:
            best[op] = entry
    pairs = [entry.candidate.ops[0] for _, entry in sorted(best.items())]
    return [
        Candidate(combo)
        for size in range(2, len(pairs) + 1)
        for combo in itertools.combinations(pairs, size)
        if not _overlaps(combo)
    ]


def _overlaps(combo: Sequence[tuple[str, str]]) -> bool:
    """A block with an op whose work it does: that op would never run, the set is the block's alone."""
    names = {op for op, _ in combo}
    return any(block in names and names & set(covered) for block, covered in BLOCKS.items())


def typical_run_s(measured: Iterable[Measured]) -> float:
    """The median duration of the measured runs (0 when none ran)."""
    seconds = [s for entry in measured for s in entry.seconds]
    return statistics.median(seconds) if seconds else 0.0


def choose(measured: Iterable[Measured]) -> Measured | None:
    """The candidate with the best median ratio among those measured faster; None: nothing on."""
    faster = [entry for entry in measured if entry.verdict == FASTER]
    if not faster:
        return None
    return max(faster, key=lambda entry: (entry.band.ratio, -len(entry.candidate.ops)))


@dataclass
class BatchDecision:
    """What one batch size's measurements chose, and everything tried on the way."""

    batch: int
    chosen: Measured | None
    baseline: Measured
    tried: list[Measured]
    stages: int
    # the winner measured again in fresh rounds; it is chosen only if it measures faster there too
    confirmation: Measured | None = None

    @property
    def typical_run_s(self) -> float:
        return typical_run_s([self.baseline, *self.tried])

    @property
    def chosen_ops(self) -> dict[str, str]:
        return self.chosen.candidate.as_dict() if self.chosen is not None else {}


def decide_batch(
    batch: int,
    alone: Sequence[Candidate],
    run_once: RunOnce,
    rules: Rules,
    *,
    deadline: float = math.inf,
    clock: Clock = time.perf_counter,
    on_run: Callable[[Candidate], None] | None = None,
    warm_up: WarmUp | None = None,
    expected_warm_up_s: float = 0.0,
) -> BatchDecision:
    """`alone` (each op on one backend, see `singles`); then, time allowing, the combinations of the ops
    that measured faster alone; then the best of them once more, against the baseline in fresh rounds.

    The confirmation guards against the winner's curse: of several candidates each compared at a 5 %
    level, the one that looks best is also the one most likely to have been helped by noise. A winner
    that is not measured faster again, or that the budget leaves unconfirmed, is not switched on."""
    timing = {"deadline": deadline, "clock": clock, "on_run": on_run, "warm_up": warm_up}
    first = measure(alone, run_once, rules, expected_warm_up_s=expected_warm_up_s, **timing)
    tried = [entry for candidate, entry in first.items() if not candidate.is_baseline]
    stages = 1
    combos = combinations(first)
    if combos and clock() < deadline:
        second = measure(combos, run_once, rules, expected_warm_up_s=expected_warm_up_s, **timing)
        tried += [entry for candidate, entry in second.items() if not candidate.is_baseline]
        stages = 2
    chosen, confirmation = choose(tried), None
    if chosen is not None:
        again = measure(
            [chosen.candidate], run_once, replace(rules, warmup=0), expected_warm_up_s=0.0, **timing
        )
        confirmation = again[chosen.candidate]
        if confirmation.verdict != FASTER:
            chosen = None
    return BatchDecision(batch, chosen, first[BASELINE], tried, stages, confirmation)
