"""One run of a model through vLLM, in a process of its own: `python -m pto_patch.serving.vllm_engine REQUEST OUT`.

`pto-patch verify --engine vllm` (pto_patch.serving.vllm_verify) starts this twice, without and with the plugin's
ops switched on in the environment it hands over ($PTO_KERNELS_VLLM_OPS): vLLM registers layer classes
once per process and for good, so the two modes cannot share one. REQUEST is a JSON file (the fields of
`EngineRequest`); OUT receives the run's JSON: greedy token ids (and, when asked, each step's top logprobs), timings, and, from every worker process
(`LLM.collective_rpc`), which pto_kernels it imported, the calls per op and which layers ran them.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EngineRequest:
    model_path: str
    prompt: str
    image: str | None = None
    dtype: str = "bfloat16"
    batch: int = 1
    output_length: int = 16
    compiled: bool = False  # vLLM's torch.compile (custom ops off: forward_native traced) vs enforce_eager
    warmup: int = 1
    iters: int = 3
    max_model_len: int = 512
    device: str | None = None  # what verify's --device asked for; vLLM's platform decides
    timed_batches: tuple[int, ...] = ()  # also time these batch sizes (benchmarks/bench_vllm.py)
    logprobs: int = 0  # the untimed run hands back each step's top logprobs (verify's judgement)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def worker_kernel_state(worker=None) -> dict[str, Any]:
    """Run in each vLLM worker (collective_rpc): the pto_kernels it imported and what its layers ran."""
    kernels = sys.modules.get("pto_kernels")
    state: dict[str, Any] = {"pid": os.getpid(), "pto_kernels_path": None, "switched_on": [], "stats": {}}
    if kernels is not None:
        state.update(
            pto_kernels_path=str(Path(kernels.__file__).resolve().parent),
            switched_on=list(kernels.switched_on()),
            backends=kernels.backends(),
            stats=kernels.stats(),
        )
    from vllm.model_executor import custom_op
    from vllm.platforms import current_platform

    # the module attribute from vLLM 0.16 on, the class attribute up to 0.13
    registry = getattr(custom_op, "op_registry_oot", None)
    if not isinstance(registry, dict):
        registry = vars(custom_op.CustomOp).get("op_registry_oot", {})
    state["registry"] = {key: f"{cls.__module__}.{cls.__qualname__}" for key, cls in registry.items()}
    state["layers"] = _layers(worker)
    state["device"] = current_platform.device_type
    return state


LAYER_KEYS = ("RMSNorm", "SiluAndMul", "MRotaryEmbedding")


def _layers(worker) -> dict[str, dict[str, Any]]:
    """Per vLLM layer class (by its in-tree class): how many the model built, how many run pto_kernels, and
    per forward that runs (pto_kernels, or the class underneath and why) how many layers run it."""
    model = getattr(getattr(worker, "model_runner", None), "model", None)
    counts: dict[str, dict[str, Any]] = {}
    if model is None:
        return counts
    for module in model.modules():
        key = next((c.__name__ for c in type(module).__mro__ if c.__name__ in LAYER_KEYS), None)
        if key is None:
            continue
        entry = counts.setdefault(key, {"built": 0, "pto": 0, "runs": {}})
        entry["built"] += 1
        entry["pto"] += int(bool(getattr(module, "pto_kernels_on", False)))
        runs = getattr(module, "pto_runs", None) or f"{type(module).__module__}.{type(module).__qualname__}"
        entry["runs"][runs] = entry["runs"].get(runs, 0) + 1
    return counts


def _prompts(llm, request: EngineRequest) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = [{"type": "text", "text": request.prompt}]
    if request.image is not None:
        content.insert(0, {"type": "image"})
    text = llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    prompt: dict[str, Any] = {"prompt": text}
    if request.image is not None:
        from PIL import Image

        with Image.open(request.image) as opened:
            prompt["multi_modal_data"] = {"image": opened.convert("RGB")}
    return [prompt] * request.batch


def run(request: EngineRequest) -> dict[str, Any]:
    started = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    import_s = time.perf_counter() - started
    if request.device is not None and request.device.split(":")[0] != current_platform.device_type:
        raise SystemExit(
            f"error: --device {request.device}: vLLM here runs on {current_platform.device_type} "
            "(its platform decides); leave --device out"
        )
    llm = LLM(
        model=request.model_path,
        dtype=request.dtype,
        seed=0,
        max_model_len=request.max_model_len,
        max_num_seqs=max((request.batch, *request.timed_batches)),
        max_num_batched_tokens=request.max_model_len,
        enforce_eager=not request.compiled,
        limit_mm_per_prompt={"image": 1 if request.image else 0, "video": 0},
    )
    load_s = time.perf_counter() - started - import_s
    prompts = _prompts(llm, request)
    params = SamplingParams(temperature=0.0, max_tokens=request.output_length, ignore_eos=True)
    judged = SamplingParams(
        temperature=0.0, max_tokens=request.output_length, ignore_eos=True, logprobs=request.logprobs or None
    )
    outputs = llm.generate(prompts, judged, use_tqdm=False)
    token_ids = [list(output.outputs[0].token_ids) for output in outputs]
    logprobs = (
        [_step_logprobs(output.outputs[0].logprobs) for output in outputs] if request.logprobs else None
    )
    texts = [output.outputs[0].text for output in outputs]
    prompt_tokens = len(outputs[0].prompt_token_ids or [])
    timed = _timed(llm, prompts, params, request)
    latency = statistics.median(timed["latencies_s"]) if timed["latencies_s"] else None
    by_batch = {
        str(batch): _timed(llm, prompts[:1] * batch, params, request) for batch in request.timed_batches
    }
    workers = llm.collective_rpc(worker_kernel_state)
    return {
        "request": request.to_json(),
        "engine_pid": os.getpid(),
        "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0",
        "token_ids": token_ids,
        "texts": texts,
        "prompt_tokens": prompt_tokens,
        "prompt_token_ids": list(outputs[0].prompt_token_ids or []),
        "logprobs": logprobs,
        "import_s": round(import_s, 3),
        "load_s": round(load_s, 3),
        "latency_s": latency,
        "latencies_s": timed["latencies_s"],
        "tokens_per_s": (request.batch * request.output_length / latency) if latency else None,
        "workers": workers,
        "by_batch": by_batch,
        "vllm_version": _version("vllm"),
    }


def _step_logprobs(steps) -> list[list[list[float]]]:
    """Per step, [token id, logprob] of the top ones vLLM handed back (the chosen token among them)."""
    return [
        [[int(token), float(entry.logprob)] for token, entry in (step or {}).items()] for step in steps or []
    ]


def _timed(llm, prompts, params, request: EngineRequest) -> dict[str, Any]:
    for _ in range(request.warmup):
        llm.generate(prompts, params, use_tqdm=False)
    seconds = []
    for _ in range(request.iters):
        tick = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        seconds.append(time.perf_counter() - tick)
    tokens = len(prompts) * request.output_length
    return {"latencies_s": seconds, "tokens_per_s": [tokens / s for s in seconds]}


def _version(package: str) -> str | None:
    import importlib.metadata

    for name in (package, f"{package}-cpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def main(argv: list[str]) -> int:
    fields = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    fields["timed_batches"] = tuple(fields.get("timed_batches", ()))
    request = EngineRequest(**fields)
    result = run(request)
    Path(argv[2]).write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
