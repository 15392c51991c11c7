"""Tile shapes and merge settings of the PyPTO kernels, per op and shape class, as data.

The kernels in pypto_kernels.py read their tiling from `TILE_TABLE`; no tile constant lives in a kernel
body. The entries were chosen by a search under PyPTO's SIM cost model (benchmarks/tile_search.py); the
measured candidates are kept next to this file in tile_search.json. Every entry is run through PyPTO's
CPU interpreter against float64 references by tests/kernels/test_kernels_pypto.py.

Shape classes: "decode" for calls of at most DECODE_MAX_ROWS rows (tokens for RMSNorm and the MLP, batch x
sequence positions for MRoPE), "prefill" for the rest. Each (op, class, width, dtype) gets one compiled
kernel whose row axis is dynamic, so every prompt length and batch size reuses it; an entry with
`static=True` builds one kernel per row count instead (only worth it where the cost model says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DECODE_MAX_ROWS = 16


@dataclass(frozen=True)
class TileConfig:
    """How one kernel is tiled. Widths not named here (hidden, head_dim, intermediate) stay whole."""

    row_tile: int  # rows per step of the kernel's loop over the row axis
    static: bool = False  # True: one kernel per row count (no dynamic axis)
    # matmuls: set_cube_tile_shapes([m, m], [k0, k1], [n0, n1]) for gate/up and for down
    cube_m: int = 16
    cube_k: tuple[int, int] = (64, 256)
    cube_n: tuple[int, int] = (64, 256)
    down_cube_k: tuple[int, int] | None = None  # None: same as cube_k
    down_cube_n: tuple[int, int] | None = None  # None: same as cube_n
    act_cols: int = 512  # SwiGLU activation vec tile: (row_tile, act_cols)
    # pypto pass_options merge settings, e.g. (("cube_l1_reuse_setting", -1, 4),)
    pass_settings: tuple[tuple[str, int, int], ...] = field(default=())

    @classmethod
    def from_dict(cls, data: dict) -> TileConfig:
        """From `dataclasses.asdict` output that went through JSON (lists back to tuples)."""
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        fields["pass_settings"] = tuple(tuple(s) for s in fields.get("pass_settings", ()))
        return cls(**fields)

    def pass_options(self) -> dict | None:
        options: dict[str, dict[int, int]] = {}
        for name, scope, count in self.pass_settings:
            options.setdefault(name, {})[scope] = count
        return options or None


# (op, shape class, width or None for any width) -> TileConfig
TILE_TABLE: dict[tuple[str, str, int | None], TileConfig] = {
    ("rms_norm", "decode", None): TileConfig(row_tile=1),
    ("rms_norm", "prefill", None): TileConfig(row_tile=8),
    ("mrope", "decode", None): TileConfig(row_tile=1),
    ("mrope", "prefill", None): TileConfig(row_tile=16),
    ("swiglu_mlp", "decode", None): TileConfig(row_tile=16),
    ("swiglu_mlp", "prefill", None): TileConfig(row_tile=32, cube_m=32),
}


def shape_class(rows: int) -> str:
    return "decode" if rows <= DECODE_MAX_ROWS else "prefill"


def tile_config(op: str, rows: int, width: int) -> tuple[str, TileConfig]:
    """The shape class of a call with `rows` rows and its TileConfig (a width-specific entry wins)."""
    klass = shape_class(rows)
    config = TILE_TABLE.get((op, klass, width)) or TILE_TABLE[(op, klass, None)]
    return klass, config
