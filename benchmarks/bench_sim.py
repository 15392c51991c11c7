"""PyPTO cost-model benchmark of the pypto kernels: simulated time and roofline ratio per shape.

    python benchmarks/bench_sim.py [--json out.json] [--quick] [--timeout S] [--only OP]

PyPTO's SIM mode (no NPU needed) models a whole Ascend 910B chip, not one core: its config
(lib/configs/A2A3.ini of the installed pypto) gives 24 cube and 48 vector cores. These numbers are the
cost model's estimates for a 910B, not hardware measurements.

Each kernel is built with the tiling the kernel package would pick (tile_table.py), compiled and
simulated once in its own subprocess with a time limit. Reported per shape:
- cycles: simulated AICore time, last task end minus first task start in `_simulate.swim.json`
  (the same span pypto prints as "AICore End-to-End Time", which it omits past ~500k cycles);
- us: cycles / 1800, the conversion pypto's own swim-lane tool uses;
- floor: the minimum bytes the kernel must move (inputs, weights and outputs once) at the bandwidth
  the model's config implies, ddr_rate x ai_core_cnt bytes a cycle (x cube_freq: about 1.42 TB/s);
- ratio: cycles / floor cycles (the roofline ratio; 1.0 is at the bandwidth floor);
- roof: cycles over the higher of that floor and the compute floor, the matmuls' multiply-accumulates
  at cube_core_cnt x (cube_m_size x cube_k_size x cube_n_size) a cycle: a prefill MLP of hundreds of
  tokens is bound by the cube, and its bandwidth ratio alone would overstate how far it is from best;
- longest, spread, copy-in: the longest task's cycles, the cycles between the first and the last task
  start, and the most serial copies from global memory in one task. In this model each copy waits a
  fixed ~1,400 cycles however little it moves, and tasks start about 200 cycles apart in pairs, so a
  small kernel's time is about spread + longest, and longest is at least copy-in x ~1,400 + ~360 (the
  copy out): a decode RMSNorm (x and the weight: 2 copies) cannot go below ~3,200 cycles (1.8 us).
Targets (issue 9): MLP <= 1.3x at decode, RMSNorm and MRoPE <= 2 us at decode and <= 1.5x at prefill.

Decoder-layer blocks (issue 19), at decode: residual add + RMSNorm <= 2 us; mlp_block (o_proj, residual,
RMSNorm, SiLU MLP, residual) <= 1.2x its floor; attention_prologue (RMSNorm, q/k/v projections with biases,
MRoPE) <= 1.5x (out of this model's reach for any kernel with a vector stage after its matmuls:
benchmarks/prologue_bound.py). The `decoder_layer` rows add up the spans of everything a layer launches except the
attention core, run back to back (so each kernel's start-up counts once per kernel): `per_op` is rms_norm
x2, mrope, swiglu_mlp and the q, k, v and o projections as plain matmul kernels (`linear`, bias-free);
`fused` is attention_prologue + mlp_block. Both are judged against the layer's weight floor (q/k/v, o and
the MLP: about 200,700 cycles); the fused layer's target is <= 1.3x.

buffers: the most L1 and L0B (KiB) any of the kernel's matmul tiles take by PyPTO's documented formulas
(pto_kernels/tiling/tile_budget.py; an A2 core has 512 and 64), and "OVER" where a tile breaks a budget: the cost
model simulates such a tiling all the same, a device does not compile it.
"""

import argparse
import configparser
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))

SIM_TIMEOUT_S = 300
US_PER_CYCLE = 1 / 1800  # pypto's swim-lane tool: --time_convert_denominator=1800
BF16_BYTES = 2

# GutenOCR-3B: text hidden 2048, MLP 11008, 16 q / 2 kv heads of 128, mrope_section [16, 24, 24]; vision 1280
TEXT, VISION, INTER, Q_HEADS, K_HEADS, HEAD_DIM, SECTIONS = 2048, 1280, 11008, 16, 2, 128, (16, 24, 24)
DECODE_ROWS = (1, 4, 8, 16)
PREFILL_ROWS = (128, 700, 2048)
KV_WIDTH = K_HEADS * HEAD_DIM
QUICK = [("rms_norm", {"rows": 1, "width": TEXT}), ("mrope", {"rows": 1}), ("swiglu_mlp", {"rows": 1})]
BLOCKS = ("residual_rms_norm", "mlp_block", "attention_prologue")
# the attention core at decode: 1 new row a sequence, batch 1, over a static cache this long (positions)
CORE_CONTEXTS = (1024, 4096)
# a decoder layer's kernels apart from the attention core, per op and as fused blocks: (op, params
# other than rows); each `linear` is one of the layer's projections, (out, in)
LAYER_KERNELS = {
    "per_op": [
        ("rms_norm", {"width": TEXT}),
        ("linear", {"out": Q_HEADS * HEAD_DIM, "in": TEXT}),
        ("linear", {"out": KV_WIDTH, "in": TEXT}),
        ("linear", {"out": KV_WIDTH, "in": TEXT}),
        ("mrope", {}),
        ("linear", {"out": TEXT, "in": Q_HEADS * HEAD_DIM}),
        ("rms_norm", {"width": TEXT}),
        ("swiglu_mlp", {}),
    ],
    "fused": [("attention_prologue", {}), ("mlp_block", {})],
}
TARGETS = {  # (shape class, op) -> (what, limit)
    ("decode", "swiglu_mlp"): ("ratio", 1.3),
    ("decode", "residual_rms_norm"): ("us", 2.0),
    ("decode", "mlp_block"): ("ratio", 1.2),
    ("decode", "attention_prologue"): ("ratio", 1.5),
    ("decode", "decoder_layer/fused"): ("ratio", 1.3),
    ("decode", "attention_core"): ("ratio", 1.5),
    ("decode", "rms_norm"): ("us", 2.0),
    ("decode", "mrope"): ("us", 2.0),
    ("prefill", "rms_norm"): ("ratio", 1.5),
    ("prefill", "mrope"): ("ratio", 1.5),
}


def shapes() -> list[tuple[str, dict]]:
    rows = DECODE_ROWS + PREFILL_ROWS
    out = [("rms_norm", {"rows": r, "width": TEXT}) for r in rows]
    out.append(("rms_norm", {"rows": 2500, "width": VISION}))
    out += [("mrope", {"rows": r}) for r in rows]
    out += [("swiglu_mlp", {"rows": r}) for r in rows]
    return out


def block_shapes(rows=DECODE_ROWS) -> list[tuple[str, dict]]:
    """The decoder-layer blocks and the kernels of both decoder-layer variants, each once, at decode."""
    out = []
    for r in rows:
        out.append(("residual_rms_norm", {"rows": r, "width": TEXT}))
        for op, params in LAYER_KERNELS["fused"] + LAYER_KERNELS["per_op"]:
            if (op, {"rows": r} | params) not in out:
                out.append((op, {"rows": r} | params))
    return out


def core_shapes(contexts=CORE_CONTEXTS, rows=(1,)) -> list[tuple[str, dict]]:
    """The attention core at decode (batch 1, GutenOCR-3B's heads) over static caches of `contexts`."""
    return [("attention_core", {"rows": r, "context": c}) for c in contexts for r in rows]


def layer_entries(entries: list[dict], soc: dict) -> list[dict]:
    """A `decoder_layer` entry per variant and row count whose kernels all simulated: their spans summed."""
    by_kernel = {(e["op"], json.dumps(e["params"], sort_keys=True)): e for e in entries}
    out = []
    for rows in sorted({e["params"]["rows"] for e in entries}):
        for variant, kernels in LAYER_KERNELS.items():
            parts = [by_kernel.get((op, json.dumps({"rows": rows} | p, sort_keys=True))) for op, p in kernels]
            if any(part is None for part in parts):
                continue
            entry = {"op": f"decoder_layer/{variant}", "params": {"rows": rows}, "dtype": "bfloat16"}
            missing = [part["op"] for part in parts if part["status"] != "ok"]
            if missing:
                entry |= {"status": "not available", "reason": f"not simulated: {', '.join(missing)}"}
            else:
                cycles = sum(part["cycles"] for part in parts)
                entry |= {
                    "status": "ok",
                    "cycles": cycles,
                    "us": cycles * US_PER_CYCLE,
                    "tasks": sum(part["tasks"] for part in parts),
                    "kernels": len(parts),
                    "wall_s": sum(part.get("wall_s", 0.0) for part in parts),
                }
            out.append(with_roofline(entry, soc))
    return out


def soc_config() -> dict:
    """The bandwidth and frequency figures of the installed pypto's A2A3.ini (the model's own config)."""
    spec = importlib.util.find_spec("pypto")
    path = Path(spec.origin).parent / "lib" / "configs" / "A2A3.ini"
    ini = configparser.ConfigParser(strict=False, interpolation=None)
    ini.read(path)
    return {
        "path": str(path),
        "soc_version": ini["version"]["SoC_version"],
        "ddr_rate_bytes_per_cycle": int(ini["AICoreMemoryRates"]["ddr_rate"]),
        "ai_core_cnt": int(ini["SoCInfo"]["ai_core_cnt"]),
        "vector_core_cnt": int(ini["SoCInfo"]["vector_core_cnt"]),
        "cube_freq_mhz": int(ini["AICoreSpec"]["cube_freq"]),
        "cube_core_cnt": int(ini["SoCInfo"]["cube_core_cnt"]),
        # one cube core's multiply-accumulates a cycle: an m x k x n block (16 x 16 x 16 for bf16)
        "cube_macs_per_cycle": int(ini["AICoreSpec"]["cube_m_size"])
        * int(ini["AICoreSpec"]["cube_k_size"])
        * int(ini["AICoreSpec"]["cube_n_size"]),
    }


def _weight_elements(op: str, params: dict) -> int:
    """Weight matrix elements a kernel streams (its matmuls' multiply-accumulates per row)."""
    mlp, qkv, o_proj = 3 * TEXT * INTER, TEXT * (Q_HEADS * HEAD_DIM + 2 * KV_WIDTH), Q_HEADS * HEAD_DIM * TEXT
    return {
        "swiglu_mlp": mlp,
        "mlp_block": o_proj + mlp,
        "attention_prologue": qkv,
        "prologue_bound": qkv,  # judged against the prologue's floor (benchmarks/prologue_bound.py)
        "attention_prologue_cached": qkv,
        "linear": params.get("out", 0) * params.get("in", 0),
        "decoder_layer/per_op": qkv + o_proj + mlp,
        "decoder_layer/fused": qkv + o_proj + mlp,
    }.get(op, 0)


def matmul_macs(op: str, params: dict) -> int:
    """Multiply-accumulates of the kernel's matmuls (the MLP's gate, up and down projections, ...)."""
    return params["rows"] * _weight_elements(op, params)


def min_bytes(op: str, params: dict) -> int:
    """Bytes a kernel must move at least: every input, weight and output once (bf16)."""
    rows = params["rows"]
    if (
        op == "attention_core"
    ):  # the K and V of every used cache position of every sequence (the floor the issue names): q, out aside
        used = params.get("used", params["context"])
        return BF16_BYTES * 2 * K_HEADS * HEAD_DIM * used * params.get("batch", 1)
    if op == "kv_cache_write":  # the new rows in, the same rows written into the cache
        return BF16_BYTES * 2 * K_HEADS * rows * HEAD_DIM
    if op == "rms_norm":
        return BF16_BYTES * (2 * rows * params["width"] + params["width"])
    if op == "residual_rms_norm":  # x, residual in; normed, sum out; the weight
        return BF16_BYTES * (4 * rows * params["width"] + params["width"])
    if op == "mrope":
        # the kernel reads section-mixed tables (mixed once per forward, not per layer)
        return BF16_BYTES * (2 * rows * (Q_HEADS + K_HEADS) * HEAD_DIM + 2 * rows * HEAD_DIM)
    weights = _weight_elements(op, params)
    if op == "linear":
        return BF16_BYTES * (weights + rows * (params["in"] + params["out"]))
    if op == "mlp_block":  # residual, attention output in; out; the norm weight
        return BF16_BYTES * (weights + 3 * rows * TEXT + TEXT)
    # x, mixed cos/sin in; q, k, v out (into the cache: the same bytes); the norm weight, the biases
    if op in ("attention_prologue", "prologue_bound", "attention_prologue_cached"):
        qkv_width = Q_HEADS * HEAD_DIM + 2 * KV_WIDTH
        return BF16_BYTES * (weights + rows * (TEXT + 2 * HEAD_DIM + qkv_width) + TEXT + qkv_width)
    if op.startswith("decoder_layer/"):  # the layer's weights (the floor the issue names), its input once
        return BF16_BYTES * (weights + 2 * rows * TEXT)
    return BF16_BYTES * (weights + 2 * rows * TEXT)


# --- in the subprocess -------------------------------------------------------------------------------


def _sim_child(request: str) -> None:
    """Build one kernel in SIM mode with the table's tiling (or the one given) and call it once."""
    from pto_kernels.backends import pypto_ops
    from pto_kernels.tiling.tile_table import TileConfig

    op, params, config = json.loads(request)
    bf16, rows = torch.bfloat16, params["rows"]
    if config is None:
        config = _table_config(op, params)
    else:
        config = TileConfig.from_dict(config)
    if op == "rms_norm":
        width = _width(op, params)
        kernel = pypto_ops._build_rms_norm(rows, width, bf16, 1e-6, config, "sim")
        x = torch.randn(rows, width, dtype=bf16)
        kernel(x, torch.ones(1, width, dtype=bf16), torch.empty_like(x))
    elif op == "mrope":
        kernel = pypto_ops._build_mrope(rows, Q_HEADS, K_HEADS, HEAD_DIM, bf16, bf16, config, "sim")
        q = torch.randn(rows, Q_HEADS * HEAD_DIM, dtype=bf16)
        k = torch.randn(rows, K_HEADS * HEAD_DIM, dtype=bf16)
        cos = torch.randn(rows, HEAD_DIM, dtype=bf16)
        kernel(q, k, cos, cos.clone(), torch.empty_like(q), torch.empty_like(k))
    elif op == "swiglu_mlp":
        kernel = pypto_ops._build_swiglu_mlp(rows, TEXT, INTER, bf16, config, "sim")
        x = torch.randn(rows, TEXT, dtype=bf16)
        gate, up = torch.randn(INTER, TEXT, dtype=bf16), torch.randn(INTER, TEXT, dtype=bf16)
        kernel(x, gate, up, torch.randn(TEXT, INTER, dtype=bf16), torch.empty_like(x))
    elif op in BLOCKS or op in ("linear", "attention_prologue_cached"):
        _sim_block(op, params, config)
    elif op == "attention_core":
        _sim_core(params, config)
    elif op == "kv_cache_write":
        _sim_cache_write(params)
    elif "probe" in params:  # another benchmark's kernel (prologue_bound.py's): its module's sim_probe
        importlib.import_module(params["probe"]).sim_probe(params, config)
    else:
        raise ValueError(op)


def _width(op: str, params: dict) -> int:
    """The width a kernel's tiling is looked up by: the normalised width, head_dim, else the hidden size."""
    return {"rms_norm": params.get("width", TEXT), "mrope": HEAD_DIM, "attention_core": HEAD_DIM}.get(
        op, TEXT
    )


def _table_config(op: str, params: dict):
    """The TileConfig the kernel package picks for this call (the attention core's depends on its cache);
    None for the cache-write proxy, which sets its own."""
    from pto_kernels.tiling.tile_table import attention_core_config, tile_config

    width = _width(op, params)
    if op in ("prologue_bound", "attention_prologue_cached"):  # attention_prologue's tiling
        op = "attention_prologue"
    if op == "attention_core":
        return attention_core_config(params["rows"], width, params["context"])[1]
    if op == "kv_cache_write":  # no tiling of the package's: the kernel sets its own
        return None
    return tile_config(op, params["rows"], width)[1]


def _sim_block(op: str, params: dict, config) -> None:
    from pto_kernels.backends import pypto_blocks, pypto_prologue

    bf16, rows, eps = torch.bfloat16, params["rows"], 1e-6
    x = torch.randn(rows, TEXT, dtype=bf16)
    norm_w = torch.ones(1, TEXT, dtype=bf16)
    if op == "residual_rms_norm":
        kernel = pypto_blocks._build_residual_rms_norm(rows, TEXT, bf16, eps, config, "sim")
        kernel(x, torch.randn_like(x), norm_w, torch.empty_like(x), torch.empty_like(x))
    elif op == "linear":
        kernel = pypto_blocks._build_linear(rows, params["in"], params["out"], bf16, config, "sim")
        x = torch.randn(rows, params["in"], dtype=bf16)
        kernel(
            x,
            torch.randn(params["out"], params["in"], dtype=bf16),
            torch.empty(rows, params["out"], dtype=bf16),
        )
    elif op == "mlp_block":
        attn_width = Q_HEADS * HEAD_DIM
        kernel = pypto_blocks._build_mlp_block(rows, TEXT, attn_width, INTER, bf16, eps, config, "sim")
        o_w, gate, up = (
            torch.randn(*shape, dtype=bf16) for shape in ((TEXT, attn_width), (INTER, TEXT), (INTER, TEXT))
        )
        down = torch.randn(TEXT, INTER, dtype=bf16)
        kernel(
            x,
            torch.randn(rows, attn_width, dtype=bf16),
            o_w,
            norm_w,
            gate,
            up,
            down,
            torch.empty_like(x),
            torch.empty_like(x),
            torch.empty_like(x),
        )
    elif op == "attention_prologue_cached":  # a row a sequence; k, v into the cache at a position read inside
        context, q_width = params["context"], Q_HEADS * HEAD_DIM
        kernel = pypto_prologue._build_attention_prologue_cached(
            rows, TEXT, Q_HEADS, K_HEADS, HEAD_DIM, context, bf16, bf16, eps, config, "sim", advance=True
        )  # as transformers 5.8+ runs it: the layer's length advanced in the kernel
        weights = [torch.randn(n, TEXT, dtype=bf16) for n in (q_width, KV_WIDTH, KV_WIDTH)]
        biases = [torch.randn(1, n, dtype=bf16) for n in (q_width, KV_WIDTH, KV_WIDTH)]
        cos = torch.randn(rows, HEAD_DIM, dtype=bf16)
        position = torch.tensor([context - 1]).view(torch.int32).reshape(1, 2)
        caches = [torch.zeros(rows, K_HEADS * context * HEAD_DIM, dtype=bf16) for _ in "kv"]
        kernel(
            x, weights[0], biases[0], weights[1], biases[1], weights[2], biases[2], cos, cos.clone(),
            position, *caches, torch.empty(rows, q_width, dtype=bf16), position,
        )  # fmt: skip
    else:
        kernel = pypto_prologue._build_attention_prologue(
            rows, TEXT, Q_HEADS, K_HEADS, HEAD_DIM, bf16, bf16, eps, config, "sim"
        )
        q_width = Q_HEADS * HEAD_DIM
        weights = [torch.randn(n, TEXT, dtype=bf16) for n in (q_width, KV_WIDTH, KV_WIDTH)]
        biases = [torch.randn(1, n, dtype=bf16) for n in (q_width, KV_WIDTH, KV_WIDTH)]
        cos = torch.randn(rows, HEAD_DIM, dtype=bf16)
        outs = [torch.empty(rows, n, dtype=bf16) for n in (q_width, KV_WIDTH, KV_WIDTH)]
        kernel(  # the weights stand for ones with the norm weight folded in
            x,
            weights[0],
            biases[0],
            weights[1],
            biases[1],
            weights[2],
            biases[2],
            cos,
            cos.clone(),
            *outs,
        )


def _sim_core(params: dict, config) -> None:
    """The attention core over a static cache of `context` positions, `batch` sequences (default 1) each
    `used` positions long (default: the whole cache): the kernel runs the chunks the lengths touch."""
    from pto_kernels.backends import pypto_attention

    bf16, rows, context = torch.bfloat16, params["rows"], params["context"]
    batch, used = params.get("batch", 1), params.get("used", context)
    group = Q_HEADS // K_HEADS
    kernel = pypto_attention._build_attention_core(
        batch, K_HEADS, group, rows, context, HEAD_DIM, bf16, HEAD_DIM**-0.5, config, "sim"
    )
    chunk = pypto_attention.chunk_width(config, context, batch * K_HEADS)
    q = torch.randn(batch * K_HEADS * group * rows, HEAD_DIM, dtype=bf16)
    cache = torch.randn(batch * K_HEADS * context, HEAD_DIM, dtype=bf16)
    lengths, starts = torch.full((batch,), used), torch.zeros(batch, dtype=torch.int64)
    bias = pypto_attention.mask_bias(lengths, group, rows, context)
    spans = pypto_attention.chunk_spans(starts, lengths, chunk, context)
    ml, acc = pypto_attention.neutral_partials(q.shape[0], -(-context // chunk), HEAD_DIM, "cpu")
    kernel(q, cache, cache.clone(), bias, spans, torch.empty_like(q), ml, acc)


def _sim_cache_write(params: dict) -> None:
    """Not a kernel of the package: one static cache's write of a decode step's new rows (each kv head's row
    at a position read from an int32 tensor inside the kernel), what each of transformers' two `index_copy_`
    a layer does; simulated as the span of a small kernel of that kind (bench_decode_projection.py)."""
    from pto_kernels.backends import pypto_runtime
    from pto_kernels.tiling.tile_table import TileConfig

    pypto, bf16 = pypto_runtime.pypto_module(), pypto_runtime.pypto_dtype(torch.bfloat16)
    rows, context = params["rows"], params["context"]

    @pypto_runtime.jit("sim", TileConfig(row_tile=rows))
    def cache_write_kernel(
        new: pypto.Tensor([K_HEADS * rows, HEAD_DIM], bf16),
        position: pypto.Tensor([1, 1], pypto.DT_INT32),
        cache: pypto.Tensor([K_HEADS * context, HEAD_DIM], bf16),
    ):
        pypto.set_vec_tile_shapes(rows, HEAD_DIM)
        for _ in pypto.loop(1):
            first = position[0, 0]  # a value read from the tensor inside the kernel
            for head in range(K_HEADS):
                row = pypto.add(pypto.view(new, [rows, HEAD_DIM], [head * rows, 0]), 0.0)
                pypto.assemble(row, [head * context + first, 0], cache)

    cache_write_kernel(
        torch.randn(K_HEADS * rows, HEAD_DIM, dtype=torch.bfloat16),
        torch.tensor([[context - rows]], dtype=torch.int32),
        torch.zeros(K_HEADS * context, HEAD_DIM, dtype=torch.bfloat16),
    )


# --- reading pypto's reports -------------------------------------------------------------------------


def _report_number(text: str, label: str) -> float | None:
    import re

    match = re.search(rf"^\s*(?:\|--)?{re.escape(label)}[.\s]*:\s*([0-9.]+)", text, re.MULTILINE)
    return float(match.group(1)) if match else None


def aicore_tasks(swim: Path) -> list[dict]:
    """The AICore tasks (cube and vector lanes) of a `_simulate.swim.json`, read once per kernel."""
    return [
        task
        for lane in json.loads(swim.read_text())
        if lane.get("coreType") in ("AIC", "AIV")  # as pypto's tool: AICPU "HUB" tasks are not AICore time
        for task in lane.get("tasks", [])
        if task.get("execEnd", 0) >= task.get("execStart", 0)
    ]


def swim_span(tasks: list[dict]) -> tuple[int, int] | None:
    """(cycles from first task start to last task end, tasks)."""
    if not tasks:
        return None
    return max(t["execEnd"] for t in tasks) - min(t["execStart"] for t in tasks), len(tasks)


def fixed_costs(tasks: list[dict], pipes: Path) -> dict | None:
    """Where a small kernel's time goes: its longest task, how far apart the first and last task start
    (the runtime hands tasks to cores a few at a time), and per task the serial copies from global
    memory (`COPY_IN` on one MTE_IN pipe, each with a fixed latency however few bytes it moves)."""
    import re
    import statistics

    if not tasks:
        return None
    copies: dict[tuple, int] = {}
    latencies = []
    for lane in json.loads(pipes.read_text()) if pipes.exists() else []:
        for op in lane.get("pipeLogs", {}).get("MTE_IN", []):
            if " COPY_IN " not in op.get("tileOp", ""):
                continue
            task = re.search(r"[Tt][Aa][Ss][Kk]\[(\d+)\]", op["tileOp"])
            key = (lane.get("blockIdx"), task.group(1) if task else None)
            copies[key] = copies.get(key, 0) + 1
            latencies.append(op["execEnd"] - op["execStart"])
    starts = [t["execStart"] for t in tasks]
    return {
        "longest_task": max(t["execEnd"] - t["execStart"] for t in tasks),
        "dispatch_spread": max(starts) - min(starts),
        "copy_ins_per_task": max(copies.values(), default=0),
        "copy_in_cycles_median": statistics.median(latencies) if latencies else None,
    }


def buffer_use(op: str, params: dict, config: dict | None = None) -> dict | None:
    """The most L1 and L0B bytes the kernel's matmul tiles take, and whether all fit (None: no matmul)."""
    from pto_kernels.tiling import tile_budget
    from pto_kernels.tiling.tile_table import TileConfig

    config = _table_config(op, params) if config is None else TileConfig.from_dict(config)
    if config is None:  # the cache-write proxy: no matmul
        return None
    tiles = tile_budget.cube_tiles(op, config)
    if not tiles:
        return None
    used = [tile_budget.footprint(t, BF16_BYTES) for t in tiles]
    return {
        "l1_kib": max(u["l1"] for u in used) // 1024,
        "l0b_kib": max(u["l0b"] for u in used) // 1024,
        "fits": not tile_budget.problems(op, config),
    }


def _last_error_line(text: str) -> str:
    import re

    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.search(r"error|Error|ERROR|not found|Errcode", ln)]
    return (errors or lines or ["(no output)"])[-1][:300]


def run_sim(op: str, params: dict, timeout_s: int, config: dict | None = None) -> dict:
    """Simulate one kernel in a subprocess; the entry says `status` ok or not available, and why."""
    entry = {"op": op, "params": params, "dtype": "bfloat16"}
    with tempfile.TemporaryDirectory(prefix="pto_sim_") as tmp:
        env = dict(os.environ, TILE_FWK_OUTPUT_DIR=tmp)
        env.pop("ASCEND_HOME_PATH", None)  # without CANN pypto must stay in SIM mode
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, __file__, "--sim-child", json.dumps([op, params, config])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,  # its own process group: a timeout also ends pypto's g++ children
        )
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return entry | {"status": "not available", "reason": f"SIM did not finish in {timeout_s} s"}
        entry["wall_s"] = round(time.perf_counter() - start, 1)
        if proc.returncode != 0:
            return entry | {
                "status": "not available",
                "reason": f"exit {proc.returncode}: {_last_error_line(output)}",
            }
        out_dirs = sorted(Path(tmp).glob("*/CostModelSimulationOutput"))
        swim = out_dirs[-1] / "_simulate.swim.json" if out_dirs else None
        tasks = aicore_tasks(swim) if swim and swim.exists() else []
        span = swim_span(tasks)
        if span is None:
            return entry | {
                "status": "not available",
                "reason": "no swim-lane data: " + _last_error_line(output),
            }
        report = out_dirs[-1] / "_simulate.stat.report.txt"
        report_text = report.read_text() if report.exists() else ""
        entry |= fixed_costs(tasks, out_dirs[-1] / "_simulate.pipe.swim.json") or {}
        entry |= {
            "status": "ok",
            "cycles": span[0],
            "tasks": span[1],
            "us": span[0] * US_PER_CYCLE,
            "stdout_us": _report_number(output, "AICore End-to-End Time"),  # absent past ~500k cycles
            "total_cycles": _report_number(report_text, "Total Cycles"),  # includes AICPU start-up
        }
    return entry


def with_roofline(entry: dict, soc: dict) -> dict:
    bytes_per_cycle = soc["ddr_rate_bytes_per_cycle"] * soc["ai_core_cnt"]
    moved = min_bytes(entry["op"], entry["params"])
    floor_cycles = moved / bytes_per_cycle
    entry = entry | {
        "min_bytes": moved,
        "floor_cycles": round(floor_cycles, 1),
        "floor_us": floor_cycles / soc["cube_freq_mhz"],
    }
    macs = matmul_macs(entry["op"], entry["params"])
    if macs and "cube_macs_per_cycle" in soc:
        entry["compute_floor_cycles"] = round(macs / (soc["cube_macs_per_cycle"] * soc["cube_core_cnt"]), 1)
    if entry["status"] == "ok":
        entry["ratio"] = entry["cycles"] / floor_cycles
        # against the higher of the two floors: a long prefill MLP is bound by the cube, not by bandwidth
        entry["roofline_ratio"] = entry["cycles"] / max(floor_cycles, entry.get("compute_floor_cycles", 0))
    klass = "decode" if entry["params"]["rows"] <= 16 else "prefill"
    if entry["op"] == "residual_rms_norm" and entry["params"]["rows"] > 1:
        klass = "decode, more than 1 row"  # its target is for 1 row
    target = TARGETS.get((klass, entry["op"]))
    if target and entry["status"] == "ok":
        what, limit = target
        entry["target"] = f"{what} <= {limit}"
        entry["target_met"] = entry[what] <= limit
    return entry


def _label(entry: dict) -> str:
    p = entry["params"]
    if entry["op"] == "rms_norm":
        return f"rms_norm {p['rows']}x{p['width']}"
    if entry["op"] == "mrope":
        return f"mrope {p['rows']} rows 16+2 heads x128"
    if entry["op"] == "residual_rms_norm":
        return f"residual_rms_norm {p['rows']}x{p['width']}"
    if entry["op"] == "linear":
        return f"linear {p['rows']} tok {p['in']}-{p['out']}"
    if entry["op"] == "attention_core":
        batch = f" b{p['batch']}" if p.get("batch", 1) != 1 else ""
        used = f" used {p['used']}" if p.get("used", p["context"]) != p["context"] else ""
        return f"attention_core {p['rows']} row ctx {p['context']}{batch}{used}"
    if entry["op"] in ("mlp_block", "attention_prologue"):
        return f"{entry['op']} {p['rows']} tok"
    if entry["op"].startswith("decoder_layer/"):
        return f"{entry['op']} {p['rows']} tok ({entry.get('kernels', '?')} k)"
    return f"swiglu_mlp {p['rows']} tok 2048-11008"


def print_table(entries: list[dict], soc: dict) -> None:
    gbps = soc["ddr_rate_bytes_per_cycle"] * soc["ai_core_cnt"] * soc["cube_freq_mhz"] / 1e3
    print(
        f"PyPTO cost-model estimates for an {soc['soc_version']} (whole chip: {soc['ai_core_cnt']} cube,"
        f" {soc['vector_core_cnt']} vector cores), bf16; not hardware measurements."
        f" Floor: {soc['ddr_rate_bytes_per_cycle']} B x {soc['ai_core_cnt']} cores x"
        f" {soc['cube_freq_mhz']} MHz = {gbps:.0f} GB/s"
    )
    print(
        f"{'kernel':<34} {'cycles':>9} {'us':>8} {'floor us':>9} {'ratio':>6} {'roof':>5} {'tasks':>6}"
        f" {'longest':>8} {'spread':>7} {'copy-in':>7} {'target':>11} {'met':>4} {'wall s':>7}"
        f" {'L1/L0B KiB':>13}"
    )
    for e in entries:
        if e["status"] != "ok":
            print(f"{_label(e):<34} not available: {e['reason']}")
            continue
        met = "" if "target_met" not in e else ("yes" if e["target_met"] else "NO")
        print(
            f"{_label(e):<34} {e['cycles']:>9} {e['us']:>8.2f} {e['floor_us']:>9.2f} {e['ratio']:>6.2f}"
            f" {e['roofline_ratio']:>5.2f} {e['tasks']:>6} {e.get('longest_task', ''):>8} {e.get('dispatch_spread', ''):>7}"
            f" {e.get('copy_ins_per_task', ''):>7} {e.get('target', ''):>11} {met:>4} {e['wall_s']:>7.1f}"
            f" {_buffers(e):>13}"
        )


def _buffers(entry: dict) -> str:
    use = entry.get("buffers")
    if not use:
        return ""
    return f"{use['l1_kib']}/{use['l0b_kib']}" + ("" if use["fits"] else " OVER")


def sim_entries(kernels: list[tuple[str, dict]], timeout_s: int) -> list[dict]:
    if importlib.util.find_spec("pypto") is None:
        return [
            {"op": op, "params": p, "status": "not available", "reason": "pypto not installed (extra `pto`)"}
            for op, p in kernels
        ]
    soc = soc_config()
    entries = [with_roofline(run_sim(op, params, timeout_s), soc) for op, params in kernels]
    for entry in entries:
        entry["buffers"] = buffer_use(entry["op"], entry["params"])
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument("--quick", action="store_true", help="one decode shape per op (a smoke run)")
    parser.add_argument(
        "--only",
        choices=["rms_norm", "mrope", "swiglu_mlp", *BLOCKS, "linear", "attention_core"],
        help="one op only",
    )
    parser.add_argument(
        "--blocks",
        action="store_true",
        help="the decoder-layer blocks and the per-op / fused decoder-layer rows, at decode",
    )
    parser.add_argument(
        "--core", action="store_true", help="the attention core at decode over 1,024 and 4,096 positions"
    )
    parser.add_argument("--timeout", type=int, default=SIM_TIMEOUT_S, help="seconds per kernel")
    parser.add_argument("--rows", help="only these row counts, comma-separated (e.g. 1,4,8,16)")
    parser.add_argument("--sim-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sim_child:
        _sim_child(args.sim_child)
        return
    kernels = (
        QUICK if args.quick else block_shapes() if args.blocks else core_shapes() if args.core else shapes()
    )
    if args.only:
        kernels = [k for k in kernels if k[0] == args.only]
    if args.rows:
        wanted = {int(r) for r in args.rows.split(",")}
        kernels = [k for k in kernels if k[1]["rows"] in wanted]
    entries = sim_entries(kernels, args.timeout)
    soc = soc_config() if importlib.util.find_spec("pypto") else None
    if soc and args.blocks:
        entries += layer_entries(entries, soc)
    if soc:
        print_table(entries, soc)
    if args.json:
        from pto_kernels.tiling.tile_table import BLOCK_TILE_TABLE, TILE_TABLE

        tables = TILE_TABLE | BLOCK_TILE_TABLE
        table = {"/".join(str(p) for p in key): asdict(config) for key, config in tables.items()}
        doc = {"soc": soc, "tile_table": table, "kernels": entries}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
