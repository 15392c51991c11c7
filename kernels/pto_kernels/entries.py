"""Every kernel entry, declared once. Dispatch, the custom ops and the op counts are derived from this table.

An entry is a function of its name in every backend module (`backends/reference.py`, `fused.py`, `npu.py`,
and the PyPTO modules behind `backends/pypto.py`). `_dispatch` binds one route per entry and counts its
calls under `op`. An entry with a `custom_op` is also registered as `torch.ops.pto_kernels.<custom_op>`:
a typed body in ops.py (or serving_ops.py) runs the entry's route, and the reference backend's function
of the entry is its fake. Adding an entry touches this table, its wrapper, its typed body (if it has a
custom op) and one function per backend; tests/kernels/test_kernels_entries.py checks that each is there.

Pure data: imported by the dispatcher and the custom ops, never by a backend.
"""

from __future__ import annotations

from dataclasses import dataclass

# The ops as the switches, `stats()` and `--ops` name them: the reference system's three, then the
# decoder-layer blocks (several of a layer's ops as one entry)
OPS = (
    "rms_norm",
    "mrope",
    "swiglu_mlp",
    "residual_rms_norm",
    "mlp_block",
    "attention_prologue",
    "attention_core",
)

# the positions a cache-writing prologue's torch.library schema marks written
_CACHES = ("key_cache", "value_cache")


@dataclass(frozen=True)
class Entry:
    name: str  # the function every backend defines, and the route's key
    op: str  # the op it is counted and switched under
    device_arg: int = 0  # the argument whose device picks the route under "auto"
    custom_op: str | None = None  # registered as torch.ops.pto_kernels.<custom_op> (None: eager only)
    mutates: tuple[str, ...] = ()  # the custom op's arguments it writes
    writes_cache: bool = False  # every call writes a static KV cache (counted as cache_writes)


@dataclass(frozen=True)
class FixedPositionOp:
    """A custom op that runs a cache-writing entry's route at a position it never advances (4.57 - 5.0:
    the attention's `cache_position`, which the layer does not own): its schema marks the caches written,
    not the position, and a call asking it to advance is refused."""

    name: str
    entry: str
    mutates: tuple[str, ...] = _CACHES


ENTRIES = (
    Entry("rms_norm", "rms_norm", custom_op="rms_norm"),
    Entry("mrope", "mrope", custom_op="mrope"),  # transformers <= 5.16: cos/sin [3, b, s, d]
    Entry("mrope_mixed", "mrope", custom_op="mrope_mixed"),  # 5.20+: section-mixed [b, s, d]
    Entry("swiglu_mlp", "swiglu_mlp", device_arg=1),  # (mlp_module, hidden_states): eager only
    Entry("swiglu_mlp_weights", "swiglu_mlp", custom_op="swiglu_mlp"),
    # a serving engine's own layers (serving_ops.py): the residual RMSNorm, the SwiGLU activation alone
    Entry("add_rms_norm", "rms_norm", custom_op="add_rms_norm"),
    Entry("silu_and_mul", "swiglu_mlp", custom_op="silu_and_mul"),
    # decoder-layer blocks
    Entry("residual_rms_norm", "residual_rms_norm", custom_op="residual_rms_norm"),
    Entry("mlp_block", "mlp_block", custom_op="mlp_block"),
    Entry("attention_prologue", "attention_prologue", custom_op="attention_prologue"),
    Entry("attention_prologue_mixed", "attention_prologue", custom_op="attention_prologue_mixed"),
    # the prologue that also writes its k and v into a static KV cache (what the cache update does next)
    # and advances the position where the release keeps one
    Entry(
        "attention_prologue_cached",
        "attention_prologue",
        custom_op="attention_prologue_cached",
        mutates=(*_CACHES, "position"),
        writes_cache=True,
    ),
    Entry(
        "attention_prologue_mixed_cached",
        "attention_prologue",
        custom_op="attention_prologue_mixed_cached",
        mutates=(*_CACHES, "position"),
        writes_cache=True,
    ),
    Entry("attention_core", "attention_core", custom_op="attention_core"),
    Entry(
        "attention_core_masked", "attention_core", custom_op="attention_core_masked"
    ),  # ranges from the mask
)
FIXED_POSITION_OPS = (
    FixedPositionOp("attention_prologue_cached_at", "attention_prologue_cached"),
    FixedPositionOp("attention_prologue_mixed_cached_at", "attention_prologue_mixed_cached"),
)

BY_NAME = {entry.name: entry for entry in ENTRIES}
# custom op name -> the entry whose route its body runs
ENTRY_OF_CUSTOM_OP = {entry.custom_op: entry.name for entry in ENTRIES if entry.custom_op} | {
    op.name: op.entry for op in FIXED_POSITION_OPS
}


def op_of(name: str) -> str:
    """The op an entry or a custom op is counted under (unknown names are returned as they are)."""
    entry = BY_NAME.get(ENTRY_OF_CUSTOM_OP.get(name, name))
    return entry.op if entry is not None else name


def _check() -> None:
    unknown = [entry.name for entry in ENTRIES if entry.op not in OPS]
    if unknown:
        raise ValueError(f"kernel entries counted under no op: {', '.join(unknown)}")
    uncached = [op.name for op in FIXED_POSITION_OPS if not BY_NAME[op.entry].writes_cache]
    if uncached:
        raise ValueError(f"fixed-position ops over an entry that writes no cache: {', '.join(uncached)}")


_check()
