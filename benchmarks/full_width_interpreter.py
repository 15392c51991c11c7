"""The PyPTO blocks and the MLP at GutenOCR-3B's full widths through PyPTO's CPU verify interpreter, against
float64 references written here, at row counts that end in a partial tile.

    python benchmarks/full_width_interpreter.py [--json out.json] [--only CASE] [--rows 5,17]

Widths: hidden 2048, MLP 11008 (2048 -> 11008 -> 2048), 16 q / 2 kv heads of head_dim 128, mrope_section
[16, 24, 24], bf16. Rows 5 end in a partial tile of the decode tiling (16 rows a tile), 17 in one of the
prefill tiling (128 rows a tile). Each kernel is built with the tiling its entry picks (tile_table) and
called with outputs (and mlp_block's scratch) that are views of larger buffers: the valid rows start as
NaN (a row the kernel never writes stays NaN) and the rows after them hold a sentinel that must survive the
call (a tail tile written whole, past its valid shape, would overwrite it). The interpreter cannot see an
out-of-bounds access the way a device faults on it; the sentinel rows are where it would land.

Each case runs in its own subprocess (pypto exits the process on a g++ failure). Reported per case: the
relative error (norm of the difference over the norm of the reference), the largest absolute error, rows
left unwritten, sentinel rows changed, and seconds. Exit status 1 if any case fails.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))

HIDDEN, INTER, Q_HEADS, K_HEADS, HEAD_DIM, SECTION, EPS = 2048, 11008, 16, 2, 128, (16, 24, 24), 1e-6
SENTINEL_ROWS, SENTINEL = 16, 12288.0  # exact in bf16 and fp16
REL_TOL = 1e-2  # bf16, as the kernel tests
CASES = ("swiglu_mlp", "mlp_block", "attention_prologue")
DEFAULT_ROWS = (5, 17)
CHILD_TIMEOUT_S = 3600


# --- float64 references (written here, not imported from pto_kernels) ---------------------------------


def _norm64(h, weight):
    return weight * h / (h * h).mean(dim=-1, keepdim=True).add(EPS).sqrt()


def _silu_mlp64(x, gate_w, up_w, down_w):
    gate, up = x @ gate_w.T, x @ up_w.T
    return (gate / (1 + (-gate).exp()) * up) @ down_w.T


def _rotate64(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = x.new_empty(x.shape)
    rotated[..., :half], rotated[..., half:] = -x[..., half:], x[..., :half]
    return x * cos + rotated * sin


def _mixed(table, section):
    """[3, rows, d] -> [rows, d]: chunk i of section * 2 from stream i % 3."""
    import torch

    chunks = table.split(list(section) * 2, dim=-1)
    return torch.cat([chunk[i % 3] for i, chunk in enumerate(chunks)], dim=-1)


# --- the checks ---------------------------------------------------------------------------------------


def poisoned(rows: int, width: int, dtype):
    """(buffer, view): `rows` NaN rows the kernel must write, then SENTINEL_ROWS rows it must not touch."""
    import torch

    buffer = torch.full((rows + SENTINEL_ROWS, width), float("nan"), dtype=dtype)
    buffer[rows:] = SENTINEL
    return buffer, buffer[:rows]


def check_output(name: str, buffer, rows: int, expected) -> dict:
    """One output's verdict: unwritten rows, sentinel rows changed, and the error of the valid rows."""
    import torch

    valid, beyond = buffer[:rows].double(), buffer[rows:]
    unwritten = int((~torch.isfinite(valid)).any(dim=-1).sum())
    touched = int((beyond != SENTINEL).any(dim=-1).sum())
    result = {"output": name, "unwritten_rows": unwritten, "sentinel_rows_changed": touched}
    if unwritten:
        result |= {"rel_error": None, "max_abs_error": None}
    else:
        diff = valid - expected
        result |= {
            "rel_error": float(diff.norm() / expected.norm()),
            "max_abs_error": float(diff.abs().max()),
        }
    result["ok"] = not unwritten and not touched and result["rel_error"] <= REL_TOL
    return result


def _weights(gen, out_features, in_features):
    import torch

    return (
        torch.randn(out_features, in_features, generator=gen, dtype=torch.float64) * in_features**-0.5
    ).to(torch.bfloat16)


def run_case(case: str, rows: int) -> dict:
    """Build the case's kernel as its entry does, call it once through the interpreter, check every output."""
    import torch
    from pto_kernels.backends import pypto_blocks, pypto_ops, pypto_prologue, pypto_runtime
    from pto_kernels.tiling.tile_table import tile_config

    bf16, gen = torch.bfloat16, torch.Generator().manual_seed(rows * 31 + len(case))
    x = (torch.randn(rows, HIDDEN, generator=gen, dtype=torch.float64) * 2.0 + 0.3).to(bf16)
    norm_w = (1.0 + 0.2 * torch.randn(HIDDEN, generator=gen, dtype=torch.float64)).to(bf16)
    klass, config = tile_config(case, rows, HIDDEN)
    outputs, expected = [], []
    start = time.perf_counter()
    with torch.no_grad():
        if case == "swiglu_mlp":
            gate, up, down = (
                _weights(gen, INTER, HIDDEN),
                _weights(gen, INTER, HIDDEN),
                _weights(gen, HIDDEN, INTER),
            )
            kernel = pypto_ops._build_swiglu_mlp(rows, HIDDEN, INTER, bf16, config, "cpu")
            buffer, out = poisoned(rows, HIDDEN, bf16)
            with pypto_runtime.quiet_stdout("cpu"):
                kernel(x, gate, up, down, out)
            outputs.append(("out", buffer))
            expected.append(_silu_mlp64(x.double(), gate.double(), up.double(), down.double()))
        elif case == "mlp_block":
            attn_width = Q_HEADS * HEAD_DIM
            residual = (torch.randn(rows, HIDDEN, generator=gen, dtype=torch.float64) * 3.0).to(bf16)
            attn = torch.randn(rows, attn_width, generator=gen, dtype=torch.float64).to(bf16)
            o_w = _weights(gen, HIDDEN, attn_width)
            gate, up, down = (
                _weights(gen, INTER, HIDDEN),
                _weights(gen, INTER, HIDDEN),
                _weights(gen, HIDDEN, INTER),
            )
            kernel = pypto_blocks._build_mlp_block(rows, HIDDEN, attn_width, INTER, bf16, EPS, config, "cpu")
            (out_b, out), (normed_b, normed), (proj_b, proj) = (
                poisoned(rows, HIDDEN, bf16) for _ in range(3)
            )
            with pypto_runtime.quiet_stdout("cpu"):
                kernel(residual, attn, o_w, norm_w.reshape(1, -1), gate, up, down, out, normed, proj)
            h = residual.double() + attn.double() @ o_w.double().T
            mlp = _silu_mlp64(_norm64(h, norm_w.double()), gate.double(), up.double(), down.double())
            outputs += [("out", out_b), ("normed scratch", normed_b), ("projected scratch", proj_b)]
            expected += [h + mlp, None, None]  # scratch: written where valid, untouched beyond
        else:
            q_width, kv_width = Q_HEADS * HEAD_DIM, K_HEADS * HEAD_DIM
            weights = [_weights(gen, n, HIDDEN) for n in (q_width, kv_width, kv_width)]
            biases = [
                (torch.randn(n, generator=gen, dtype=torch.float64) * 0.5).to(bf16)
                for n in (q_width, kv_width, kv_width)
            ]
            positions = torch.randint(0, 4096, (3, rows), generator=gen).double()
            inv_freq = 1.0 / (1e6 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM))
            angles = torch.cat((positions[..., None] * inv_freq,) * 2, dim=-1)
            cos, sin = _mixed(angles.cos(), SECTION).to(bf16), _mixed(angles.sin(), SECTION).to(bf16)
            folded = [pypto_prologue.NORM_FOLDED.get(w, norm_w, bf16) for w in weights]
            kernel = pypto_prologue._build_attention_prologue(
                rows, HIDDEN, Q_HEADS, K_HEADS, HEAD_DIM, bf16, bf16, EPS, config, "cpu"
            )
            (q_b, q), (k_b, k), (v_b, v) = (poisoned(rows, n, bf16) for n in (q_width, kv_width, kv_width))
            with pypto_runtime.quiet_stdout("cpu"):
                kernel(
                    x, folded[0], biases[0].reshape(1, -1), folded[1], biases[1].reshape(1, -1),
                    folded[2], biases[2].reshape(1, -1), cos, sin, q, k, v,
                )  # fmt: skip
            normed = _norm64(x.double(), norm_w.double())
            for name, buffer, w, b in zip("qkv", (q_b, k_b, v_b), weights, biases, strict=True):
                y = normed @ w.double().T + b.double()
                if name != "v":
                    heads = y.reshape(rows, -1, HEAD_DIM)
                    y = _rotate64(heads, cos.double()[:, None], sin.double()[:, None]).reshape(rows, -1)
                outputs.append((name, buffer))
                expected.append(y)
    seconds = time.perf_counter() - start
    checked = []
    for (name, buffer), want in zip(outputs, expected, strict=True):
        if want is None:  # a scratch buffer: its values are the kernel's own business
            checked.append(check_output(name, buffer, rows, buffer[:rows].double().nan_to_num(0.0)))
        else:
            checked.append(check_output(name, buffer, rows, want))
    return {
        "case": case,
        "rows": rows,
        "shape_class": klass,
        "row_tile": config.row_tile,
        "seconds": round(seconds, 1),
        "outputs": checked,
        "ok": all(c["ok"] for c in checked),
    }


def run_in_subprocess(case: str, rows: int, timeout_s: int) -> dict:
    env = dict(os.environ)
    env.pop("ASCEND_HOME_PATH", None)  # without CANN pypto stays in SIM mode
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps([case, rows])],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"case": case, "rows": rows, "ok": False, "reason": f"did not finish in {timeout_s} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {
            "case": case,
            "rows": rows,
            "ok": False,
            "reason": f"exit {done.returncode}: {' | '.join(tail)}",
        }
    return json.loads(lines[-1]) | {"wall_s": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--only", choices=CASES, help="one case only")
    parser.add_argument(
        "--rows", default=",".join(map(str, DEFAULT_ROWS)), help="row counts, comma-separated"
    )
    parser.add_argument("--timeout", type=int, default=CHILD_TIMEOUT_S, help="seconds per case")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, rows = json.loads(args.child)
        print(json.dumps(run_case(case, rows)), flush=True)
        return
    results = []
    for case in [args.only] if args.only else CASES:
        for rows in (int(r) for r in args.rows.split(",")):
            result = run_in_subprocess(case, rows, args.timeout)
            results.append(result)
            worst = max((o["rel_error"] or 0.0 for o in result.get("outputs", [])), default=None)
            verdict = "ok" if result["ok"] else f"FAILED {result.get('reason', '')}"
            print(
                f"{case:<20} {rows:>4} rows  rel err {worst if worst is None else f'{worst:.2e}'}"
                f"  {result.get('wall_s', '-')} s  {verdict}",
                flush=True,
            )
            for output in result.get("outputs", []):
                if not output["ok"]:
                    print(f"    {output}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"results": results}, indent=2) + "\n")
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
