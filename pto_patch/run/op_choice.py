"""Which kernel ops a run switches on, on which backend, and whether they ran as asked.

The kernel package keeps its own copies of these names (it is copied into model folders and
imports nothing of pto-patch); a test checks that both agree with the spec's.
"""

from __future__ import annotations

import os
from typing import Any

from pto_patch.model.spec import BLOCK_OPS, BLOCKS, OPS
from pto_patch.run.report import OpReport

KERNEL_BACKENDS = ("auto", "pypto", "npu", "torch", "fused")

# The reference system's per-batch recommendation (`--use_dynamic_config`), as data:
# (op, predicate on the batch size, reason).
DYNAMIC_CONFIG_TABLE = (
    (
        "swiglu_mlp",
        lambda batch: True,
        "SwiGLU MLP gained at every batch size measured (+7.8/13.7/15.7/3.1 % at batch 1/4/8/16)",
    ),
    (
        "mrope",
        lambda batch: batch <= 4,
        "MRoPE pays off only at batch 4 or less",
    ),
    (
        "rms_norm",
        lambda batch: False,
        "RMSNorm was slower end to end (with MRoPE: 11.1 -> 8.6 tok/s at batch 1)",
    ),
)


def kernel_backend_name(requested: str | None) -> str:
    """The backend the kernels are asked for: --kernel-backend, else $PTO_KERNELS_BACKEND, else auto."""
    return requested or os.environ.get("PTO_KERNELS_BACKEND") or "auto"


def dynamic_choice(batch: int, available: tuple[str, ...]) -> list[dict[str, Any]]:
    """The reference's per-batch recommendation, restricted to the ops the folder was patched for."""
    rows = []
    for op, wanted, reason in DYNAMIC_CONFIG_TABLE:
        enabled = bool(wanted(batch)) and op in available
        why = reason if op in available else f"{reason}; not patched into this folder"
        rows.append({"op": op, "enabled": enabled, "reason": f"batch {batch}: {why}"})
    return rows


def tuned_choice(
    tuning, batch: int, available: tuple[str, ...], patched: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """A tuning's choice for `batch` (from `pto-patch tune`), as the same rows as the reference table's,
    each switched-on row with the backend tune measured it on. `available`: what this run may switch on;
    `patched`: what the folder was patched with."""
    choice = tuning.for_batch(batch)
    tuned_at = f"tuned at batch {choice.batch}" if choice.batch != batch else "tuned"
    tuned = tuning.header.get("ops_tuned")  # absent from tunings written before it was recorded
    rows = []
    for op in OPS:
        backend = choice.ops.get(op)
        where = (
            "not patched into this folder"
            if op not in patched
            else "patched in, but not among this run's ops (--ops)"
        )
        if backend is None and op in available and tuned is not None and op not in tuned:
            why = "patched in, but not tuned (tune measured " + (", ".join(tuned) or "nothing") + ")"
        elif backend is None:
            why = (choice.decided or "not measured faster") if op in available else where
        elif op not in available:
            why = f"measured faster on {backend}, but {where}"
        else:
            why = f"measured faster on {backend}"
        row = {
            "op": op,
            "enabled": backend is not None and op in available,
            "reason": f"batch {batch}: {tuned_at}: {why}",
        }
        if row["enabled"]:
            row["backend"] = backend
        rows.append(row)
    return rows


def choose_ops(
    ops: tuple[str, ...],
    patched_ops: tuple[str, ...],
    batch: int,
    use_dynamic_config: bool,
    tuning=None,
) -> tuple[tuple[str, ...], list[dict[str, Any]] | None]:
    """The ops to switch on at `batch`, of the run's candidates `ops`: all of them, or with
    --use_dynamic_config those `tuning` (the folder's, where it applies here) or else the reference table
    switches on at this batch size."""
    if not use_dynamic_config:
        return ops, None
    if tuning is not None:
        table = tuned_choice(tuning, batch, ops, tuple(patched_ops))
    else:
        table = dynamic_choice(batch, ops)
    return tuple(op for op in OPS if any(row["op"] == op and row["enabled"] for row in table)), table


def backend_for(table: list[dict[str, Any]] | None, requested: str | None) -> str | dict[str, str]:
    """--kernel-backend where given; else the backend per op a tuning chose; else the default name."""
    tuned = {row["op"]: row["backend"] for row in table or () if row.get("backend")}
    if requested is None and tuned:
        return tuned
    return kernel_backend_name(requested)


def set_switches(kernels, ops: tuple[str, ...], backend: str | dict[str, str]) -> None:
    """Switch exactly `ops` on (on `backend`, or one backend per op) and every other op off."""
    if ops:
        kernels.enable(ops=ops, backend=backend)
    else:
        kernels.disable()


def _inside(op: str, stats: dict[str, Any], switched_on: tuple[str, ...]) -> str | None:
    """The block that ran in `op`'s place: switched on, with calls, and doing `op`'s work."""
    for block, covered in BLOCKS.items():
        if op in covered and block in switched_on and int((stats.get(block) or {}).get("calls", 0)):
            return block
    return None


def op_reports(
    stats: dict[str, Any], switched_on: tuple[str, ...], layers: int | None = None
) -> dict[str, OpReport]:
    """Per op, what ran; `layers` (the text decoder's layer count) gives the blocks' calls per layer."""
    reports = {}
    for op in OPS:
        entry = stats.get(op) or {}
        calls = int(entry.get("calls", 0))
        per_layer = round(calls / layers, 3) if layers and op in BLOCK_OPS else None
        reports[op] = OpReport(
            switched_on=op in switched_on,
            backend=entry.get("backend"),
            calls=int(entry.get("calls", 0)),
            fallbacks=int(entry.get("fallbacks", 0)),
            backends={str(k): int(v) for k, v in (entry.get("backends") or {}).items()},
            first_fallback_error=entry.get("first_fallback_error"),
            captured=int(entry.get("captured", 0)),  # absent from older kernel packages
            replays=int(entry.get("replays", 0)),
            cache_writes=int(entry.get("cache_writes", 0)),  # absent from older kernel packages
            inside=_inside(op, stats, switched_on) if op in switched_on and not calls else None,
            calls_per_layer=per_layer,
            compile_s=(entry.get("pypto_kernels") or {}).get("compile_s"),  # absent from older packages
        )
    return reports


def op_failures(reports: dict[str, OpReport], strict: bool) -> tuple[list[str], list[str]]:
    failures, warnings = [], []
    for op, report in reports.items():
        if report.switched_on and report.calls == 0 and report.inside is None:
            failures.append(f"{op} was switched on but never ran (0 calls): the injection is not reached")
        if not report.switched_on and report.calls:
            failures.append(f"{op} ran {report.calls} time(s) although it was switched off")
        if report.fallbacks:
            message = f"{op} fell back to torch {report.fallbacks} time(s)" + (
                f": {report.first_fallback_error}" if report.first_fallback_error else ""
            )
            (failures if strict else warnings).append(message + ("" if strict else " (fails under --strict)"))
    return failures, warnings
