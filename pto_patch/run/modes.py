"""The two-mode run, once for every command: which ops, on which backend, kernels off then on, what ran.

verify, verify --ocr, bench, bench --ocr and tune each run one loaded model in two modes: the baseline
(every kernel switched off) and PTO mode (the chosen ops switched on). The protocol is the same for all
of them and lives here:

- the ops are chosen once per batch size (`choose`): `--ops`, else what apply patched in; filtered by
  `--use_dynamic_config` (a tuning, else the reference's table); the backend per op;
- `KernelModes.baseline()`: every switch off, the counters reset; on leaving, a kernel that counted a
  call with every switch off is a failure (a guard that does not listen to its switch);
- `KernelModes.pto()`: the ops on; on leaving, the counters are read and every switch goes off again,
  whatever happened inside;
- `KernelModes.switches`: the two selections as calls, for the timed runs that alternate them (wrapped
  by the compile watch where the model is compiled, so each compile is counted under its mode);
  `KernelModes.timed()` resets the counters around such runs and reads them after (bench, bench --ocr);
- `KernelModes.op_checks()`: per op what ran (`ops.op_reports`) and the failures: switched on but never
  reached, run while off, fallbacks, and a backend asked for by name that fell back on every call;
- `judge_cases`: both modes teacher-forced on the unpatched eager model's tokens for each case (verify's
  prompt, or every (page, task) of verify --ocr) and judged at every step (`run.judging`); a failure names
  the case, the run, its first failing step and whom it blames.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pto_patch.run import progress
from pto_patch.run.judging import RunJudgement, failure_message
from pto_patch.run.op_choice import backend_for, choose_ops, op_failures, op_reports, set_switches

BASELINE = "baseline"
PTO = "pto"


@dataclass(frozen=True)
class OpChoice:
    """The ops a mode switches on at one batch size, the table that chose them, and their backend."""

    switched_on: tuple[str, ...]
    table: list[dict[str, Any]] | None
    backend: str | dict[str, str]
    requested_backend: str | None  # --kernel-backend as given (None: auto or a tuning's)


def choose(plan, batch: int, *, use_dynamic_config: bool, lookup=None, requested=None) -> OpChoice:
    """The ops and backend for `batch` (plan: `run.start.RunPlan`; lookup: the folder's tuning, if used)."""
    switched_on, table = choose_ops(
        plan.read.may_switch_on,
        plan.read.checked.patched_ops,
        batch,
        use_dynamic_config,
        tuning=lookup.tuning if lookup else None,
    )
    return OpChoice(switched_on, table, backend_for(table, requested), requested)


def modes_for(plan, batch: int, options, lookup=None) -> OpChoice:
    """`choose` with the run's own options (--use_dynamic_config, --kernel-backend)."""
    return choose(
        plan,
        batch,
        use_dynamic_config=options.use_dynamic_config,
        lookup=lookup,
        requested=options.kernel_backend,
    )


@dataclass
class KernelModes:
    """One loaded model's kernels in the baseline and PTO modes (kernels: the folder's `pto_kernels`)."""

    kernels: Any
    choice: OpChoice
    watch: Any = None  # a graph.compiling.CompileWatch where the model is compiled
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def switches(self) -> dict[str, Callable[[], None]]:
        kernels, choice = self.kernels, self.choice
        switches: dict[str, Callable[[], None]] = {
            BASELINE: kernels.disable if kernels is not None else (lambda: None)
        }
        if kernels is not None:
            switches[PTO] = lambda: set_switches(kernels, choice.switched_on, choice.backend)
        return self.watch.wrap(switches) if self.watch is not None else switches

    @contextmanager
    def baseline(self, failures: list[str]) -> Iterator[None]:
        """Every switch off and the counters reset for the block; a kernel that ran in it is a failure."""
        self.switches[BASELINE]()
        if self.kernels is None:
            yield
            return
        self.kernels.reset_stats()
        yield
        stray = {op: entry["calls"] for op, entry in self.kernels.stats().items() if entry.get("calls")}
        if stray:
            failures.append(f"kernels ran with every switch off: {stray}")
        self.kernels.reset_stats()

    @contextmanager
    def pto(self) -> Iterator[None]:
        """The chosen ops on for the block; their counters read on leaving, then every switch off."""
        self.switches[PTO]()
        try:
            yield
        finally:
            self.stats = self.kernels.stats()
            self.kernels.disable()

    @contextmanager
    def timed(self) -> Iterator[dict[str, Callable[[], None]]]:
        """For runs that alternate the two modes themselves (bench's timed rounds): the counters reset, the
        switches yielded with the baseline on; on leaving, the counters read and every switch off."""
        switches = self.switches
        if self.kernels is not None:
            self.kernels.reset_stats()
        switches[BASELINE]()
        try:
            yield switches
        finally:
            if self.kernels is not None:
                self.stats = self.kernels.stats()
                self.kernels.disable()

    def batch_checks(self, batch: int, layers: int | None, failures: list[str], warnings: list[str]):
        """op_checks for one of several batch sizes: the messages prefixed with it; the op reports returned."""
        ops, more_failures, more_warnings = self.op_checks(False, layers)
        failures += [f"batch {batch}: {message}" for message in more_failures]
        warnings += [f"batch {batch}: {message}" for message in more_warnings]
        return ops

    def op_checks(self, strict: bool, layers: int | None) -> tuple[dict[str, Any], list[str], list[str]]:
        """Per op what ran in PTO mode, and the failures and warnings of that."""
        ops = op_reports(self.stats, self.choice.switched_on, layers)
        failures, warnings = op_failures(ops, strict)
        failures += fell_back_everywhere(ops, self.choice.requested_backend)
        return ops, failures, warnings


def fell_back_everywhere(ops: dict[str, Any], requested: str | None) -> list[str]:
    """A backend asked for by name (`--kernel-backend pypto`) that ran on no call of an op: the run
    measured and compared torch code under that backend's name."""
    if requested in (None, "auto"):
        return []
    failures = []
    for op, report in ops.items():
        if report.switched_on and report.calls and not report.backends.get(requested):
            failures.append(
                f"{op}: --kernel-backend {requested} fell back on all {report.calls} call(s), so no "
                f"{requested} kernel ran"
                + (f" ({report.first_fallback_error})" if report.first_fallback_error else "")
            )
    return failures


@dataclass(frozen=True)
class JudgedCase:
    """One input both modes are judged on, and the reference's generation of it."""

    inputs: Any  # the model's inputs, or a call that builds them (so a page's pixels live only while used)
    reference: Any  # run.reference.ReferenceGeneration
    name: str = ""  # how a failure names it ("page p1, TEXT"); empty for verify's one prompt


FAILURES_SHOWN = 5  # per run; the rest are counted in one more line


def judge_cases(
    loaded,
    cases: list[JudgedCase],
    modes: KernelModes,
    atol: float,
    rtol: float,
    failures: list[str],
    label: str,
) -> dict[str, list[RunJudgement]]:
    """The mode's baseline, then its PTO run, on every case, each teacher-forced on the reference's tokens
    and judged at every step; the failures (per run, the first few cases and a count) join `failures`."""
    judged: dict[str, list[RunJudgement]] = {}

    def each(run: str) -> list[RunJudgement]:
        judgements = []
        for index, case in enumerate(cases):
            what = f", {case.name} ({index + 1} of {len(cases)})" if case.name else ""
            progress.phase(f"{run} ({label}, kernels {'on' if run == PTO else 'off'}): judged{what}")
            judgements.append(judged_generation(loaded, case, atol, rtol, run))
        return judgements

    with modes.baseline(failures):
        judged[BASELINE] = each(BASELINE)
    with modes.pto():
        judged[PTO] = each(PTO)
    for run, judgements in judged.items():
        messages = []
        for index, (case, judgement) in enumerate(zip(cases, judgements, strict=True)):
            where = f"{case.name}: " if case.name else ""
            if judgement.failing_steps:
                mode_failed = run == PTO and judged[BASELINE][index].failing_steps > 0
                messages.append(
                    where + failure_message(judgement, label, modes.choice.switched_on, mode_failed)
                )
            elif judgement.steps_judged != case.reference.trace.active_steps():
                messages.append(
                    f"{where}{run} ({label}): {judgement.steps_judged} step(s) judged of the reference's "
                    f"{case.reference.trace.active_steps()}"
                )
        failures += messages[:FAILURES_SHOWN]
        if len(messages) > FAILURES_SHOWN:
            failures.append(f"{run} ({label}): {len(messages) - FAILURES_SHOWN} more case(s) fail as above")
    return judged


def judged_generation(loaded, case: JudgedCase, atol: float, rtol: float, run: str) -> RunJudgement:
    """One greedy generation fed the reference's tokens, every step's scores judged against its trace."""
    from pto_patch.run.generation import generate
    from pto_patch.run.judging import ForcedJudge

    trace = case.reference.trace
    judge = ForcedJudge(trace, atol, rtol, run)
    inputs = case.inputs() if callable(case.inputs) else case.inputs  # built at use: one page at a time
    generated = generate(
        loaded, inputs, max(trace.steps, 1), fixed_length=False, logits=False, processor=judge
    )
    judgement = judge.judgement()
    judgement.seconds = generated.seconds
    return judgement
