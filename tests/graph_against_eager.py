"""Graph decode judged against the eager model, step by step, in whatever interpreter runs it.

`python -m tests.graph_against_eager FOLDER --cache static --batch 1 2` loads FOLDER (a tiny Qwen2.5-VL from
`make-tiny`: its forward really reads and writes its KV cache), generates greedily eagerly (transformers' own
cache, no graph: the reference), then installs graph decode as `verify --use_acl_graph` does
(`apply_compile`, the torchair first on the path: tests/counting_torchair or tests/skewing_torchair) and
generates the same prompts twice over it, per batch size (each batch size is a capture key: its first
generation is the one its priming step runs in; the second replays). It prints one JSON document: per batch
and generation the tokens of both runs and,
per generated step, max|graph - eager| of the logits against the float32 tolerance of
pto_patch/run/generation.py's DEFAULT_TOLERANCES (atol + rtol * max|eager|).

Run it with a release env first on PYTHONPATH (tests/release_envs.py) to judge that release.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.torchair_runs import COUNTING_TORCHAIR, REPO

TIMEOUT_S = 600


def run(
    folder: Path,
    cache: str,
    batches: tuple[int, ...] = (1, 2),
    *,
    release_site: Path | None = None,
    torchair: Path = COUNTING_TORCHAIR,
    home: Path,
    new_tokens: int = 6,
) -> dict:
    """This module's document, from a fresh interpreter with `release_site` (default: the venv's release) and
    `torchair` (a stand-in's folder) first on the path."""
    paths = ([str(release_site)] if release_site else []) + [str(REPO), str(torchair)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "PYTHONNOUSERSITE": "1",
        "HF_HOME": str(home / "hf"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"),
    }
    command = [sys.executable, "-m", "tests.graph_against_eager", str(folder), "--cache", cache]
    command += ["--batch", *map(str, batches), "--new-tokens", str(new_tokens)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=home, timeout=TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip(), (cache, done.stderr[-3000:])
    return json.loads(done.stdout)


def mismatches(document: dict) -> list[str]:
    """One line per generation whose tokens or logits differ from the eager run's (none: graph = eager)."""
    found = []
    for entry in document["batches"]:
        for number, generation in enumerate(entry["generations"], start=1):
            if not (generation["tokens_equal"] and generation["logits_within"]):
                worst = generation["worst"]
                found.append(
                    f"transformers {document['transformers']}, {document['cache']} cache, batch {entry['batch']}, "
                    f"generation {number}: tokens {generation['graph_tokens']} (eager {generation['eager_tokens']}), "
                    f"first step beyond tolerance {generation['first_step_beyond']}, worst step {worst['step']} "
                    f"|diff| {worst['difference']:.3g} > {worst['bound']:.3g}"
                )
    return found


def _prompts(tokenizer, batch: int, length: int, seed: int):
    import torch

    special = set(tokenizer.all_special_ids) | {
        tokenizer.convert_tokens_to_ids(token)
        for token in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
    }
    allowed = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    generator = torch.Generator().manual_seed(seed)
    ids = allowed[torch.randint(len(allowed), (batch, length), generator=generator)]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _generate(model, inputs, new_tokens: int, extra: dict):
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        num_beams=1,
        output_logits=True,
        return_dict_in_generate=True,
        disable_compile=True,
        pad_token_id=0,
    )
    with torch.no_grad():
        out = model.generate(**inputs, **extra, generation_config=config)
    prompt = inputs["input_ids"].shape[1]
    return out.sequences[:, prompt:].tolist(), [step.float() for step in out.logits]


def judge(eager, graph, atol: float, rtol: float) -> dict:
    """Tokens equal, and per step max|graph - eager| against atol + rtol * max|eager|."""
    (eager_tokens, eager_logits), (graph_tokens, graph_logits) = eager, graph
    steps = []
    for step, (want, got) in enumerate(zip(eager_logits, graph_logits, strict=True)):
        difference = float((got - want).abs().max())
        bound = atol + rtol * float(want.abs().max())
        steps.append({"step": step, "difference": difference, "bound": bound, "within": difference <= bound})
    worst = max(steps, key=lambda s: s["difference"] / s["bound"])
    return {
        "tokens_equal": eager_tokens == graph_tokens,
        "eager_tokens": eager_tokens,
        "graph_tokens": graph_tokens,
        "logits_within": all(s["within"] for s in steps),
        "first_step_beyond": next((s["step"] for s in steps if not s["within"]), None),
        "worst": worst,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--cache", choices=("static", "dynamic"), default="static")
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--new-tokens", type=int, default=6)
    parser.add_argument("--prompt-length", type=int, default=7)
    args = parser.parse_args(argv)

    import torch
    import transformers
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from pto_patch.run.generation import DEFAULT_TOLERANCES
    from pto_patch.run.graph import acl_graph
    from pto_patch.run.graph.compiling import apply_compile
    from pto_patch.run.hub_kernels import load_arguments

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.folder)
    loading = load_arguments(hub_kernels=False)  # as the product loads: an explicit use_kernels=False
    model = AutoModelForImageTextToText.from_pretrained(args.folder, dtype=torch.float32, **loading).eval()
    prompts = {batch: _prompts(tokenizer, batch, args.prompt_length, seed=batch) for batch in args.batch}
    eager = {batch: _generate(model, inputs, args.new_tokens, {}) for batch, inputs in prompts.items()}

    options = SimpleNamespace(
        use_compile=False, use_acl_graph=True, compile_backend="eager", compile_mode=None, warmup=1,
        cache=args.cache,
    )  # fmt: skip
    warnings: list[str] = []
    setup = apply_compile(model, options, warnings)
    assert setup is not None and setup.decode is not None, warnings
    atol, rtol = DEFAULT_TOLERANCES["float32"]
    batches = []
    for batch, inputs in prompts.items():
        generations = []
        for _ in range(2):
            with setup.decode.generation(inputs["input_ids"], args.new_tokens) as extra:
                graph = _generate(model, inputs, args.new_tokens, extra)
            generations.append(judge(eager[batch], graph, atol, rtol))
        batches.append({"batch": batch, "generations": generations})
    document = {
        "transformers": transformers.__version__,
        "torchair": getattr(acl_graph.import_torchair(), "__file__", None),
        "cache": args.cache,
        "captures": [[record.key, record.primed] for record in setup.decode.captures],
        "tolerance": [atol, rtol],
        "batches": batches,
    }
    json.dump(document, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
