"""Run the PyPTO decoder-layer block kernels on the CPU verify interpreter; save their inputs and outputs.

Invoked by test_kernels_pypto_blocks.py in a subprocess (a g++ failure inside pypto exits the process).
Usage: python pypto_blocks_runner.py OUT.pt

Every case calls the PyPTO modules' entry directly (no dispatch, so no torch fallback can stand in for a
kernel) on NaN-poisoned outputs. A `sabotaged` case runs the kernel on deliberately wrong inputs (a wrong
weight, gate and up swapped, sections or tables swapped); the test compares its output with the reference
of the right inputs and expects the comparison to fail.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))

import torch  # noqa: E402
from pto_kernels.backends import pypto, pypto_blocks, pypto_prologue, pypto_runtime  # noqa: E402
from pto_kernels.tiling.tile_table import tile_config  # noqa: E402

HIDDEN, INTER, Q_HEADS, K_HEADS, EPS = 64, 128, 4, 2, 1e-6
# head_dim / 2 must fill whole 32-byte blocks: 16 fp32 or 32 bf16 values a head
HEADS = {"float32": (16, [2, 3, 3]), "bfloat16": (32, [4, 6, 6])}
# (batch, seq): decode (1 row), a few rows (6), prefill (19 rows: the prefill tiling, a partial tile)
SHAPES = {"decode": (1, 1), "rows6": (2, 3), "prefill": (1, 19)}
CASES = [(dtype, shape) for dtype in ("bfloat16", "float32") for shape in ("decode", "rows6")]
CASES.append(("bfloat16", "prefill"))
# mlp_block at widths that end in a partial tile of the decode and one-row entries' matmul tiles (o_proj and
# down: 96 output columns a tile; gate/up: 112), at 1 row (the one-row kernel) and at batch 8 (the decode
# kernel's 16-row tile holding 8 valid rows)
TAIL_WIDTHS = (224, 240)  # (hidden, intermediate): 2 x 96 + 32 columns; 2 x 112 + 16
TAIL_SHAPES = {"decode": (1, 1), "batch8": (8, 1)}
# the cached prologue at a batch (one new row a sequence): 4 sequences, and the most the decode tiling takes
CACHED_BATCHES = {"batch4": (4, 1), "batch16": (16, 1)}


def _randn(gen, *shape, dtype, scale=1.0, offset=0.0):
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + offset).to(dtype)


def make_inputs(
    dtype_name: str, shape_name: str, seed: int, widths: tuple[int, int] = (HIDDEN, INTER)
) -> dict:
    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    batch, seq = (SHAPES | TAIL_SHAPES | CACHED_BATCHES)[shape_name]
    hidden, inter = widths
    head_dim, section = HEADS[dtype_name]
    q_width, kv_width = Q_HEADS * head_dim, K_HEADS * head_dim

    def linear(out_features, in_features):
        return _randn(gen, out_features, in_features, dtype=dtype, scale=in_features**-0.5)

    positions = torch.randint(0, 4096, (3, batch, seq), generator=gen).double()
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = positions[..., None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return {
        "hidden_states": _randn(gen, batch, seq, hidden, dtype=dtype, scale=2.0, offset=0.3),
        "residual": _randn(gen, batch, seq, hidden, dtype=dtype, scale=3.0),
        "attn_output": _randn(gen, batch, seq, q_width, dtype=dtype),
        "norm_weight": _randn(gen, hidden, dtype=dtype, scale=0.2, offset=1.0),
        "o_weight": linear(hidden, q_width),
        "gate_weight": linear(inter, hidden),
        "up_weight": linear(inter, hidden),
        "down_weight": linear(hidden, inter),
        "q_weight": linear(q_width, hidden),
        "k_weight": linear(kv_width, hidden),
        "v_weight": linear(kv_width, hidden),
        "q_bias": _randn(gen, q_width, dtype=dtype, scale=0.5),
        "k_bias": _randn(gen, kv_width, dtype=dtype, scale=0.5),
        "v_bias": _randn(gen, kv_width, dtype=dtype, scale=0.5),
        "cos": angles.cos().to(dtype),  # [3, b, s, d]: temporal, height, width streams
        "sin": angles.sin().to(dtype),
        "section": section,
        "head_dim": head_dim,
    }


def mixed(table: torch.Tensor, section: list[int]) -> torch.Tensor:
    """[3, b, s, d] -> [b, s, d]: chunk i of section*2 from stream i % 3 (written here, not imported)."""
    chunks = table.split(list(section) * 2, dim=-1)
    return torch.cat([chunk[i % 3] for i, chunk in enumerate(chunks)], dim=-1)


def call(entry: str, i: dict, sabotage: bool = False):
    if entry == "residual_rms_norm":
        weight = i["norm_weight"].flip(0) if sabotage else i["norm_weight"]
        return pypto.residual_rms_norm(i["hidden_states"], i["residual"], weight, EPS)
    if entry == "mlp_block":
        gate, up = (i["up_weight"], i["gate_weight"]) if sabotage else (i["gate_weight"], i["up_weight"])
        return pypto.mlp_block(
            i["residual"], i["attn_output"], i["o_weight"], None, i["norm_weight"], EPS,
            gate, None, up, None, i["down_weight"], None,
        )  # fmt: skip
    projections = (i["q_weight"], i["q_bias"], i["k_weight"], i["k_bias"], i["v_weight"], i["v_bias"])
    if entry == "attention_prologue":
        section = i["section"][::-1] if sabotage else i["section"]
        return pypto.attention_prologue(
            i["hidden_states"],
            i["norm_weight"],
            EPS,
            *projections,
            i["cos"],
            i["sin"],
            section,
            i["head_dim"],
        )
    cos, sin = mixed(i["cos"], i["section"]), mixed(i["sin"], i["section"])
    if sabotage:
        cos, sin = sin, cos
    if entry == "attention_prologue_bias_free":
        projections = (i["q_weight"], None, i["k_weight"], None, i["v_weight"], None)
    return pypto.attention_prologue_mixed(
        i["hidden_states"], i["norm_weight"], EPS, *projections, cos, sin, i["head_dim"]
    )


ENTRIES = ("residual_rms_norm", "mlp_block", "attention_prologue", "attention_prologue_mixed")


def main(out_path: str) -> None:
    pypto_runtime.POISON_OUTPUTS = True
    results, seconds = {}, {}
    with torch.no_grad():
        for seed, (dtype, shape) in enumerate(CASES, start=301):
            inputs = make_inputs(dtype, shape, seed)
            for entry in ENTRIES:
                start = time.perf_counter()
                results[f"{entry}/{dtype}-{shape}"] = {"inputs": inputs, "output": call(entry, inputs)}
                seconds[f"{entry}/{dtype}-{shape}"] = time.perf_counter() - start
        inputs = make_inputs("float32", "rows6", 399)
        results["attention_prologue_bias_free/float32-rows6"] = {
            "inputs": inputs,
            "output": call("attention_prologue_bias_free", inputs),
        }
        inputs = make_inputs("bfloat16", "rows6", 400)
        for entry in ENTRIES:
            results[f"sabotaged/{entry}"] = {"inputs": inputs, "output": call(entry, inputs, sabotage=True)}
        # the cost model's per-op stand-in for a projection: checked too, so its numbers are of a right kernel
        inputs = make_inputs("bfloat16", "rows6", 401)
        x, weight = inputs["hidden_states"].reshape(-1, HIDDEN), inputs["q_weight"]
        config = tile_config("linear", x.shape[0], HIDDEN)[1]
        kernel = pypto_blocks._build_linear(x.shape[0], HIDDEN, weight.shape[0], x.dtype, config, "cpu")
        out = torch.full((x.shape[0], weight.shape[0]), float("nan"), dtype=x.dtype)
        with pypto_runtime.quiet_stdout("cpu"):
            kernel(x, weight, out)
        results["linear/bfloat16-rows6"] = {"inputs": {"x": x, "weight": weight}, "output": out}
        for seed, shape in enumerate(TAIL_SHAPES, start=406):
            inputs = make_inputs("bfloat16", shape, seed, TAIL_WIDTHS)
            results[f"mlp_block_tails/bfloat16-{shape}"] = {
                "inputs": inputs,
                "output": call("mlp_block", inputs),
            }
        results |= prologue_probes(make_inputs("bfloat16", "decode", 403))
        results |= cached_prologues(make_inputs("bfloat16", "decode", 404))
        results |= cached_prologues_at_a_batch(make_inputs("bfloat16", "batch4", 409), "batch4")
        results |= cached_prologues_at_a_batch(make_inputs("bfloat16", "batch16", 410), "batch16")
        results |= dispatched(make_inputs("float32", "rows6", 402))
        results |= dispatched_into_cache(make_inputs("bfloat16", "decode", 405))
        results |= dispatched_into_cache(make_inputs("bfloat16", "batch4", 411), "batch4")
    stats = pypto_runtime.kernel_stats()
    torch.save({"results": results, "seconds": seconds, "stats": stats}, out_path)


CACHE_LEN = 8
# (case, the position tensor transformers hands over): 5.8's [1] counter, 5.16+'s 0-d counter, 4.57's
# cache_position
CACHE_POSITIONS = {
    "counter": torch.tensor([5]),
    "scalar": torch.tensor(2),
    "cache_position": torch.tensor([7]),
}


def cached_prologues(i: dict) -> dict:
    """The 1-row prologue kernel that writes k and v into a static cache at the position an int64 tensor
    holds (read inside the kernel), on NaN-filled caches, at three positions in the forms transformers
    hands them over; the sectioned and the mixed entries."""
    out = {}
    head_dim = i["head_dim"]
    projections = (i["q_weight"], i["q_bias"], i["k_weight"], i["k_bias"], i["v_weight"], i["v_bias"])
    for case, position in CACHE_POSITIONS.items():
        caches = [
            torch.full((1, K_HEADS, CACHE_LEN, head_dim), float("nan"), dtype=torch.bfloat16) for _ in "kv"
        ]
        args = (i["hidden_states"], i["norm_weight"], EPS, *projections)
        position = position.clone()
        at = int(position.reshape(-1)[0])
        advance = case != "cache_position"  # a layer's own length (5.8+) advances; cache_position does not
        if case == "scalar":  # the mixed entry (transformers 5.20+'s tables)
            cos, sin = mixed(i["cos"], i["section"]), mixed(i["sin"], i["section"])
            q = pypto_prologue.attention_prologue_mixed_cached(
                *args, cos, sin, head_dim, *caches, position, advance
            )
        else:
            q = pypto_prologue.attention_prologue_cached(
                *args, i["cos"], i["sin"], i["section"], head_dim, *caches, position, advance
            )
        out[f"attention_prologue_cached/{case}"] = _cached_record(i, at, advance, position, q, caches)
    return out


def _cached_record(i: dict, at: int, advance: bool, position, q, caches) -> dict:
    """What a cached prologue call is judged by: its inputs, the position it wrote at and whether it
    advanced, the position tensor after, and q with both caches."""
    return {
        "inputs": i,
        "position": at,
        "advance": advance,
        "position_after": position,
        "output": (q, *caches),
    }


def _launches(op: str) -> int:
    """Calls of `op`'s pypto kernels so far: kernels built plus cache hits."""
    stats = pypto_runtime.kernel_stats().get(op, {})
    return stats.get("built", 0) + stats.get("cache_hits", 0)


def cached_prologues_at_a_batch(i: dict, batch: str) -> dict:
    """The cached prologue at a batch (one new row a sequence, every sequence at the same position, as
    transformers' static cache writes them) on NaN-filled caches: with `advance` through the sectioned entry
    (a 5.8+ layer's length), without through the mixed one (4.57's cache_position). Records which pypto
    kernels each call launched: the cached one alone, or the plain prologue's (then torch's writes)."""
    out = {}
    head_dim, batch_size = i["head_dim"], i["hidden_states"].shape[0]
    projections = (i["q_weight"], i["q_bias"], i["k_weight"], i["k_bias"], i["v_weight"], i["v_bias"])
    args = (i["hidden_states"], i["norm_weight"], EPS, *projections)
    for case, at, advance in (("advance", 5, True), ("at", 3, False)):
        caches = [
            torch.full((batch_size, K_HEADS, CACHE_LEN, head_dim), float("nan"), dtype=torch.bfloat16)
            for _ in "kv"
        ]
        position = torch.tensor([at])
        before = {op: _launches(op) for op in ("attention_prologue", "attention_prologue_cached")}
        if advance:
            q = pypto_prologue.attention_prologue_cached(
                *args, i["cos"], i["sin"], i["section"], head_dim, *caches, position, advance
            )
        else:
            cos, sin = mixed(i["cos"], i["section"]), mixed(i["sin"], i["section"])
            q = pypto_prologue.attention_prologue_mixed_cached(
                *args, cos, sin, head_dim, *caches, position, advance
            )
        out[f"attention_prologue_cached/{batch}-{case}"] = {
            **_cached_record(i, at, advance, position, q, caches),
            "launches": {op: _launches(op) - n for op, n in before.items()},
        }
    return out


def prologue_probes(i: dict) -> dict:
    """benchmarks/prologue_bound.py's probes (the prologue's q/k/v matmuls, another epilogue) at 1 row with
    the prologue's 1-row tiling: checked too, so the bound they measure is of kernels that do the matmuls."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import prologue_bound

    x = i["hidden_states"].reshape(-1, HIDDEN)
    weights = [i[f"{name}_weight"] for name in ("q", "k", "v")]
    head_dim = HEADS["bfloat16"][0]
    config = tile_config("attention_prologue", x.shape[0], HIDDEN)[1]
    out = {}
    for epilogue in prologue_bound.EPILOGUES:
        kernel = prologue_bound.build_probe(
            x.shape[0], HIDDEN, Q_HEADS, K_HEADS, head_dim, epilogue, config, "cpu"
        )
        outs = [torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype) for w in weights]
        with pypto_runtime.quiet_stdout("cpu"):
            kernel(x, *weights, *outs)
        out[f"prologue_bound/{epilogue}"] = {"inputs": {"x": x, "weights": weights}, "output": outs}
    return out


def _linear(weight, bias=None):
    module = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype)
    module.weight.data, module.bias = weight, None if bias is None else torch.nn.Parameter(bias)
    return module


def dispatched(i: dict) -> dict:
    """The blocks through the package's wrappers with backend "pypto", strict: what a patched decoder layer
    calls. Also records which backend served each op (a torch fallback would raise, not stand in)."""
    import os

    import pto_kernels

    os.environ["PTO_KERNELS_STRICT"] = "1"
    norm = torch.nn.Module()
    norm.weight, norm.variance_epsilon = torch.nn.Parameter(i["norm_weight"]), EPS
    mlp = torch.nn.Module()
    mlp.gate_proj, mlp.up_proj = _linear(i["gate_weight"]), _linear(i["up_weight"])
    mlp.down_proj, mlp.act_fn = _linear(i["down_weight"]), torch.nn.SiLU()
    attention = torch.nn.Module()
    attention.q_proj, attention.k_proj = (
        _linear(i["q_weight"], i["q_bias"]),
        _linear(i["k_weight"], i["k_bias"]),
    )
    attention.v_proj, attention.head_dim = _linear(i["v_weight"], i["v_bias"]), i["head_dim"]
    with pto_kernels.enabled(("residual_rms_norm", "mlp_block", "attention_prologue"), backend="pypto"):
        outputs = {
            "residual_rms_norm": pto_kernels.residual_rms_norm_wrapper(
                i["hidden_states"], i["residual"], norm
            ),
            "mlp_block": pto_kernels.mlp_block_wrapper(
                i["residual"], i["attn_output"], _linear(i["o_weight"]), norm, mlp
            ),
            "attention_prologue": pto_kernels.attention_prologue_wrapper(
                attention, norm, i["hidden_states"], i["cos"], i["sin"], i["section"]
            ),
        }
        backends = {op: pto_kernels.stats()[op]["backends"] for op in outputs}
    return {
        f"dispatched/{op}": {"inputs": i, "output": out, "backends": backends[op]}
        for op, out in outputs.items()
    }


def dispatched_into_cache(i: dict, batch: str = "decode") -> dict:
    """attention_prologue_cache_wrapper with backend "pypto", strict, over the installed transformers'
    StaticCache after a 5-position prefill: what a patched attention calls at a decode step (of one
    sequence, or of each sequence of a batch)."""
    import os

    import pto_kernels
    from transformers import PretrainedConfig, StaticCache

    os.environ["PTO_KERNELS_STRICT"] = "1"
    head_dim = i["head_dim"]
    config = PretrainedConfig(
        hidden_size=HIDDEN,
        num_attention_heads=Q_HEADS,
        num_key_value_heads=K_HEADS,
        head_dim=head_dim,
        num_hidden_layers=1,
    )
    cache = StaticCache(config=config, max_cache_len=CACHE_LEN)
    batch_size = i["hidden_states"].shape[0]
    prefill = [torch.randn(batch_size, K_HEADS, 5, head_dim).to(torch.bfloat16) for _ in "kv"]
    cache.update(*prefill, 0, {"cache_position": torch.arange(5)})
    layer = cache.layers[0]
    counter = getattr(layer, "cumulative_length", None)
    position = None if isinstance(counter, torch.Tensor) else torch.tensor([5])  # transformers 4.57 - 5.0
    norm = torch.nn.Module()
    norm.weight, norm.variance_epsilon = torch.nn.Parameter(i["norm_weight"]), EPS
    attention = torch.nn.Module()
    attention.q_proj, attention.k_proj = (
        _linear(i["q_weight"], i["q_bias"]),
        _linear(i["k_weight"], i["k_bias"]),
    )
    attention.v_proj, attention.head_dim, attention.layer_idx = (
        _linear(i["v_weight"], i["v_bias"]),
        head_dim,
        0,
    )
    before = pto_kernels.stats()["attention_prologue"]
    launched = {op: _launches(op) for op in ("attention_prologue", "attention_prologue_cached")}
    with pto_kernels.enabled(("attention_prologue",), backend="pypto"):
        q, keys, values, written = pto_kernels.attention_prologue_cache_wrapper(
            attention, norm, i["hidden_states"], i["cos"], i["sin"], i["section"], cache, position
        )
        after = pto_kernels.stats()["attention_prologue"]
    served = {name: n - before["backends"].get(name, 0) for name, n in after["backends"].items()}
    key = "dispatched/attention_prologue_cached" + ("" if batch == "decode" else f"/{batch}")
    return {
        key: {
            "inputs": i,
            "prefill": prefill,
            "output": (q, keys.clone(), values.clone()),
            "written": written,
            "backends": {name: n for name, n in served.items() if n},
            "cache_writes": after["cache_writes"] - before["cache_writes"],
            "length": int(layer.get_seq_length()) if position is None else None,
            "launches": {op: _launches(op) - n for op, n in launched.items()},
        }
    }


if __name__ == "__main__":
    main(sys.argv[1])
