"""Search tilings of the pypto kernels under PyPTO's SIM cost model; results go to tile_search.json.

    python benchmarks/tile_search.py [--op OP] [--timeout S] [--max-new N]

A small, fixed candidate set per (op, shape class) is simulated at a representative GutenOCR shape,
each in its own subprocess with a time limit (SIM compiles with g++ and is CPU-heavy). Results are cached
in benchmarks/tile_search.json (beside this script, not in the kernel package a patched folder receives)
keyed by op, shape and tiling, so a rerun only simulates what is new; that file is the provenance of tile_table.TILE_TABLE (and of BLOCK_TILE_TABLE's decode entries), whose
entries are copied from the best candidate here by hand after the CPU interpreter tests pass with them.

A candidate whose matmul tiles break the chip's buffers by PyPTO's documented formulas (tile_budget.py) is
refused, never simulated: the cost model would accept it. Of candidates that fit, one whose L0A / L0B
tiles leave room for double buffering wins over a faster one that fills them unless that one is more
than DOUBLE_BUFFER_MARGIN faster.
"""

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))

import bench_sim  # noqa: E402
from pto_kernels.tiling import tile_budget  # noqa: E402
from pto_kernels.tiling.tile_table import TileConfig  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "tile_search.json"

_L1 = "cube_l1_reuse_setting"
_NBUF = "cube_nbuffer_setting"
_MLP_TILES = {"row_tile": 16, "cube_k": (128, 512), "cube_n": (128, 256)}
_PREFILL_TILES = {"cube_k": (128, 512), "cube_n": (128, 256), "act_rows": 16}
# The decoder-layer blocks at decode: every matmul (o_proj or q/k/v, gate/up, down) with one tiling
_BLOCK = {"row_tile": 16, "norm_rows": 8}
_MLP_BLOCK_MERGE = {"pass_settings": ((_L1, -1, 8), (_L1, 0, 1))}
# mlp_block at decode with whole-row L1 tiles (k 2048: the hidden size, the most L1 holds beside the rows):
# gate/up 112 columns a tile (L1 (16 + 112) x 2048 x 2 bytes = 512 KiB), 9 tiles a task (22 tasks for 24
# cube cores); o_proj and down 96 columns a tile (22 tasks where 128 gave 16)
_MLP_BLOCK_WIDE = {
    "cube_k": (256, 2048),
    "cube_n": (112, 112),
    "down_cube_k": (256, 2048),
    "down_cube_n": (96, 96),
    "proj_cube_k": (256, 2048),
    "proj_cube_n": (96, 96),
    "pass_settings": ((_L1, -1, 9), (_L1, 0, 1)),
}
_ONE_ROW = {"row_tile": 1, "static": True, "norm_rows": 1}
# the attention core: 1,024-position chunks; the scores' k tiles and P @ V's k tiles as the decode entry
_CORE = {"row_tile": 16, "norm_rows": 8, "kv_chunk": 1024, "cube_k": (64, 128), "down_cube_k": (256, 1024)}


def _all_matmuls(k: tuple[int, int], n: tuple[int, int]) -> dict:
    return {"cube_k": k, "cube_n": n, "down_cube_k": k, "down_cube_n": n, "proj_cube_k": k, "proj_cube_n": n}


# A second tile in L0B: a 32 KiB tile is at most this much slower than the fastest that fills L0B. The cost
# model leaves the overlap double buffering buys on a device unmeasured (a guess: it is not documented).
DOUBLE_BUFFER_MARGIN = 1.02
# (op, shape class, width or None) as in TILE_TABLE -> (representative shapes, candidate tilings)
CANDIDATES: dict[tuple[str, str, int | None], tuple[list[dict], list[TileConfig]]] = {
    ("rms_norm", "decode", None): (
        [{"rows": 1, "width": 2048}, {"rows": 16, "width": 2048}],
        [TileConfig(row_tile=t) for t in (1, 2, 4, 8)] + [TileConfig(row_tile=1, static=True)],
    ),
    ("rms_norm", "prefill", None): (
        [{"rows": 700, "width": 2048}, {"rows": 2048, "width": 2048}],
        [TileConfig(row_tile=t) for t in (4, 8, 12)],
    ),
    ("rms_norm", "prefill", 3584): (
        [{"rows": 64, "width": 3584}, {"rows": 700, "width": 3584}, {"rows": 2048, "width": 3584}],
        [TileConfig(row_tile=t) for t in (2, 3, 4, 5, 6, 8)],
    ),
    ("rms_norm", "prefill", 1280): (
        [{"rows": 2500, "width": 1280}],
        [TileConfig(row_tile=t) for t in (8, 12, 16)],
    ),
    # Qwen3-VL's q_norm / k_norm: head_dim 128, a row per head (8 k rows at decode, 32 q rows at decode, tokens x
    # 32 at prefill)
    ("rms_norm", "decode", 128): (
        [{"rows": 8, "width": 128}, {"rows": 16, "width": 128}],
        [TileConfig(row_tile=t) for t in (1, 8, 16)],
    ),
    ("rms_norm", "prefill", 128): (
        [{"rows": 256, "width": 128}, {"rows": 2048, "width": 128}],
        [TileConfig(row_tile=t) for t in (8, 32, 64, 128)],
    ),
    ("mrope", "decode", None): (
        [{"rows": 1}, {"rows": 16}],
        [TileConfig(row_tile=t) for t in (1, 4, 16)] + [TileConfig(row_tile=1, static=True)],
    ),
    ("mrope", "prefill", None): ([{"rows": 700}], [TileConfig(row_tile=t) for t in (32, 64, 128, 256)]),
    ("swiglu_mlp", "decode", None): (
        [{"rows": 1}],
        [
            TileConfig(row_tile=16),
            TileConfig(**_MLP_TILES),
            TileConfig(**_MLP_TILES, pass_settings=((_L1, -1, 4),)),
            TileConfig(**_MLP_TILES, pass_settings=((_L1, -1, 8),)),
            TileConfig(**_MLP_TILES, pass_settings=((_L1, -1, 4), (_NBUF, -1, 2))),
            TileConfig(row_tile=16, cube_k=(256, 1024), cube_n=(64, 128), pass_settings=((_L1, -1, 4),)),
            # the down matmul has only 2048 / n outputs columns to spread over 24 cube cores
            TileConfig(**_MLP_TILES, down_cube_n=(64, 64), pass_settings=((_L1, -1, 4),)),
            TileConfig(
                **_MLP_TILES,
                down_cube_k=(128, 1024),
                down_cube_n=(128, 256),
                down_split_k=True,
                pass_settings=((_L1, -1, 4),),
            ),
            TileConfig(**_MLP_TILES, pass_settings=((_L1, -1, 16),)),
            TileConfig(**_MLP_TILES, pass_settings=((_L1, -1, 12),)),
            TileConfig(row_tile=16, cube_k=(128, 512), cube_n=(128, 512), pass_settings=((_L1, -1, 8),)),
        ],
    ),
    ("swiglu_mlp", "prefill", None): (
        [{"rows": 128}, {"rows": 700}],
        [
            TileConfig(row_tile=32, cube_m=32),
            TileConfig(
                row_tile=32, cube_m=32, cube_k=(128, 512), cube_n=(128, 256), pass_settings=((_L1, -1, 8),)
            ),
            TileConfig(
                row_tile=64, cube_m=64, cube_k=(128, 512), cube_n=(128, 256), pass_settings=((_L1, -1, 8),)
            ),
            # a cube task reads its weight tiles for cube_m rows: more rows a task, fewer weight re-reads;
            # the activation keeps 16-row vec tiles (64 fp32 rows x 512 overflow the UB)
            TileConfig(**_PREFILL_TILES, row_tile=64, cube_m=64, pass_settings=((_L1, -1, 8),)),
            TileConfig(**_PREFILL_TILES, row_tile=128, cube_m=128, pass_settings=((_L1, -1, 8),)),
            TileConfig(**_PREFILL_TILES, row_tile=128, cube_m=128, pass_settings=((_L1, -1, 16),)),
            TileConfig(**_PREFILL_TILES, row_tile=256, cube_m=128, pass_settings=((_L1, -1, 8),)),
            TileConfig(row_tile=256, cube_m=256, cube_k=(64, 256), cube_n=(64, 256), act_rows=16),
        ],
    ),
    ("mlp_block", "decode", None): (
        [{"rows": 1}, {"rows": 8}],
        [
            # as shipped before the budgets: gate/up 544 KiB of L1 (refused)
            TileConfig(
                **_BLOCK,
                **_MLP_BLOCK_MERGE,
                cube_k=(256, 1024),
                cube_n=(128, 256),
                down_cube_k=(256, 1024),
                down_cube_n=(128, 128),
                proj_cube_k=(256, 1024),
                proj_cube_n=(128, 128),
            ),
            TileConfig(**_BLOCK, **_MLP_BLOCK_MERGE, **_all_matmuls((256, 1024), (128, 128))),  # L0B full
            TileConfig(**_BLOCK, **_MLP_BLOCK_MERGE, **_all_matmuls((128, 1024), (128, 128))),  # L0B 32 KiB
            TileConfig(**_BLOCK, **_MLP_BLOCK_MERGE, **_all_matmuls((256, 1024), (64, 128))),  # L0B 32 KiB
            # gate/up (most of the weights) filling L0B, o_proj and down with room for a second tile; and back
            TileConfig(
                **_BLOCK,
                **_MLP_BLOCK_MERGE,
                **_all_matmuls((128, 1024), (128, 128)) | {"cube_k": (256, 1024)},
            ),
            TileConfig(
                **_BLOCK,
                **_MLP_BLOCK_MERGE,
                **_all_matmuls((256, 1024), (128, 128)) | {"cube_k": (128, 1024)},
            ),
            # whole-row L1 tiles: a task's weights in fewer, larger copies, and its stages over more cores
            TileConfig(**_BLOCK, **_MLP_BLOCK_WIDE),
            TileConfig(**_BLOCK, **_MLP_BLOCK_WIDE, act_cols=1024),
        ],
    ),
    # mlp_block for exactly 1 row (batch-1 decode, the OCR case) as a static 1-row kernel: its norm, SwiGLU
    # activation and residual tasks work on 1-row tiles, where the decode kernel's run over 8- and 16-row
    # ones (two 8-row norm tiles in one task) whatever the valid rows
    ("mlp_block", "one_row", None): (
        [{"rows": 1}],
        [
            TileConfig(
                **_ONE_ROW,
                **_MLP_BLOCK_MERGE,
                **_all_matmuls((256, 1024), (128, 128)) | {"cube_k": (128, 1024)},
            ),  # the decode entry's matmul tiles
            TileConfig(**_ONE_ROW, **_MLP_BLOCK_MERGE, **_all_matmuls((128, 1024), (128, 128))),  # L0B 32 KiB
            TileConfig(**_ONE_ROW, **_MLP_BLOCK_MERGE, **_all_matmuls((256, 1024), (128, 128))),  # L0B full
            TileConfig(
                **_ONE_ROW,
                **_MLP_BLOCK_MERGE,
                **_all_matmuls((256, 1024), (128, 128)) | {"cube_k": (128, 1024)},
                act_cols=1376,
            ),
            TileConfig(
                **_ONE_ROW,
                pass_settings=((_L1, -1, 4), (_L1, 0, 1)),
                **_all_matmuls((256, 1024), (128, 128)) | {"cube_k": (128, 1024)},
            ),
            TileConfig(
                **_ONE_ROW,
                pass_settings=((_L1, -1, 16), (_L1, 0, 1)),
                **_all_matmuls((256, 1024), (128, 128)) | {"cube_k": (128, 1024)},
            ),
            # a dynamic row axis of 1-row tiles (one kernel for every row count, each row a loop step)
            TileConfig(
                **_ONE_ROW | {"static": False}, **_MLP_BLOCK_MERGE, **_all_matmuls((128, 1024), (128, 128))
            ),
            TileConfig(**_ONE_ROW, **_MLP_BLOCK_WIDE),
            TileConfig(**_ONE_ROW, **_MLP_BLOCK_WIDE, act_cols=1024),
        ],
    ),
    ("attention_prologue", "decode", None): (
        [{"rows": 1}],
        [
            TileConfig(**_BLOCK, cube_k=(256, 1024), cube_n=(128, 128)),  # L0B full
            TileConfig(**_BLOCK, cube_k=(128, 1024), cube_n=(128, 128)),
            TileConfig(**_BLOCK, cube_k=(256, 1024), cube_n=(64, 128)),
        ],
    ),
    # the attention core at decode, 1 row, over a cache of 4 chunks (the merge runs) and of one chunk (none)
    ("attention_core", "decode", None): (
        [{"rows": 1, "context": 4096}],
        [
            TileConfig(**_CORE, cube_n=(512, 1024), down_cube_n=(128, 128)),  # a chunk's scores in 2 tasks
            TileConfig(**_CORE, cube_n=(256, 256), down_cube_n=(128, 128)),
            TileConfig(**_CORE, cube_n=(512, 1024), down_cube_n=(64, 64)),
            TileConfig(**_CORE | {"kv_chunk": 512}, cube_n=(512, 1024), down_cube_n=(128, 128)),
            TileConfig(**_CORE | {"kv_chunk": 2048}, cube_n=(512, 1024), down_cube_n=(128, 128)),
            TileConfig(**_CORE, cube_n=(128, 128), down_cube_n=(32, 32)),  # the one_chunk entry's tiles
        ],
    ),
    ("attention_core", "one_chunk", None): (
        [{"rows": 1, "context": 1024}],
        [
            TileConfig(**_CORE, cube_n=(512, 1024), down_cube_n=(128, 128)),  # the decode entry's
            TileConfig(**_CORE, cube_n=(128, 128), down_cube_n=(32, 32)),
            TileConfig(**_CORE, cube_n=(256, 256), down_cube_n=(32, 32)),
            TileConfig(**_CORE, cube_n=(128, 128), down_cube_n=(64, 64)),
            TileConfig(**_CORE, cube_n=(64, 64), down_cube_n=(32, 32)),
        ],
    ),
    ("linear", "decode", None): (
        [{"rows": 1, "in": 2048, "out": 2048}, {"rows": 1, "in": 2048, "out": 256}],
        [
            TileConfig(row_tile=16, cube_k=(256, 1024), cube_n=(128, 128)),  # L0B full
            TileConfig(row_tile=16, cube_k=(128, 1024), cube_n=(128, 128)),
            TileConfig(row_tile=16, cube_k=(256, 1024), cube_n=(64, 128)),
        ],
    ),
}


def _key(op: str, params: dict, config: TileConfig) -> str:
    # only the fields that differ from the defaults: a field added later leaves old keys valid
    default = asdict(TileConfig(row_tile=config.row_tile))
    changed = {k: v for k, v in asdict(config).items() if k == "row_tile" or v != default[k]}
    return json.dumps([op, params, changed], sort_keys=True)


def load() -> dict:
    """The cached results, keyed again from each entry's own op, shape and tiling."""
    stored = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    return {_key(e["op"], e["params"], TileConfig.from_dict(e["config"])): e for e in stored.values()}


def save(key: str, entry: dict) -> None:
    # re-read first: another search (another --op) may have added entries meanwhile
    results = load() | {key: entry}
    RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def best(results: dict, klass_key: tuple) -> list[tuple[float, str]]:
    """Candidates of one class that fit the buffers, ranked by the sum of their cycles over the class's
    shapes (all must be ok), a double-buffered one first unless it costs more than DOUBLE_BUFFER_MARGIN."""
    op = klass_key[0]
    shapes, configs = CANDIDATES[klass_key]
    ranked = []
    for config in configs:
        entries = [results.get(_key(op, p, config)) for p in shapes]
        if tile_budget.problems(op, config):
            continue
        if all(e and e.get("status") == "ok" for e in entries):
            cycles = sum(e["cycles"] for e in entries)
            weight = 1.0 if tile_budget.double_buffered(op, config) else DOUBLE_BUFFER_MARGIN
            ranked.append((cycles * weight, cycles, json.dumps(asdict(config))))
    return [(cycles, config) for _, cycles, config in sorted(ranked)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=sorted({klass[0] for klass in CANDIDATES}))
    parser.add_argument("--timeout", type=int, default=600, help="seconds per simulated kernel")
    parser.add_argument("--max-new", type=int, default=100, help="simulate at most this many new candidates")
    parser.add_argument("--candidates", help="only these candidate indexes of each class, e.g. 6,7")
    args = parser.parse_args()
    results = load()
    soc = bench_sim.soc_config()
    new = 0
    for klass_key, (shapes, configs) in CANDIDATES.items():
        op = klass_key[0]
        if args.op and op != args.op:
            continue
        picked = {int(i) for i in args.candidates.split(",")} if args.candidates else None
        for index, config in enumerate(configs):
            if picked is not None and index not in picked:
                continue
            over = tile_budget.problems(op, config)
            if over:
                print(op, klass_key, f"candidate {index} refused, over the buffers:", "; ".join(over))
                continue
            for params in shapes:
                key = _key(op, params, config)
                if key in results or new >= args.max_new:
                    continue
                entry = bench_sim.with_roofline(
                    bench_sim.run_sim(op, params, args.timeout, asdict(config)), soc
                )
                results[key] = entry | {"config": asdict(config), "class": list(klass_key)}
                save(key, results[key])
                new += 1
                print(
                    op,
                    klass_key,
                    params,
                    asdict(config),
                    entry.get("cycles", entry.get("reason")),
                    flush=True,
                )
        for cycles, config in best(results, klass_key)[:3]:
            print(f"best {klass_key}: {cycles:.0f} cycles  {config}")


if __name__ == "__main__":
    main()
