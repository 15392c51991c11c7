"""Golden cases for the kernel package: inputs from JSON seeds, float64 references written here.

The references are deliberately not imported from pto_kernels: they restate the math so a bug shared by
the package's own reference and its kernels cannot pass.
"""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import torch

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"
# Upper bounds on ||actual - expected|| / ||expected|| against the float64 reference.
REL_TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def load(op: str, kind: str = "cases") -> list[dict]:
    return json.loads((GOLDEN_DIR / f"kernels_{op}.json").read_text())[kind]


def ids(cases: list[dict]) -> list[str]:
    return [c["id"] for c in cases]


def _randn(shape, gen, dtype, scale=1.0, offset=0.0, layout=None):
    if layout == "strided":
        # same values, every other element of a wider buffer along the last dim: not contiguous
        wide = torch.randn(*shape[:-1], shape[-1] * 2, generator=gen, dtype=torch.float64)
        return (wide[..., ::2] * scale + offset).to(dtype)
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + offset).to(dtype)


def rms_norm_inputs(case):
    gen = torch.Generator().manual_seed(case["seed"])
    dtype = getattr(torch, case["dtype"])
    x = _randn(case["shape"], gen, dtype, scale=2.0, offset=0.3, layout=case.get("layout"))
    w = _randn([case["shape"][-1]], gen, dtype, scale=0.2, offset=1.0)
    return x, w, case["eps"]


def rms_norm_expected(x, w, eps):
    x64, w64 = x.double(), w.double()
    return w64 * x64 / torch.sqrt((x64 * x64).mean(dim=-1, keepdim=True) + eps)


def mrope_inputs(case):
    """q/k as the model makes them: [b, s, h, d] projections transposed to [b, h, s, d] (not contiguous)."""
    gen = torch.Generator().manual_seed(case["seed"])
    dtype = getattr(torch, case["dtype"])
    b, s, d = case["batch"], case["seq"], case["head_dim"]
    q = _randn([b, s, case["q_heads"], d], gen, dtype).transpose(1, 2)
    k = _randn([b, s, case["k_heads"], d], gen, dtype).transpose(1, 2)
    # 3 position streams (t, h, w) -> angles; cos/sin tables as the rotary embedding builds them
    positions = torch.randint(0, 4096, (3, b, s), generator=gen).double()
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = positions[..., None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return q, k, angles.cos().to(dtype), angles.sin().to(dtype), list(case["section"])


def mix_tables(table, section):
    """[3, b, s, d] -> [b, s, d]: column c takes stream (index of c's chunk in section*2) % 3."""
    d = table.shape[-1]
    stream = torch.empty(d, dtype=torch.long)
    start = 0
    for i, width in enumerate(list(section) * 2):
        stream[start : start + width] = i % 3
        start += width
    cols = torch.arange(d)
    return table[stream, :, :, cols].permute(1, 2, 0)


def rotary_expected(x, cos_mixed, sin_mixed):
    """x [b, h, s, d]; tables [b, s, d]; out = x*cos + (-x2, x1)*sin, element by element in float64."""
    x64 = x.double()
    cos64 = cos_mixed.double()[:, None]
    sin64 = sin_mixed.double()[:, None]
    half = x.shape[-1] // 2
    rotated = torch.empty_like(x64)
    rotated[..., :half] = -x64[..., half:]
    rotated[..., half:] = x64[..., :half]
    return x64 * cos64 + rotated * sin64


def mlp_module(case):
    gen = torch.Generator().manual_seed(case["seed"])
    dtype = getattr(torch, case["dtype"])
    h, i = case["hidden"], case["intermediate"]
    mlp = torch.nn.Module()
    mlp.gate_proj = torch.nn.Linear(h, i, bias=False, dtype=dtype)
    mlp.up_proj = torch.nn.Linear(h, i, bias=False, dtype=dtype)
    mlp.down_proj = torch.nn.Linear(i, h, bias=False, dtype=dtype)
    mlp.act_fn = torch.nn.SiLU()
    with torch.no_grad():
        for proj, fan_in in ((mlp.gate_proj, h), (mlp.up_proj, h), (mlp.down_proj, i)):
            proj.weight.copy_(_randn(list(proj.weight.shape), gen, dtype, scale=1.0 / math.sqrt(fan_in)))
    return mlp


def mlp_inputs(case, mlp=None):
    mlp = mlp if mlp is not None else mlp_module(case)
    gen = torch.Generator().manual_seed(case["seed"] * 1000 + case["tokens"][0] * 100 + case["tokens"][1])
    x = _randn(
        [*case["tokens"], case["hidden"]], gen, getattr(torch, case["dtype"]), layout=case.get("layout")
    )
    return mlp, x


def mlp_expected(mlp, x):
    x64 = x.double()
    gate = x64 @ mlp.gate_proj.weight.double().T
    up = x64 @ mlp.up_proj.weight.double().T
    return (gate / (1 + torch.exp(-gate)) * up) @ mlp.down_proj.weight.double().T


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected).norm() / expected.norm()).item()


def check_close(
    actual, expected: torch.Tensor, dtype: torch.dtype, what: str = "", tol: float | None = None
) -> SimpleNamespace:
    """Raise AssertionError naming shape, non-finite count, relative error and worst element (over `tol`,
    by default the dtype's REL_TOL)."""
    assert isinstance(actual, torch.Tensor), f"{what}: expected a tensor, got {type(actual).__name__}"
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    )
    bad = (~torch.isfinite(actual)).sum().item()
    assert bad == 0, f"{what}: {bad} of {actual.numel()} elements are NaN/inf (unwritten or overflowed)"
    err = relative_error(actual, expected)
    tol = REL_TOL[dtype] if tol is None else tol
    if not err <= tol:
        diff = (actual.double() - expected).abs()
        worst = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
        n_off = int((diff > tol * expected.abs().max()).sum())
        raise AssertionError(
            f"{what}: relative error {err:.3e} > {tol:.0e}; {n_off} elements off; worst at {worst}: "
            f"{actual[worst].item():.6g} vs {expected[worst].item():.6g}"
        )
    return SimpleNamespace(rel_err=err, tol=tol)


# --- one golden case per entry of the kernels' tile table --------------------------------------------

# Widths for entries that name none: RMSNorm and MRoPE keep GutenOCR's row width (2048, head_dim 128;
# MRoPE with 2 + 1 heads). The MLP's full 2048 -> 11008 is too slow for the interpreter: it runs at the
# smallest widths that still hold two of each of the entry's L1 tiles (so the tiles really repeat).
TABLE_WIDTHS = {"rms_norm": 2048, "mrope": 128}


def table_mlp_widths(config) -> tuple[int, int]:
    """(hidden, intermediate) for a table MLP case: twice the largest L1 tile along each, within GutenOCR's."""
    down_k, down_n = config.down_cube_k or config.cube_k, config.down_cube_n or config.cube_n
    hidden = min(2048, max(256, 2 * config.cube_k[1], 2 * down_n[1]))
    intermediate = min(11008, max(512, 2 * config.cube_n[1], 2 * down_k[1]))
    return hidden, intermediate


def table_cases() -> list[dict]:
    """A case per TILE_TABLE entry whose row count falls in the entry's class, with a partial last tile."""
    from pto_kernels.tiling.tile_table import DECODE_MAX_ROWS, TILE_TABLE

    cases = []
    for seed, ((op, klass, width), config) in enumerate(sorted(TILE_TABLE.items(), key=str), start=71):
        if op == "swiglu_mlp":
            width, intermediate = table_mlp_widths(config)
        else:
            width = width or TABLE_WIDTHS[op]
        if klass == "decode":
            rows = min(DECODE_MAX_ROWS, 3)
        else:
            rows = max(DECODE_MAX_ROWS + 1, 2 * config.row_tile + 3)
        case = {"id": f"{op}-{klass}-{width}", "op": op, "seed": seed, "dtype": "bfloat16", "config": config}
        if op == "rms_norm":
            case |= {"shape": [rows, width], "eps": 1e-6}
        elif op == "mrope":
            section = [width // 8, 3 * width // 16, 3 * width // 16]
            case |= {
                "batch": 1,
                "seq": rows,
                "q_heads": 2,
                "k_heads": 1,
                "head_dim": width,
                "section": section,
            }
        else:
            case |= {"tokens": [1, rows], "hidden": width, "intermediate": intermediate}
        cases.append(case)
    return cases


# --- the attention core at decode --------------------------------------------------------------------


# transformers' eager attention rounds the scores to bf16 / fp16 before its fp32 softmax; over a long context
# that alone measured 1.05e-2 (1,024 positions, bf16): the torch backend, which is that math, gets this bound
MODEL_ROUNDED_SCORES_TOL = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def attention_core_inputs(case):
    """(query, key_cache, value_cache, kv_lens, scale), and kv_starts where the case has left padding: a
    static cache whose unused tail and padded head hold noise, not zeros, so a kernel that reads past a
    sequence's length, or before its start, cannot pass."""
    gen = torch.Generator().manual_seed(case["seed"])
    dtype = getattr(torch, case["dtype"])
    b, hq, hkv, s, d, length = (
        case[k] for k in ("batch", "q_heads", "kv_heads", "seq", "head_dim", "cache_len")
    )
    query = _randn((b, hq, s, d), gen, dtype)
    keys = _randn((b, hkv, length, d), gen, dtype, scale=1.5)
    values = _randn((b, hkv, length, d), gen, dtype)
    inputs = (query, keys, values, torch.tensor(case["kv_lens"]), d**-0.5)
    return inputs + (torch.tensor(case["kv_starts"]),) if "kv_starts" in case else inputs


def attention_core_expected(query, keys, values, kv_lens, scale, kv_starts=None):
    """[b, s, q_heads * d] in float64: q head h attends with kv head h // (q_heads / kv_heads); row i of
    sequence b sees cache positions kv_starts[b] <= j <= kv_starts[b] + kv_lens[b] - s + i."""
    b, hq, s, d = query.shape
    group = hq // keys.shape[1]
    out = torch.empty(b, s, hq, d, dtype=torch.float64)
    for seq in range(b):
        first = 0 if kv_starts is None else int(kv_starts[seq])
        for head in range(hq):
            k64, v64 = keys[seq, head // group].double(), values[seq, head // group].double()
            for i in range(s):
                end = first + int(kv_lens[seq]) - s + i + 1
                scores = k64[first:end] @ query[seq, head, i].double() * scale
                weights = torch.exp(scores - scores.max())
                out[seq, i, head] = (weights / weights.sum()) @ v64[first:end]
    return out.reshape(b, s, hq * d)
