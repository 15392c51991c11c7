"""What one decode step would cost on a 910B, on paper: the PyPTO cost model's kernel spans, summed.

    python benchmarks/bench_decode_projection.py [--json out.json] [--contexts 1024,4096] [--batches 1,4,8,16]
                                                 [--launch-us 16.8] [--launches 131] [--timeout S]

A projection, not a measurement: nothing here runs on a device. One decode step of GutenOCR-3B at
each of `--batches` (default 1: B sequences decode one token each, B rows through every block; widths as bench_sim.py: hidden 2048, MLP 11008, 16 q / 2 kv heads of 128, vocabulary 151,936):
- 36 decoder layers of the blocks: attention_prologue + mlp_block, each simulated once (bench_sim.run_sim,
  the tilings the kernel package picks); the per-op layer (8 kernels) beside it;
- the attention core per layer: the pypto flash-decode kernel (pypto_attention.py) simulated over a static
  cache of each of `--contexts` positions for each of B sequences, every position used (1 new row,
  GutenOCR-3B's 16 q / 2 kv heads of 128), beside the floor of reading every sequence's K and V once at the
  model's bandwidth; nothing is estimated;
- the final RMSNorm (1 x 2048) and the lm_head as one plain matmul kernel (2048 -> 151,936), simulated.
Over the static cache a captured step decodes over, the blocks' prologue is the kernel that also writes
the step's k and v into the cache and advances the layer's length (`attention_prologue_cached`, simulated
at B rows, one a sequence, at every batch up to 16; transformers' cache update does not run). Those are the package's kernels, and the headline. A blocks step
dispatches more (`--launches`, 131): a few dozen per-step ops (embedding, rotary tables, mask, lengths),
torch's, which the cost model cannot run. A
last line adds them, each at the span of a small PyPTO kernel that writes one cache's new rows
(bench_sim's `kv_cache_write`, simulated): a proxy, printed apart from the headline.

Printed per layer variant, in ms per token:
- captured (ACL graph): the kernels back to back, no host launch between them: the sum of the spans;
- eager: the same plus a launch cost per kernel, `--launch-us` (pypto-gym measured 16.8 us on a 910B
  for one small PyPTO RMSNorm kernel: another kernel, the order of magnitude of a launch), for the
  modeled kernels only and for every kernel the step dispatches (`--launches`: 131 with the blocks and the
  core on 36 layers over the static cache, 196 over the growing one, 1,461 for the baseline, as
  `bench_launches.py --layers 2,36 [--cache static]` counted them);
beside the seed's 90 ms a token (the reference's 11.1 tok/s on a 910B), the weight-streaming floor (the
decoder's and the tied lm_head's weights once at the model's bandwidth, about 4.4 ms) and the floor with
the 36 layers' K and V caches read once as well (every sequence's). Per batch, tokens per second: B
tokens a captured step. A span the cost model reports below its kernel's byte floor (the lm_head's: the model
has no chip-wide memory limit, `at_byte_floor`) counts at the floor.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_sim  # noqa: E402  (beside this script; puts the kernel package on the path)
from pto_kernels.tiling.tile_table import DECODE_MAX_ROWS  # noqa: E402

LAYERS = 36
VOCAB = 151_936
SEED_MS = 90.0  # the reference's baseline on a 910B: 11.1 tok/s at batch 1
LAUNCH_US = 16.8  # pypto-gym: one 1x2048 PyPTO RMSNorm kernel on a 910B, end to end
# bench_launches.py --layers 2,36: the blocks and the core over the static cache a captured step decodes
# over (--cache static, transformers 5.25.0; 129 under 5.8.1, 138 under 4.57.6: 3 a layer under each, the
# prologue writing the cache and advancing a 5.8+ layer's length), the baseline over the growing one
STEP_LAUNCHES = {"blocks": 131, "baseline": 1461}
# past the batches the package's cached prologue takes (DECODE_MAX_ROWS sequences) over the static cache:
# the cache update it leaves to torch, a layer (two index_copy_, the length's add_)
CACHE_UPDATE_OPS = 3
FINAL = [("rms_norm", {"width": bench_sim.TEXT}), ("linear", {"out": VOCAB, "in": bench_sim.TEXT})]
CONTEXTS = (1024, 4096)


def kernels_to_simulate(rows: int, contexts=CONTEXTS) -> list[tuple[str, dict]]:
    """Every kernel of a step at batch `rows` (one new row per sequence: the attention core's rows are 1)."""
    wanted = []
    cores = [("attention_core", {"context": c, "batch": rows, "rows": 1}) for c in contexts]
    others = [("kv_cache_write", {"context": contexts[0]})]  # the proxy for the kernels not ours
    # over the static cache the prologue writes the step's k and v itself, at `rows` sequences (its cache's
    # length does not change its work: simulated once); past the batches it takes, the plain prologue runs
    # and the cache update is kv_cache_write's proxy
    cached = [("attention_prologue_cached", {"context": contexts[0]})] if prologue_writes_cache(rows) else []
    kernels = bench_sim.LAYER_KERNELS["fused"] + bench_sim.LAYER_KERNELS["per_op"] + FINAL + cores + others
    kernels += cached
    for op, params in kernels:
        entry = (op, {"rows": rows} | params)
        if entry not in wanted:
            wanted.append(entry)
    return wanted


def prologue_writes_cache(batch: int) -> bool:
    """Whether the package's cached prologue writes a decode step's k and v at this batch (one kernel); past
    it, the plain prologue, then torch's cache update."""
    return batch <= DECODE_MAX_ROWS


def weight_floor_ms(soc: dict) -> float:
    """The weights a decode step streams (36 layers' q/k/v, o, MLP; the tied lm_head) at the model's bandwidth."""
    layer = bench_sim._weight_elements("decoder_layer/fused", {})
    total = bench_sim.BF16_BYTES * (LAYERS * layer + VOCAB * bench_sim.TEXT)
    return total / bytes_per_us(soc) / 1e3


def bytes_per_us(soc: dict) -> float:
    return soc["ddr_rate_bytes_per_cycle"] * soc["ai_core_cnt"] * soc["cube_freq_mhz"]


def kv_floor_us(context: int, soc: dict, batch: int = 1) -> float:
    """One layer's K and V caches of `context` positions, `batch` sequences, read once at the model's bandwidth."""
    kv_bytes = bench_sim.min_bytes("attention_core", {"rows": 1, "context": context, "batch": batch})
    return kv_bytes / bytes_per_us(soc)


def project(
    spans_us: dict, context: int, launch_us: float, launches: dict, soc: dict, batch: int = 1
) -> dict:
    norm_us, lm_head_us = spans_us["rms_norm"], spans_us["linear_lm_head"]
    attention_us = spans_us[f"attention_core_{context}"]
    variants = {}
    for variant, kernels in bench_sim.LAYER_KERNELS.items():
        # a captured step decodes over the static cache: the blocks' prologue is the one writing it, at B rows
        # (one a sequence); past the batches it takes, the package runs the prologue kernel at B rows, then the
        # cache update it leaves to torch (each sequence's k and v rows, two index_copy_, and the 5.8+ layer's
        # length, one add_), each counted at the span of the small kernel that writes one cache's new rows
        # (kv_cache_write, simulated at B rows)
        cached = variant == "fused" and prologue_writes_cache(batch)
        layer_us = sum(spans_us[_key(op, params, cached=cached)] for op, params in kernels)
        cache_update = CACHE_UPDATE_OPS if variant == "fused" and not cached else 0
        layer_us += cache_update * spans_us["kv_cache_write"]
        step_us = LAYERS * (layer_us + attention_us) + norm_us + lm_head_us
        # the layer's kernels, its cache update and its attention core; norm, lm_head
        modeled = LAYERS * (len(kernels) + cache_update + 1) + 2
        variants[variant] = {
            "layer_kernels_us": round(layer_us, 2),
            "modeled_kernels": modeled,
            "captured_ms": round(step_us / 1e3, 3),
            "eager_modeled_launches_ms": round((step_us + modeled * launch_us) / 1e3, 3),
        }
    blocks = variants["fused"]
    # the step's launches as counted at batch 1 (3 a layer), and past the cached prologue's batches the cache
    # update's ops besides
    step_launches = launches["blocks"] + (0 if prologue_writes_cache(batch) else LAYERS * CACHE_UPDATE_OPS)
    blocks["eager_all_launches_ms"] = round(
        (blocks["captured_ms"] * 1e3 + step_launches * launch_us) / 1e3, 3
    )
    others = max(0, step_launches - blocks["modeled_kernels"])
    proxy_us = spans_us["kv_cache_write"]
    blocks["other_kernels"] = others
    blocks["captured_with_others_ms"] = round((blocks["captured_ms"] * 1e3 + others * proxy_us) / 1e3, 3)
    weight_floor = weight_floor_ms(soc)
    kv_floor = LAYERS * kv_floor_us(context, soc, batch) / 1e3
    return {
        "batch": batch,
        "context_tokens": context,
        "launch_us": launch_us,
        "step_launches": launches,
        "attention_core_us_per_layer": round(attention_us, 2),
        "attention_core_kv_floor_us_per_layer": round(kv_floor_us(context, soc, batch), 2),
        "captured_blocks_tokens_per_s": round(batch / blocks["captured_ms"] * 1e3, 1),
        "final_norm_us": round(norm_us, 2),
        "lm_head_us": round(lm_head_us, 2),
        "variants": variants,
        "baseline_launches_only_ms": round(launches["baseline"] * launch_us / 1e3, 3),
        "seed_ms": SEED_MS,
        "weight_floor_ms": round(weight_floor, 3),
        "weight_and_kv_floor_ms": round(weight_floor + kv_floor, 3),
        "captured_blocks_over_weight_floor": round(blocks["captured_ms"] / weight_floor, 3),
        "other_kernel_proxy_us": round(proxy_us, 2),
        "captured_blocks_with_others_over_weight_floor": round(
            blocks["captured_with_others_ms"] / weight_floor, 3
        ),
        "captured_blocks_over_weight_and_kv_floor": round(
            blocks["captured_ms"] / (weight_floor + kv_floor), 3
        ),
    }


def at_byte_floor(entry: dict) -> float:
    """A kernel's span for the projection: the simulated one, or its byte floor where the cost model reports
    less. The model moves each cube core's copies at about 60 B a cycle (the lm_head: 3,072 columns of 2,048
    bf16 weights, 12.6 MB, a task of 205,276 cycles) whatever the other cores do, where the chip's HBM gives
    them 32 B a cycle each at most (A2A3.ini's ddr_rate x 24 cores, 1.42 TB/s): it has no chip-wide limit,
    so a kernel that streams more bytes than it computes can come out faster than the memory allows."""
    return max(entry["us"], entry["floor_us"])


def _key(op: str, params: dict, cached: bool = False) -> str:
    if op == "attention_prologue" and cached:
        return "attention_prologue_cached"
    if op == "attention_core":
        return f"attention_core_{params['context']}"
    if op == "linear":
        return "linear_lm_head" if params["out"] == VOCAB else f"linear_{params['in']}_{params['out']}"
    return op


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the spans and the projection here")
    parser.add_argument(
        "--contexts", default=",".join(map(str, CONTEXTS)), help="positions in the KV cache, comma-separated"
    )
    parser.add_argument(
        "--batches", default="1", help="sequences decoded together (B rows a step), comma-separated"
    )
    parser.add_argument(
        "--launch-us", type=float, default=LAUNCH_US, help="host launch cost per kernel, eager"
    )
    parser.add_argument(
        "--launches", type=int, default=STEP_LAUNCHES["blocks"], help="kernels a blocks step dispatches"
    )
    parser.add_argument(
        "--timeout", type=int, default=bench_sim.SIM_TIMEOUT_S, help="seconds per simulated kernel"
    )
    args = parser.parse_args()
    contexts = tuple(int(c) for c in args.contexts.split(","))
    batches = tuple(int(b) for b in args.batches.split(","))

    soc = bench_sim.soc_config()
    entries, projections = [], []
    launches = {"blocks": args.launches, "baseline": STEP_LAUNCHES["baseline"]}
    for batch in batches:
        spans_us = {}
        for op, params in kernels_to_simulate(rows=batch, contexts=contexts):
            entry = bench_sim.with_roofline(bench_sim.run_sim(op, params, args.timeout), soc)
            entries.append(entry)
            if entry["status"] != "ok":
                print(f"{op} {params}: not available: {entry['reason']}")
                return 1
            spans_us[_key(op, params)] = at_byte_floor(entry)
            below = "  below its byte floor: counted at the floor" if entry["us"] < entry["floor_us"] else ""
            print(
                f"simulated batch {batch:<3} {_key(op, params):<26} {entry['us']:>9.2f} us"
                f"  {entry['ratio']:>6.2f}x its byte floor ({entry['floor_us']:.2f} us)"
                f"  ({entry['wall_s']} s){below}",
                flush=True,
            )
        projections += [project(spans_us, c, args.launch_us, launches, soc, batch) for c in contexts]
    for projection in projections:
        _print(projection, soc, args)
    if args.json:
        doc = {"soc": soc, "kernels": entries, "projections": projections}
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


def _print(projection: dict, soc: dict, args) -> None:
    context, batch = projection["context_tokens"], projection["batch"]
    print(
        f"\nOne decode step of GutenOCR-3B on a {soc['soc_version']}, batch {batch}, {context}-position KV cache: "
        "a projection from the PyPTO cost model, not a measurement"
    )
    print(
        f"attention core per layer (simulated): {projection['attention_core_us_per_layer']} us, its K/V floor "
        f"{projection['attention_core_kv_floor_us_per_layer']} us; final norm {projection['final_norm_us']} us; "
        f"lm_head {projection['lm_head_us']} us"
    )
    print(f"{'layer':<22} {'kernels':>7} {'captured ms':>12} {f'eager ms (+{args.launch_us} us/kernel)':>30}")
    for variant, row in projection["variants"].items():
        layer = (row["modeled_kernels"] - 2) // LAYERS - 1  # a layer's kernels besides its attention core
        name = f"{'blocks' if variant == 'fused' else 'per-op'} ({layer} + attention)"
        print(
            f"{name:<22} {row['modeled_kernels']:>7} {row['captured_ms']:>12.2f} "
            f"{row['eager_modeled_launches_ms']:>30.2f}"
        )
    fused = projection["variants"]["fused"]
    print(
        f"blocks, eager, all {args.launches} kernels a step dispatches launched: {fused['eager_all_launches_ms']:.2f} ms; "
        f"the baseline's {STEP_LAUNCHES['baseline']} launches alone (eager, growing cache):"
        f" {projection['baseline_launches_only_ms']:.2f} ms"
    )
    print(
        f"with the {fused['other_kernels']} other kernels a blocks step dispatches (per-step ops: embedding,"
        f" rotary tables, mask, lengths; torch's, not simulated: each at a {projection['other_kernel_proxy_us']} us PyPTO cache write, a"
        f" proxy): captured {fused['captured_with_others_ms']:.2f} ms"
        f" ({projection['captured_blocks_with_others_over_weight_floor']:.2f}x the weight floor)"
    )
    print(
        f"seed (reference baseline, measured on a 910B): {SEED_MS} ms; weight floor {projection['weight_floor_ms']:.2f}"
        f" ms (captured blocks {projection['captured_blocks_over_weight_floor']:.2f}x); with the K/V caches"
        f" {projection['weight_and_kv_floor_ms']:.2f} ms ({projection['captured_blocks_over_weight_and_kv_floor']:.2f}x)"
    )
    print(f"captured blocks: {projection['captured_blocks_tokens_per_s']} tokens/s ({batch} a step)")


if __name__ == "__main__":
    sys.exit(main())
