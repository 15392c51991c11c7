"""Every generated step judged against the reference run's, with memory flat in the answer's length.

The reference (the unpatched model, eager: `run.reference`) generates greedily and keeps, per step and
sequence, the token it chose, its `TRACE_TOP_K` highest scores with their token ids, and the step's
largest |score| (`StepTrace`). Nothing else: a 1,024-token answer at a 151k vocabulary keeps 1,024 x 20
numbers, not 620 MB of logits.

A run judged against it is **teacher-forced**: at each step its scores are compared with the
reference's, then the reference's token is forced, so every step of the run sees exactly the input the
reference saw at that step, and every decode step is judged, not only those before a first divergence.

A step's difference is the larger of
- the largest |run - reference| over the reference's top scores (read at the reference's token ids), and
- how far any of the run's own top scores rises above the reference's k-th score where the reference did
  not rank that token in its top (the reference's score there is at most its k-th score, so this is a
  lower bound of the true difference at that token).
It is exact where greedy search decides (the top of the distribution) and never larger than the true
largest difference over the vocabulary. A step passes when its difference is at most
`atol + rtol x max|reference score|` (`run.generation.DEFAULT_TOLERANCES`, per dtype).

Where the run's own greedy choice differs from the reference's token, the step is a near tie when each
side's token is among the other's `NEAR_TIE_TOP_K` highest scores (the rule vLLM's model tests apply to
logprobs, `check_logprobs_close`); the first such position and whether it is a near tie are reported.

A run that cannot be fed the reference's tokens (vLLM: `judge_free_run`) is judged on what it hands back,
its own greedy tokens and each step's top logprobs, the way `check_logprobs_close` judges two runs: step
by step while its tokens are the reference's, every logprob both sides ranked compared within
`LOGPROB_BOUND_FACTOR x (atol + rtol x max|reference logit|)`; at the first differing token, a near tie
(each token among the other's top `NEAR_TIE_TOP_K`) ends the judging of that sequence and passes, any
other divergence fails. The factor 2: a logprob is the logit less the logsumexp of all logits, and the
logsumexp moves by at most the largest logit difference, so logits within a tolerance give logprobs
within twice it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TRACE_TOP_K = 20  # scores kept per reference step (and compared in a judged run)
NEAR_TIE_TOP_K = 5  # a differing greedy choice is a near tie when each token is in the other's top 5
LOGPROB_BOUND_FACTOR = 2.0  # logits within a tolerance give logprobs within twice it (module docstring)


@dataclass
class StepTrace:
    """What the reference computed at each generated step, for every sequence of its batch."""

    tokens: list[Any] = field(default_factory=list)  # per step: [batch] int64, the chosen token
    top_values: list[Any] = field(default_factory=list)  # per step: [batch, k] float32
    top_indices: list[Any] = field(default_factory=list)  # per step: [batch, k] int64
    scales: list[Any] = field(default_factory=list)  # per step: [batch] float32, max |score|
    log_normalizers: list[Any] = field(default_factory=list)  # per step: [batch] logsumexp of the scores
    finished_after: list[int | None] = field(default_factory=list)  # per sequence: its last step (EOS)

    @property
    def steps(self) -> int:
        return len(self.top_values)

    def active(self, step: int, sequence: int) -> bool:
        """Whether `sequence` was still generating at `step` (a sequence that ended is padded after)."""
        last = self.finished_after[sequence] if sequence < len(self.finished_after) else None
        return last is None or step <= last

    def active_steps(self) -> int:
        """The steps a run fed these tokens is judged at, over every sequence."""
        return sum(
            1
            for step in range(self.steps)
            for sequence in range(len(self.finished_after))
            if self.active(step, sequence)
        )


@dataclass
class ReferenceGeneration:
    """One greedy generation of the reference: its tokens, texts and step trace."""

    new_tokens: Any  # [batch, steps] on the CPU
    texts: list[str]
    trace: StepTrace
    seconds: float


class TraceRecorder:
    """A logits processor for the reference's generate(): notes each step's top scores, changes nothing."""

    def __init__(self) -> None:
        self.trace = StepTrace()

    def __call__(self, input_ids, scores):
        import torch

        values = scores.detach().float()
        k = min(TRACE_TOP_K, values.shape[-1])
        top = torch.topk(values, k, dim=-1)
        finite = torch.where(torch.isfinite(values), values.abs(), torch.zeros_like(values))
        self.trace.top_values.append(top.values.cpu())
        self.trace.top_indices.append(top.indices.cpu())
        self.trace.scales.append(finite.max(dim=-1).values.cpu())
        self.trace.log_normalizers.append(torch.logsumexp(values, dim=-1).cpu())
        return scores

    def finish(self, new_tokens, eos_ids: list[int] | None) -> StepTrace:
        """Add the tokens generate() chose (`new_tokens`: [batch, steps]) and where each sequence ended."""
        trace = self.trace
        trace.tokens = [new_tokens[:, step].clone() for step in range(new_tokens.shape[1])]
        trace.finished_after = []
        eos = set(eos_ids or ())
        for row in new_tokens.tolist():
            last = next((step for step, token in enumerate(row) if token in eos), None)
            trace.finished_after.append(last)
        return trace


@dataclass
class RunJudgement:
    """One judged run against the reference, every step."""

    run: str  # which run: "baseline" (the mode, kernels off) or "pto"
    steps_judged: int
    worst_step: int | None  # 0 is the prefill's step, 1 the first decode step, ...
    worst_diff: float
    worst_tolerance: float  # the tolerance at the worst step
    worst_scale: float  # max |reference score| at the worst step
    failing_steps: int
    first_failing_step: int | None
    choice_match_rate: float  # steps where the run's own greedy choice is the reference's token
    first_choice_divergence: int | None
    divergence_near_tie: bool | None  # at the first divergence: each token in the other's top 5
    atol: float
    rtol: float
    choices: Any = None  # [batch, steps] the run's own greedy choices (not in the JSON)
    seconds: float | None = None  # the judged generation's wall time (not in the JSON)
    # per judged step and sequence, (step, difference, tolerance): the distribution behind the worst one
    # (benchmarks/bench_tolerances.py; not in the JSON)
    step_diffs: list[tuple[int, float, float]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.failing_steps == 0 and self.steps_judged > 0

    @property
    def worst_relative(self) -> float:
        return self.worst_diff / self.worst_tolerance if self.worst_tolerance > 0 else float("inf")

    def to_json(self) -> dict[str, Any]:
        def number(value: float) -> float | str:
            # JSON has no inf or NaN; say what it was
            if value != value:
                return "nan"
            if value in (float("inf"), float("-inf")):
                return "inf"
            return round(value, 8)

        return {
            "run": self.run,
            "passed": self.passed,
            "steps_judged": self.steps_judged,
            "worst_step": self.worst_step,
            "worst_diff": number(self.worst_diff),
            "worst_tolerance": number(self.worst_tolerance),
            "worst_scale": number(self.worst_scale),
            "failing_steps": self.failing_steps,
            "first_failing_step": self.first_failing_step,
            "choice_match_rate": round(self.choice_match_rate, 6),
            "first_choice_divergence": self.first_choice_divergence,
            "divergence_near_tie": self.divergence_near_tie,
            "atol": self.atol,
            "rtol": self.rtol,
        }


class ForcedJudge:
    """A logits processor for a judged run: compares each step's scores with the reference's, then forces
    the reference's token (teacher forcing). `judgement()` after generate() returns the verdict."""

    def __init__(self, trace: StepTrace, atol: float, rtol: float, run: str):
        self.trace, self.atol, self.rtol, self.run = trace, atol, rtol, run
        self.step = 0
        self.judged = 0
        self.worst = (None, 0.0, 0.0, 0.0)  # (step, diff, tolerance, scale)
        self.failing = 0
        self.first_failing: int | None = None
        self.matches = 0
        self.first_divergence: int | None = None
        self.near_tie: bool | None = None
        self.choices: list[Any] = []
        self.step_diffs: list[tuple[int, float, float]] = []

    def __call__(self, input_ids, scores):
        import torch

        step = self.step
        self.step += 1
        if step >= self.trace.steps:  # the run went on past the reference: nothing to force it to
            self.failing += 1
            self.first_failing = step if self.first_failing is None else self.first_failing
            return scores
        values = scores.detach().float()
        ref_values = self.trace.top_values[step].to(values.device)
        ref_indices = self.trace.top_indices[step].to(values.device)
        ref_tokens = self.trace.tokens[step].to(values.device)
        scale = self.trace.scales[step].to(values.device)
        k = ref_values.shape[-1]

        at_ref = values.gather(-1, ref_indices)
        over_ref = _difference(at_ref, ref_values).max(dim=-1).values
        own = torch.topk(values, k, dim=-1)
        outside = ~(own.indices.unsqueeze(-1) == ref_indices.unsqueeze(-2)).any(dim=-1)
        rise = torch.where(
            outside, (own.values - ref_values[:, -1:]).clamp(min=0), torch.zeros_like(own.values)
        )
        rise = torch.nan_to_num(rise, nan=float("inf")).max(dim=-1).values
        diff = torch.maximum(over_ref, rise)
        tolerance = self.atol + self.rtol * scale
        choice = values.argmax(dim=-1)
        self.choices.append(choice.cpu())

        for sequence in range(values.shape[0]):
            if not self.trace.active(step, sequence):
                continue
            self.judged += 1
            d, tol = float(diff[sequence]), float(tolerance[sequence])
            self.step_diffs.append((step, d, tol))
            if d > tol or d != d:
                self.failing += 1
                if self.first_failing is None:
                    self.first_failing = step
            if self.worst[0] is None or d > self.worst[1] or d != d:
                self.worst = (step, d, tol, float(scale[sequence]))
            if int(choice[sequence]) == int(ref_tokens[sequence]):
                self.matches += 1
            elif self.first_divergence is None:
                self.first_divergence = step
                near = min(NEAR_TIE_TOP_K, k)
                self.near_tie = bool(
                    (own.indices[sequence, :near] == ref_tokens[sequence]).any()
                    and (ref_indices[sequence, :near] == choice[sequence]).any()
                )
        forced = torch.full_like(scores, float("-inf"))
        forced.scatter_(-1, ref_tokens.unsqueeze(-1), 0.0)
        return forced

    def judgement(self) -> RunJudgement:
        import torch

        step, diff, tolerance, scale = self.worst
        return RunJudgement(
            run=self.run,
            steps_judged=self.judged,
            worst_step=step,
            worst_diff=diff,
            worst_tolerance=tolerance,
            worst_scale=scale,
            failing_steps=self.failing,
            first_failing_step=self.first_failing,
            choice_match_rate=self.matches / self.judged if self.judged else 0.0,
            first_choice_divergence=self.first_divergence,
            divergence_near_tie=self.near_tie,
            atol=self.atol,
            rtol=self.rtol,
            choices=torch.stack(self.choices, dim=1) if self.choices else None,
            step_diffs=list(self.step_diffs),
        )


def judge_free_run(
    trace: StepTrace,
    tokens: list[list[int]],
    logprobs: list[list[dict[int, float]]],
    atol: float,
    rtol: float,
    run: str,
) -> RunJudgement:
    """A run that generated on its own (`tokens`: per sequence its greedy ids; `logprobs`: per sequence and
    step, token id -> logprob of its top ones) judged against the reference's sequence 0 (the same prompt),
    up to each sequence's first divergence, with the near-tie rule there (module docstring)."""
    judged = failing = matches = 0
    first_failing = first_divergence = None
    near_tie: bool | None = None
    worst: tuple[int | None, float, float, float] = (None, 0.0, 0.0, 0.0)

    def fail(step: int) -> None:
        nonlocal failing, first_failing
        failing += 1
        first_failing = step if first_failing is None else min(first_failing, step)

    for ids, steps in zip(tokens, logprobs, strict=True):
        for step, (token, own) in enumerate(zip(ids, steps, strict=True)):
            if step >= trace.steps or not trace.active(step, 0):
                break  # the reference ended here (its EOS): vLLM, told to ignore EOS, goes on unjudged
            ref_ids = trace.top_indices[step][0].tolist()
            normalizer = float(trace.log_normalizers[step][0])
            ref = {
                i: float(v) - normalizer
                for i, v in zip(ref_ids, trace.top_values[step][0].tolist(), strict=True)
            }
            scale = float(trace.scales[step][0])
            bound = LOGPROB_BOUND_FACTOR * (atol + rtol * scale)
            common = [abs(own[i] - ref[i]) for i in own.keys() & ref.keys()]
            diff = max(common) if common else float("inf")  # nothing both ranked: as far apart as can be
            diff = float("inf") if diff != diff else diff
            judged += 1
            if diff > bound:
                fail(step)
            if worst[0] is None or diff > worst[1]:
                worst = (step, diff, bound, scale)
            ref_token = int(trace.tokens[step][0])
            if token == ref_token:
                matches += 1
                continue
            own_top = sorted(own, key=own.get, reverse=True)[:NEAR_TIE_TOP_K]
            tie = ref_token in own_top and token in ref_ids[:NEAR_TIE_TOP_K]
            if first_divergence is None or step < first_divergence:
                first_divergence, near_tie = step, tie
            if not tie:
                fail(step)
            break  # past a divergence the two runs see different inputs: nothing more to compare
    step, diff, tolerance, scale = worst
    return RunJudgement(
        run=run,
        steps_judged=judged,
        worst_step=step,
        worst_diff=diff,
        worst_tolerance=tolerance,
        worst_scale=scale,
        failing_steps=failing,
        first_failing_step=first_failing,
        choice_match_rate=matches / judged if judged else 0.0,
        first_choice_divergence=first_divergence,
        divergence_near_tie=near_tie,
        atol=atol,
        rtol=rtol,
    )


def _difference(a, b):
    """|a - b|, 0 where both are the same value (two -inf scores a processor set agree), inf for NaN."""
    import torch

    same = a == b
    diff = (a - b).abs()
    diff = torch.where(same, torch.zeros_like(diff), diff)
    return torch.nan_to_num(diff, nan=float("inf"))


def _blame(judgement: RunJudgement, mode: str, ops: tuple[str, ...], mode_failed: bool, off: str) -> str:
    """Whom a failed judgement blames: the mode (its kernels-off run failed too) or the kernels."""
    if judgement.run == "baseline":
        return f"{off}: a fault of {mode}, not a kernel's"
    if mode_failed:
        return f"as the {mode} run with every kernel off does: the mode's fault, the kernels are not judged apart from it"
    return f"the kernels switched on ({', '.join(ops) or 'none'}) compute something else"


def failure_message(
    judgement: RunJudgement, mode: str, ops: tuple[str, ...], mode_failed: bool = False
) -> str:
    """The one line a failed judgement adds: which run, which step, by how much, whom it blames."""
    step = judgement.first_failing_step
    where = "the prefill's step" if step == 0 else f"decode step {step}"
    blame = _blame(
        judgement,
        mode,
        ops,
        mode_failed,
        "with every kernel off it differs from the eager unpatched model too",
    )
    return (
        f"{judgement.run} ({mode}): logits differ from the unpatched eager model's at {judgement.failing_steps} "
        f"of {judgement.steps_judged} step(s), "
        f"first at {where}; worst {judgement.worst_diff:.4g} at step {judgement.worst_step} "
        f"(> {judgement.worst_tolerance:.4g} = atol {judgement.atol:g} + rtol {judgement.rtol:g} x max|logit|): "
        f"{blame}"
    )


def free_run_failure_message(
    judgement: RunJudgement, mode: str, ops: tuple[str, ...], mode_failed: bool
) -> str:
    """`failure_message` for a run judged by `judge_free_run` (its logprobs, up to its first divergence)."""
    step = judgement.first_failing_step
    where = "the prefill's step" if step == 0 else f"decode step {step}"
    what = []
    if judgement.worst_diff > judgement.worst_tolerance:
        what.append(
            f"worst logprob difference {judgement.worst_diff:.4g} at step {judgement.worst_step} "
            f"(> {judgement.worst_tolerance:.4g} = {LOGPROB_BOUND_FACTOR:g} x (atol {judgement.atol:g} "
            f"+ rtol {judgement.rtol:g} x max|logit|))"
        )
    if judgement.divergence_near_tie is False:
        what.append(
            f"its token at step {judgement.first_choice_divergence} is no near tie of the reference's "
            f"(each not in the other's top {NEAR_TIE_TOP_K})"
        )
    blame = _blame(judgement, mode, ops, mode_failed, "with the plugin's ops off")
    return (
        f"{judgement.run} ({mode}): differs from the unpatched transformers eager model at "
        f"{judgement.failing_steps} of {judgement.steps_judged} step(s) judged, first at {where}: "
        f"{'; '.join(what) or 'steps beyond the bound'}; {blame}"
    )
