"""`pto-patch tune`: measure, on this device, which ops make the patched model faster at each batch size.

The model is loaded once. Each op on each backend that runs here is first tried once (a backend that
falls back to torch, or an op that is never reached, is left out), then measured against the
baseline in alternating rounds per batch size (`tune_selection`), within `--budget-s` for the whole
command. The choice per batch (possibly nothing on) goes to `.pto_patch/tuning.json`, which
`verify` / `bench --use_dynamic_config` and `pto_kernels.apply_tuning` use where it was made here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pto_patch import __version__
from pto_patch.errors import EXIT_USAGE, PtoPatchError
from pto_patch.patching import folder_lock
from pto_patch.patching.tuning_file import (
    OLDER_KERNELS_HINT,
    TUNING_FILE,
    kernel_tuning,
    tuning_bytes,
    tuning_path,
    write_tuning,
)
from pto_patch.run.generation import generate
from pto_patch.run.graph import graph_decode
from pto_patch.run.graph.compiling import CompileWatch, apply_compile, finish_watch
from pto_patch.run.inputs import encode_prompt, repeat_for_batch
from pto_patch.run.kept_results import written_or_kept
from pto_patch.run.loading import versions
from pto_patch.run.modes import KernelModes, OpChoice, choose
from pto_patch.run.options import RunOptions, parse_batches
from pto_patch.run.report import TuneResult
from pto_patch.run.start import RunPlan, plan_run, start_run
from pto_patch.run.user_files import check_room
from pto_patch.tune import selection as tune_selection
from pto_patch.tune.selection import Candidate, Rules

# Backends worth trying per device kind ("torch" is the eager code behind a switch: never faster).
DEVICE_BACKENDS = {"cpu": ("fused",), "cuda": ("fused",), "npu": ("pypto", "npu", "fused")}
PROBE_NEW_TOKENS = 2
WARM_UP_NEW_TOKENS = 4  # a warm-up only has to reach every shape once: prefill and a few decode steps
WRITE_RESERVE_S = 1.0  # kept out of the measuring time for writing the file

# What a tuned batch says about how it was decided.
DECIDED_FASTER = "measured faster"
DECIDED_NOTHING = "nothing measured faster"
DECIDED_OUT_OF_TIME = "no gain clear of the noise within the rounds and budget"
DECIDED_NOT_CONFIRMED = "the best gain did not hold when measured again"
NOT_PROBED = "not tried: the budget was spent"


@dataclass(frozen=True)
class TuneOptions(RunOptions):
    batches: str = "1,4,8,16"
    output_length: int = 32
    warmup: int = 1  # unmeasured runs per candidate per batch
    iters: int = 15  # at most this many measured rounds per candidate per batch
    budget_s: float = 600.0
    min_gain: float = 0.0


def check_tune_options(options: TuneOptions) -> tuple[int, ...]:
    if not options.budget_s > 0:
        raise PtoPatchError(
            f"--budget-s must be more than 0, got {options.budget_s:g}",
            "pass the seconds tune may take, e.g. --budget-s 600",
            exit_code=EXIT_USAGE,
        )
    if options.min_gain < 0:
        raise PtoPatchError(
            f"--min-gain must be 0 or more, got {options.min_gain:g}",
            "pass a fraction such as 0.01 for 1 %",
            exit_code=EXIT_USAGE,
        )
    if options.use_dynamic_config:
        raise PtoPatchError(
            "--use_dynamic_config is what tune produces, not an input to it",
            "drop --use_dynamic_config; use it with verify or bench after tune",
            exit_code=EXIT_USAGE,
        )
    return parse_batches(options.batches)


def backends_to_try(kernel_backend: str | None, device_kind: str) -> tuple[str, ...]:
    """--kernel-backend alone where given (auto resolved for this device), else every one that may run here."""
    if kernel_backend is None:
        return DEVICE_BACKENDS.get(device_kind, ("fused",))
    if kernel_backend == "auto":
        return (DEVICE_BACKENDS.get(device_kind, ("fused",))[0],)
    return (kernel_backend,)


def switch_to(kernels, candidate: Candidate) -> None:
    if candidate.is_baseline:
        kernels.disable()
    else:
        kernels.enable(candidate.op_names, backend=candidate.as_dict())


def timed_run(loaded, kernels, inputs, candidate: Candidate, new_tokens: int):
    """One greedy run of `new_tokens` per sequence with `candidate` switched on (a run.generation.Generation)."""
    switch_to(kernels, candidate)
    return generate(loaded, inputs, new_tokens, fixed_length=True, logits=False)


def tokens_per_s(loaded, kernels, inputs, candidate: Candidate, new_tokens: int) -> float:
    with graph_decode.timed(loaded.model):  # a graph compiled while measuring is counted against the run
        run = timed_run(loaded, kernels, inputs, candidate, new_tokens)
    return run.new_tokens.numel() / run.seconds if run.seconds > 0 else 0.0


def run_seconds(run, new_tokens: int) -> float:
    """What a run of `new_tokens` would take, from a shorter run's prefill and decode-step times."""
    if run.prefill_s is None or run.decode_step_s is None:
        return run.seconds * new_tokens  # too short to tell: assume every token costs the whole run
    return run.prefill_s + (new_tokens - 1) * run.decode_step_s


def probe(
    loaded, kernels, inputs, ops, backends, clock, deadline: float
) -> tuple[list[tuple[str, str]], list[dict], float]:
    """Each (op, backend) once on a short run: usable where it ran and never fell back to torch.

    Also returns the longest probe's seconds, the first estimate of how long a run takes. None
    starts that should end past `deadline`.
    """
    usable, notes, longest = [], [], 0.0
    for op in ops:
        for backend in backends:
            if clock() + longest > deadline:
                note = NOT_PROBED
                notes.append({"op": op, "backend": backend, "runs_here": False, "note": note})
                continue
            candidate = Candidate.of({op: backend})
            modes = KernelModes(kernels, OpChoice((op,), None, {op: backend}, backend))
            started = clock()
            with modes.timed():  # the counters of this probe alone, every switch off after
                tokens_per_s(loaded, kernels, inputs, candidate, PROBE_NEW_TOKENS)
            longest = max(longest, clock() - started)
            ran = modes.op_checks(False, None)[0][op]
            if ran.fallbacks:
                note = f"falls back to torch here ({ran.first_fallback_error})"
            elif not ran.calls:
                note = "never ran: the injection is not reached"
            else:
                note = "runs here"
                usable.append((op, backend))
            notes.append({"op": op, "backend": backend, "runs_here": note == "runs here", "note": note})
    kernels.reset_stats()
    return usable, notes, longest


def batch_entry(decision: tune_selection.BatchDecision, *, ops_left_untried: bool = False) -> dict[str, Any]:
    """One batch of the tuning file: the choice, its speed with spread, and every alternative tried.

    `ops_left_untried`: the budget ran out before every op was probed, so "nothing faster" is not known.
    """
    chosen, confirmation = decision.chosen, decision.confirmation
    if chosen is not None:
        decided = DECIDED_FASTER
    elif confirmation is not None:
        unfinished = confirmation.verdict in (tune_selection.UNDECIDED, tune_selection.NOT_MEASURED)
        decided = DECIDED_OUT_OF_TIME if unfinished else DECIDED_NOT_CONFIRMED
    elif ops_left_untried or any(
        entry.verdict in (tune_selection.UNDECIDED, tune_selection.NOT_MEASURED) for entry in decision.tried
    ):
        decided = DECIDED_OUT_OF_TIME
    else:
        decided = DECIDED_NOTHING
    # the confirmation's fresh rounds, not the rounds that picked the winner: those flatter it
    summary = confirmation.summary() if chosen is not None and confirmation is not None else None
    return {
        "batch": decision.batch,
        "chosen": decision.chosen_ops,
        "decided": decided,
        "tokens_per_s": {
            "baseline": decision.baseline.summary()["tokens_per_s"],
            "chosen": summary["tokens_per_s"] if summary else None,
        },
        "ratio_to_baseline": summary["ratio_to_baseline"] if summary else None,
        "baseline_runs": len(decision.baseline.tokens_per_s),
        "alternatives": [entry.summary() for entry in decision.tried],
        "confirmation": confirmation.summary() if confirmation is not None else None,
        "stages": decision.stages,
    }


def undecided_warning(entry: dict[str, Any]) -> str | None:
    """One warning line for a batch left undecided (the rounds or the budget ran out), else None."""
    if entry["decided"] != DECIDED_OUT_OF_TIME:
        return None
    return (
        f"batch {entry['batch']}: {DECIDED_OUT_OF_TIME}, so nothing is switched on there; "
        "run tune again with a larger --budget-s (or --iters), on a quieter machine"
    )


def run_tune(
    options: TuneOptions,
    *,
    on_run: Callable[[int, str, float], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> TuneResult:
    """Load once, probe, measure every batch within the budget, write the tuning (unless a check failed).

    The folder is locked for the whole run: tune writes into it. on_run(batch, what ran, seconds since
    the start) is called after every run, for a progress bar.
    """
    began = clock()
    batches = check_tune_options(options)
    # room and permission for the tuning file, before the search
    plan = plan_run(
        options,
        batch=max(batches),
        use_pto=True,
        usage_checks=lambda folder: check_room(tuning_path(folder), TUNING_FILE),
    )
    with folder_lock.exclusive(plan.folder):
        return _tune(plan, batches, began, on_run, clock)


def _tune(plan: RunPlan, batches, began: float, on_run, clock) -> TuneResult:
    options: TuneOptions = plan.options
    started = start_run(plan)
    loaded, failures, warnings = started.loaded, list(started.failures), list(started.warnings)
    kernels, device, spec = loaded.kernels, loaded.device, loaded.spec
    reader = kernel_tuning(kernels)
    if reader is None:
        raise PtoPatchError(  # tuning_file.OLDER_KERNELS, spelled out so the docs can quote it
            f"{loaded.folder}: the folder's pto_kernels was written by an older pto-patch, which knows no tuning files",
            OLDER_KERNELS_HINT,
        )
    result = TuneResult(
        model_path=str(loaded.folder),
        device=device.name,
        dtype=loaded.dtype_name,
        versions=versions(),
        budget_s=options.budget_s,
        load_s=loaded.load_s,
        failures=failures,
        warnings=warnings,
        options=options.to_json(),
    )
    if failures:  # a model that did not load whole is not worth timing
        result.duration_s = clock() - began
        return result
    compiled = apply_compile(loaded.model, options, warnings, kernels=kernels)
    if compiled is not None and compiled.decode is not None:
        compiled.decode.reserve(options.output_length)  # warm-ups capture the cache the timed runs replay
    single, description = encode_prompt(loaded, options.prompt, options.image, options.simple_prompt)
    result.input = description
    ops = choose(plan, 1, use_dynamic_config=False).switched_on
    backends = backends_to_try(options.kernel_backend, device.kind)
    end = began + options.budget_s - WRITE_RESERVE_S
    usable, result.probes, probe_s = probe(
        loaded, kernels, repeat_for_batch(single, 1, device), ops, backends, clock, end
    )
    # How long a warm-up takes, so that none starts that would end past the budget: scaled linearly in
    # batch size from the last one measured (an overstatement: decode is memory bound).
    warm_up_s, warm_up_batch = probe_s * WARM_UP_NEW_TOKENS / PROBE_NEW_TOKENS, 1
    warmup = options.warmup
    if compiled is not None and compiled.decode is not None and warmup < 1:
        warmup = 1  # a graph run's warm-up captures what the measured runs replay
        warnings.append("a graph run measures replays: one untimed capture run per candidate and batch size")
    rules = Rules(warmup=warmup, max_rounds=options.iters, min_gain=options.min_gain)
    # Made after the probes: what the compiler does is attributed to the candidate measured when it moved.
    watch = CompileWatch(compiled) if compiled is not None else None

    for index, batch in enumerate(batches):
        inputs = repeat_for_batch(single, batch, device)
        left = options.budget_s - (clock() - began) - WRITE_RESERVE_S
        deadline = clock() + max(left, 0.0) / (len(batches) - index)

        def run_once(candidate: Candidate, inputs=inputs, batch=batch) -> float:
            if watch is not None:
                watch.switch(candidate.label)
            speed = tokens_per_s(loaded, kernels, inputs, candidate, options.output_length)
            if on_run is not None:
                on_run(batch, candidate.label, clock() - began)
            return speed

        warm_ups: list[float] = []

        def warm_up(candidate: Candidate, inputs=inputs, batch=batch, warm_ups=warm_ups) -> float:
            if watch is not None:
                watch.switch(candidate.label)
            started = clock()
            run = timed_run(
                loaded, kernels, inputs, candidate, min(WARM_UP_NEW_TOKENS, options.output_length)
            )
            warm_ups.append(clock() - started)
            if on_run is not None:
                on_run(batch, f"{candidate.label} (warm-up)", clock() - began)
            return run_seconds(run, options.output_length)

        try:
            decision = tune_selection.decide_batch(
                batch,
                [Candidate.of({op: backend}) for op, backend in usable],
                run_once,
                rules,
                deadline=deadline,
                clock=clock,
                warm_up=warm_up,
                expected_warm_up_s=warm_up_s * batch / warm_up_batch,
            )
        finally:
            kernels.disable()
        if warm_ups:
            warm_up_s, warm_up_batch = max(warm_ups), batch
        entry = batch_entry(decision, ops_left_untried=any(p["note"] == NOT_PROBED for p in result.probes))
        result.batches.append(entry)
        warning = undecided_warning(entry)
        if warning is not None:
            warnings.append(warning)

    compilation = finish_watch(watch, failures, warnings)
    result.compilation = None if compilation is None else compilation.to_json()
    header = {
        "device": reader.device_identity(device.name),
        "versions": reader.release_versions(),
        "pto_patch": __version__,
        "spec": spec.name,
        "ops_patched": list(loaded.state.patched_ops),
        "ops_tuned": list(ops),  # what tune measured: a patched op outside it was not tuned
        "dtype": loaded.dtype_name,
        "compile": None if compiled is None else compiled.to_json(),
        "threads": _threads(),
        "input": description,
        "output_length": options.output_length,
        "backends_tried": list(backends),
        "probes": result.probes,
        "rules": dataclasses.asdict(rules),
        "budget_s": options.budget_s,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    result.header = header
    result.duration_s = clock() - began
    header["duration_s"] = round(result.duration_s, 1)
    document = {
        "format": reader.FORMAT,
        "format_version": reader.FORMAT_VERSION,
        "header": header,
        "batches": result.batches,
    }
    if compilation is not None and compilation.graph_failures():
        return result  # timings that hold compiles decide nothing: no tuning is written from them
    previous = tuning_path(loaded.folder)
    if previous.exists() and all(entry["decided"] == DECIDED_OUT_OF_TIME for entry in result.batches):
        # a run that decided nothing says nothing against an earlier tuning: keep that one
        failures.append(
            f"the budget ran out before any batch size was decided; kept the earlier tuning {previous} "
            "(run tune with a larger --budget-s to replace it)"
        )
        return result
    unmeasured = [entry["batch"] for entry in result.batches if not entry.get("baseline_runs")]
    if unmeasured:  # a table of nothing decides nothing: no tuning is written from it
        spent = "the load, warm-ups and captures" if compiled is not None else "the load and warm-ups"
        failures.append(
            f"batch {', '.join(map(str, unmeasured))}: nothing was measured (0 runs of the baseline) within "
            f"--budget-s {options.budget_s:g}; {spent} used it, so no tuning was written "
            "(run tune with a larger --budget-s)"
        )
        return result
    written = written_or_kept(  # a failed write keeps the tuning in pto-patch's cache
        TUNING_FILE,
        tuning_path(loaded.folder),
        tuning_bytes(document),
        lambda: write_tuning(loaded.folder, document),
    )
    result.tuning_file = str(written) if isinstance(written, Path) else None
    if not usable and not any(probe["note"] == NOT_PROBED for probe in result.probes):
        warnings.append("no op ran on any backend here without falling back; the tuning switches nothing on")
    return result


def _threads() -> int:
    import torch

    return torch.get_num_threads()
