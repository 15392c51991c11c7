"""Greedy generation, timing both modes side by side, and comparing what they computed.

The modes alternate run by run (the order reversed every other round), so a busy machine slows
both alike; the comparison looks at the first step's logits, the tokens and the decoded texts.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from pto_patch.run.device import DeviceChoice, dtype_key, peak_memory_mb, reset_peak_memory, synchronize
from pto_patch.run.graph import graph_decode
from pto_patch.run.loading import LoadedModel
from pto_patch.run.report import Accuracy, ModeMetrics

WARMUP_NEW_TOKENS = 10  # each warm-up run, as in the reference
# A judged step passes when its score difference from the reference is at most atol + rtol * max|score|
# (per dtype and mode, overridable). What they must admit is a correct run that rounds at other places than
# eager does, and no more (benchmarks/bench_tolerances.py, tiny model, 50 steps teacher-forced,
# docs/proving-it.md). In bf16 the unpatched model's own rounding against fp32 reaches 1.06 (0.09 x
# max|score|): an eager run, whose kernels may keep fp32 where eager rounds to bf16, is judged at rtol 0.08;
# inductor against eager reaches 1.44 (0.12 x), so a compiled run (torch.compile, graph decode, ACL graph,
# a serving engine's compiled steps) is judged at 0.15 (at 0.05 a correct bf16 --use_compile run failed).
# 0.08 still catches an mlp_block whose output is 1.25 x too large (0.11 x max|score| at its worst step),
# which 0.15 passes. fp16's rounding reaches 0.08 and inductor 0.11, within its 0.02 + 0.01 x max|score|.
DEFAULT_TOLERANCES = {
    "float32": (1e-3, 1e-4),
    "float16": (2e-2, 1e-2),
    "bfloat16": (1e-1, 8e-2),
}
COMPILED_TOLERANCES = DEFAULT_TOLERANCES | {"bfloat16": (1e-1, 1.5e-1)}


def tolerances(
    dtype_name: str, atol: float | None, rtol: float | None, compiled: bool = False
) -> tuple[float, float]:
    """The run's (atol, rtol): the options' where given, else the dtype's default for an eager or a
    compiled run."""
    table = COMPILED_TOLERANCES if compiled else DEFAULT_TOLERANCES
    default_atol, default_rtol = table[dtype_key(dtype_name)]
    return (default_atol if atol is None else atol, default_rtol if rtol is None else rtol)


@dataclass
class Generation:
    new_tokens: Any  # [batch, n] tensor on the CPU
    first_logits: Any  # [batch, vocab] float32 on the CPU, or None
    seconds: float
    prefill_s: float | None = None
    decode_step_s: float | None = None


class _StepClock:
    """A generate() streamer that only notes when each token comes out (the first put is the prompt)."""

    def __init__(self, device: DeviceChoice):
        self.device = device
        self.times: list[float] = []

    def put(self, value) -> None:
        synchronize(self.device)
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def eos_ids(tokenizer, model) -> list[int] | None:
    """The ids that end a sequence, as generate() is told them."""
    return _token_ids(tokenizer, model)[0]


def _token_ids(tokenizer, model) -> tuple[list[int] | None, int | None]:
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_list = [eos] if isinstance(eos, int) else (list(eos) if eos is not None else None)
    pad = getattr(config, "pad_token_id", None) if config is not None else None
    if pad is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_list or [None])[0]
    return eos_list, pad


def generate(
    loaded: LoadedModel, inputs, new_tokens: int, *, fixed_length: bool, logits: bool, processor=None
) -> Generation:
    """Greedy generation; `fixed_length` suppresses end-of-sequence so every timed run is as long.
    `processor`: a logits processor that sees each step's scores last (`run.judging`: the reference's
    recorder, or a judged run's teacher forcing).

    In a graph run (`graph_decode`) it generates with the run's static cache; transformers' own
    compile-on-generate stays off, so what is compiled is what `apply_compile` compiled."""
    import torch
    from transformers import GenerationConfig, LogitsProcessorList

    eos, pad = _token_ids(loaded.tokenizer, loaded.model)
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens if fixed_length else None,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos,
        pad_token_id=pad,
        output_logits=logits,
        return_dict_in_generate=True,
        disable_compile=True,
    )
    prompt_length = inputs["input_ids"].shape[1]
    clock = _StepClock(loaded.device)
    decode = graph_decode.installed(loaded.model)
    with (
        decode.generation(inputs["input_ids"], new_tokens) if decode is not None else nullcontext({}) as extra
    ):
        synchronize(loaded.device)
        started = time.perf_counter()
        with torch.no_grad():  # as generate itself does; inference_mode would be stricter than users' runs
            out = loaded.model.generate(
                **inputs,
                **extra,
                generation_config=config,
                streamer=clock,
                **({"logits_processor": LogitsProcessorList([processor])} if processor is not None else {}),
            )
        synchronize(loaded.device)
        seconds = time.perf_counter() - started
    first = out.logits[0].float().cpu() if logits and out.logits else None
    token_times = clock.times[1:]  # one per new token
    prefill = token_times[0] - started if token_times else None
    step = (token_times[-1] - token_times[0]) / (len(token_times) - 1) if len(token_times) > 1 else None
    return Generation(
        new_tokens=out.sequences[:, prompt_length:].cpu(),
        first_logits=first,
        seconds=seconds,
        prefill_s=prefill,
        decode_step_s=step,
    )


def _metrics(loaded: LoadedModel, runs: list[Generation], batch: int, peak_mb: float) -> ModeMetrics:
    latencies = [run.seconds for run in runs]
    latency = statistics.fmean(latencies)
    prefills = [run.prefill_s for run in runs if run.prefill_s is not None]
    steps = [run.decode_step_s for run in runs if run.decode_step_s is not None]
    tokens = int(runs[-1].new_tokens.numel())
    return ModeMetrics(
        load_s=loaded.load_s,
        latency_s=latency,
        tokens=tokens,
        tokens_per_s=tokens / latency if latency > 0 else 0.0,
        peak_memory_mb=peak_mb,
        batch=batch,
        new_tokens_per_sequence=int(runs[-1].new_tokens.shape[1]),
        latencies_s=latencies,
        prefill_s=statistics.fmean(prefills) if prefills else None,
        decode_step_s=statistics.fmean(steps) if steps else None,
    )


MIN_WARMUP = 1


def warmup_runs(requested: int) -> int:
    """The untimed runs per mode before timing: as asked, never none. A mode's first call pays for
    what it builds once (kernels, compiles, captures, allocator growth, the vision encoder's first
    shapes); timed, it shows one mode faster by what the other paid first."""
    return max(requested, MIN_WARMUP)


def measure_modes(
    loaded: LoadedModel,
    inputs,
    switches: dict[str, Callable[[], None]],
    *,
    batch: int,
    new_tokens: int,
    warmup: int,
    iters: int,
) -> dict[str, ModeMetrics]:
    """Time each mode (`switches` maps a mode to the call that selects it) on the same inputs.

    Warm-up runs (10 new tokens each) per mode, at least one (`warmup_runs`: a first call's one-time
    costs are never timed), then `iters` rounds of one timed run per mode, the
    order reversed every other round: on a shared machine both modes see the same load drift. In a
    graph run the warm-ups capture (at least one per mode, over the cache the timed runs use) and the
    timed runs replay; a graph compiled while timing is counted (`graph_decode.timed`).
    """
    names = list(switches)
    decode = graph_decode.installed(loaded.model)
    if decode is not None:
        decode.reserve(new_tokens)
    warmup = warmup_runs(warmup)
    for name in names:
        switches[name]()
        for _ in range(warmup):
            generate(loaded, inputs, WARMUP_NEW_TOKENS, fixed_length=True, logits=False)
    runs: dict[str, list[Generation]] = {name: [] for name in names}
    peaks = dict.fromkeys(names, 0.0)
    for round_index in range(iters):
        for name in names if round_index % 2 == 0 else reversed(names):
            switches[name]()
            reset_peak_memory(loaded.device)
            with graph_decode.timed(loaded.model):
                runs[name].append(generate(loaded, inputs, new_tokens, fixed_length=True, logits=False))
            peaks[name] = max(peaks[name], peak_memory_mb(loaded.device))
    return {name: _metrics(loaded, runs[name], batch, peaks[name]) for name in names}


def compare(base: Generation, pto: Generation, tokenizer, atol: float, rtol: float) -> Accuracy:
    import torch

    a, b = base.first_logits, pto.first_logits
    diff = (b - a).abs()
    max_abs = float(torch.nan_to_num(diff, nan=float("inf")).max()) if diff.numel() else 0.0
    scale = float(a.abs().max()) if a.numel() else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    within = max_abs <= atol + rtol * scale  # NaN counts as an infinite difference

    width = max(base.new_tokens.shape[1], pto.new_tokens.shape[1])
    if width == 0:
        match_rate = 1.0
    else:
        padded = []
        for tokens in (base.new_tokens, pto.new_tokens):
            extra = width - tokens.shape[1]
            padded.append(torch.nn.functional.pad(tokens, (0, extra), value=-1) if extra else tokens)
        match_rate = float((padded[0] == padded[1]).float().mean())
    base_texts = tokenizer.batch_decode(base.new_tokens, skip_special_tokens=True)
    pto_texts = tokenizer.batch_decode(pto.new_tokens, skip_special_tokens=True)
    return Accuracy(
        max_abs_logit_diff=max_abs,
        max_rel_logit_diff=max_rel,
        token_match_rate=match_rate,
        text_equal=base_texts == pto_texts,
        passed=within,
        atol=atol,
        rtol=rtol,
        logits_within_tolerance=within,
        baseline_text=base_texts[0] if base_texts else "",
        pto_text=pto_texts[0] if pto_texts else "",
    )
