"""Kernels per decode step: how many launches one generated token costs, baseline against PTO mode.

    python benchmarks/bench_launches.py [--model qwen3_vl_4b_instruct] [--layers 2,36] [--backend fused|npu]
        [--cache dynamic|static] [--batch 1] [--json out.json]

For each layer count, builds `make-tiny --layers N` (random weights, the spec's narrow test widths: what
is counted does not depend on the widths), applies the patch, loads the model as users do (transformers'
default sdpa attention), prefills a short prompt and counts the ops one decode step (batch 1, KV cache)
dispatches, under a `TorchDispatchMode`, in each mode (`--batch B`: B prompts of different lengths, left
padded as `generate` pads them, one step of B new rows):
- baseline: every switch off;
- reference: rms_norm, mrope, swiglu_mlp on (the reference system's flags);
- blocks: attention_prologue and mlp_block on (with rms_norm for the final norm): a decoder layer is the
  prologue, the attention core and the MLP block;
- core: blocks with attention_core on too: the attention function (sdpa) replaced by the op, its lengths
  read from the mask once per step;
- residual: residual_rms_norm alone.
A family whose spec refuses attention_prologue (Qwen3-VL: its q/k norms sit inside the prologue) counts
blocks as mrope and mlp_block on (with rms_norm for the input, q/k and final norms), core as those and
attention_core.
The pto_kernels ops run as custom ops, as a compiled or captured model launches them (the eager
wrappers call their bodies directly): the counter sees each one once, as one kernel, and not the ops
inside it. Two counts per mode: every aten op dispatched, and kernels, the ops that are not views (a view
only changes a tensor's metadata: on an NPU it launches nothing). Per layer: the difference between the
largest and the smallest layer count, over the difference in layers (what is outside the decoder layers,
embedding, rotary tables, final norm, lm_head, cancels). Prints a table; asserts nothing.

`--cache static` counts the step over transformers' StaticCache (what compiled and graph runs decode over):
there the prologue writes the step's keys and values into the cache itself (static_cache.py) and the
attention's cache update does not run; over the default growing cache the update runs as written.

`--backend npu` counts what the `npu` backend launches instead, through the torch_npu stand-in of
tests/kernels/stand_in_torch_npu.py (this machine has no NPU): the entries run eagerly, so the aten ops
around each torch_npu op are counted, each torch_npu op counts as one kernel (the stand-in's CPU math
inside it is not counted), and so does each contiguous copy aclnn makes in front of an op given a
non-contiguous view. Its model has head_dim 128 (`--hidden-size 256 --heads 2`), so GutenOCR's
mrope_section [16, 24, 24] and the torch_npu ops' head-size rules hold.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

MODES = {
    "baseline": (),
    "reference": ("rms_norm", "mrope", "swiglu_mlp"),
    "blocks": ("rms_norm", "attention_prologue", "mlp_block"),
    "core": ("rms_norm", "attention_prologue", "attention_core", "mlp_block"),
    "residual": ("residual_rms_norm",),
}


STAND_INS = Path(__file__).resolve().parents[1] / "tests" / "kernels"
STATIC_CACHE_LEN = 16  # --cache static: positions (the prompt's 8 and the counted step fit)
NPU_WIDTHS = {"hidden_size": 256, "heads": 2}  # head_dim 128: mrope_section [16, 24, 24]


def modes_for(injections) -> dict[str, tuple[str, ...]]:
    """MODES for a spec's injections: without attention_prologue, blocks keeps the layer's own norms and MRoPE."""
    if "attention_prologue" in injections:
        return dict(MODES)
    return {
        **MODES,
        "blocks": ("rms_norm", "mrope", "mlp_block"),
        "core": ("rms_norm", "mrope", "attention_core", "mlp_block"),
    }


def left_padded_prompts(batch: int):
    """(input_ids, attention_mask) [batch, 8]: prompt b of 8 - b % 8 tokens after b % 8 pads (id 0)."""
    import torch

    ids = torch.tensor([[1, 5, 9, 42, 7, 3, 11, 2]] * batch)
    mask = torch.ones_like(ids)
    for b in range(batch):
        ids[b, : b % 8], mask[b, : b % 8] = 0, 0
    return ids, mask


def count_decode_step(
    folder: Path,
    modes: dict[str, tuple[str, ...]] = MODES,
    backend: str = "fused",
    cache: str = "dynamic",
    batch: int = 1,
) -> dict[str, dict]:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import AutoModelForImageTextToText, StaticCache

    class Counting(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: Counter[str] = Counter()
            self.kernels: Counter[str] = Counter()  # the ops that are not views, by name
            self.views = 0
            self.paused = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not self.paused:
                self.ops[str(func.overloadpacket)] += 1
                is_view = bool(getattr(func, "is_view", False))
                self.views += is_view
                self.kernels[str(func.overloadpacket)] += not is_view
            return func(*args, **(kwargs or {}))

        @contextlib.contextmanager
        def pause(self):
            self.paused += 1
            try:
                yield
            finally:
                self.paused -= 1

    model = AutoModelForImageTextToText.from_pretrained(
        str(folder), trust_remote_code=True, dtype=torch.float32
    )
    model.eval()
    sys.path.insert(0, str(folder))
    import pto_kernels

    npu = None
    if backend == "npu":
        sys.path.insert(0, str(STAND_INS))
        import stand_in_torch_npu

        npu = sys.modules["torch_npu"] = stand_in_torch_npu.make_module()
    else:
        pto_kernels._tracing = lambda: True  # the custom ops, as a compiled or captured model calls them
    prompt, mask = left_padded_prompts(batch)
    results = {}
    for mode, ops in modes.items():
        with torch.no_grad(), pto_kernels.enabled(ops, backend=backend):
            extra = {}
            if cache == "static":  # the graph path's cache: the prologue writes the step's k and v itself
                text = model.config.get_text_config(decoder=True)
                extra["past_key_values"] = StaticCache(config=text, max_cache_len=STATIC_CACHE_LEN)
            out = model(input_ids=prompt, attention_mask=mask, use_cache=True, **extra)
            step = out.logits[:, -1:].argmax(-1)
            step_mask = torch.cat((mask, torch.ones_like(step)), -1)
            pto_kernels.reset_stats()
            with Counting() as counted:
                if npu is not None:
                    npu.calls.clear()
                    npu.copies.clear()
                    npu.inside = counted.pause
                model(
                    input_ids=step,
                    attention_mask=step_mask,
                    past_key_values=out.past_key_values,
                    use_cache=True,
                )
        total = sum(counted.ops.values())
        custom = {name: n for name, n in counted.ops.items() if name.startswith("pto_kernels.")}
        if npu is not None:  # each torch_npu op and each copy aclnn makes: one kernel
            custom = {f"torch_npu.{name}": n for name, n in npu.calls.items()}
            custom.update({f"torch_npu.copy_before_{name}": n for name, n in npu.copies.items() if n})
            total += sum(custom.values())
        ran = {op: s["calls"] for op, s in pto_kernels.stats().items() if s["calls"]}
        results[mode] = {
            "ops": total,
            "kernels": total - counted.views,
            "pto_kernels_ops": custom,
            "aten_kernels": {name: n for name, n in counted.kernels.items() if n},
            "calls": ran,
        }
    if npu is not None:
        sys.modules.pop("torch_npu", None)
        sys.path.remove(str(STAND_INS))
    sys.path.remove(str(folder))
    sys.modules.pop("pto_kernels", None)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gutenocr_3b", help="a built-in spec's name or a spec file")
    parser.add_argument("--layers", default="2,36", help="comma list of decoder layer counts")
    parser.add_argument(
        "--backend", choices=("fused", "npu"), default="fused", help="the pto_kernels backend"
    )
    parser.add_argument(
        "--cache",
        choices=("dynamic", "static"),
        default="dynamic",
        help="the KV cache: transformers' default growing one, or the static one compiled and graph runs use",
    )
    parser.add_argument("--batch", type=int, default=1, help="sequences in the step (left padded)")
    parser.add_argument("--json", type=Path, help="write the counts here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pto-bench-launches-"))
    os.environ.setdefault("HF_MODULES_CACHE", str(work / "hf-modules"))
    from pto_patch.model.spec import load_spec
    from pto_patch.patching import engine
    from pto_patch.tiny import model as tiny_model

    widths = tiny_model.TextWidths(**NPU_WIDTHS) if args.backend == "npu" else tiny_model.TextWidths()
    modes = modes_for(load_spec(args.model).injections)
    layers = sorted(int(n) for n in args.layers.split(","))
    counts = {}
    for n in layers:
        folder = work / f"layers-{n}"
        tiny_model.make_tiny(folder, model=args.model, layers=n, widths=widths)
        engine.apply_patch(model_path=folder, model=args.model)
        counts[n] = count_decode_step(folder, modes, args.backend, args.cache, args.batch)

    print(
        f"{'layers':>6} {'mode':<10} {'aten+pto ops':>12} {'kernels':>8} {'x baseline':>10}  pto_kernels ops"
    )
    for n in layers:
        base = counts[n]["baseline"]["kernels"]
        for mode, row in counts[n].items():
            custom = ", ".join(f"{k.split('.', 1)[1]} {v}" for k, v in row["pto_kernels_ops"].items()) or "-"
            print(
                f"{n:>6} {mode:<10} {row['ops']:>12} {row['kernels']:>8} {row['kernels'] / base:>10.3f}  {custom}"
            )
    per_layer = {}
    if len(layers) > 1:
        low, high = layers[0], layers[-1]
        print(f"\nper decoder layer (layers {low} -> {high}):")
        for mode in modes:
            ops = (counts[high][mode]["ops"] - counts[low][mode]["ops"]) / (high - low)
            kernels = (counts[high][mode]["kernels"] - counts[low][mode]["kernels"]) / (high - low)
            per_layer[mode] = {"ops": ops, "kernels": kernels}
        for mode, row in per_layer.items():
            ratio = row["kernels"] / per_layer["baseline"]["kernels"]
            print(
                f"  {mode:<10} ops {row['ops']:6.1f}  kernels {row['kernels']:6.1f}  x baseline {ratio:.3f}"
            )
    if args.json:
        args.json.write_text(json.dumps({"counts": counts, "per_layer": per_layer}, indent=1))


if __name__ == "__main__":
    main()
