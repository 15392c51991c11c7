"""Tile shapes and merge settings of the PyPTO kernels, per op and shape class, as data.

The PyPTO kernels (backends/pypto_*.py) read their tiling from `TILE_TABLE`; no tile constant lives in a kernel
body. The entries were chosen by a search under PyPTO's SIM cost model (benchmarks/tile_search.py); the
measured candidates are kept in the repository's benchmarks/tile_search.json. Every entry is run through PyPTO's
CPU interpreter against float64 references by tests/kernels/test_kernels_pypto.py.

Shape classes: "one_row" for a call of exactly 1 row where an op has such an entry, "decode" for calls of
at most DECODE_MAX_ROWS rows (tokens for RMSNorm and the MLP, batch x
sequence positions for MRoPE), "prefill" for the rest. Each (op, class, width, dtype) gets one compiled
kernel whose row axis is dynamic, so every prompt length and batch size reuses it; an entry with
`static=True` builds one kernel per row count instead (only worth it where the cost model says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

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
    down_split_k: bool = False  # down matmul: split K over cores, accumulating in global memory
    act_cols: int = 512  # SwiGLU activation vec tile: (act_rows, act_cols)
    act_rows: int | None = None  # None: row_tile (a 64-row fp32 activation tile overflows the UB)
    # decoder-layer blocks: rows per vec tile of their RMSNorm (the reduction axis, hidden, stays whole);
    # None: row_tile
    norm_rows: int | None = None
    # decoder-layer blocks: their RMSNorm's vec tiles in one task (pypto's sg_set_scope) rather than a task
    # each: at decode, fewer tasks and no waits between them; at prefill, one task would run them in series
    norm_one_task: bool = True
    # decoder-layer blocks: cube tiles of the o_proj (mlp_block) or q/k/v (attention_prologue) matmuls;
    # None: cube_k / cube_n
    proj_cube_k: tuple[int, int] | None = None
    proj_cube_n: tuple[int, int] | None = None
    # attention_core: cache positions per chunk, the unit the context is split into across cores (the
    # scores matmul's n tiles are cube_n, the P @ V matmul's k tiles down_cube_k); None: no attention
    kv_chunk: int | None = None
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


_L1_REUSE = "cube_l1_reuse_setting"

# (op, shape class, width or None for any width) -> TileConfig. From tile_search.json (cost-model cycles,
# GutenOCR shapes); the comment on each entry says what it was measured against.
TILE_TABLE: dict[tuple[str, str, int | None], TileConfig] = {
    # 1 row: 3,464 cycles, as a static 1-row kernel; 2/4/8-row tiles 3,694/4,054/5,047
    ("rms_norm", "decode", None): TileConfig(row_tile=1),
    # 2048 x 2048: 57,657 cycles; 4-row tiles 118,104, 12-row 82,640 (16 rows overflow the UB)
    ("rms_norm", "prefill", None): TileConfig(row_tile=8),
    # vision 2500 x 1280: 47,234 cycles; 8-row tiles 75,292, 16-row 75,144
    ("rms_norm", "prefill", 1280): TileConfig(row_tile=12),
    # Qwen2.5-VL-7B text width: 700 / 2048 rows 35,861 / 97,313 cycles (2.7x / 2.5x the floor); 4-row
    # tiles 36,853 / 117,190, 6-row 53,561 / 156,227; 8-row tiles overflow the UB and fail to compile
    ("rms_norm", "prefill", 3584): TileConfig(row_tile=5),
    # Qwen3-VL's q_norm / k_norm (head_dim 128, a row per head): 8 / 16 rows 3,442 / 3,442 cycles as one
    # 16-row tile; 8-row tiles 3,352 / 3,552, 1-row (the decode entry above) 4,641 / 4,641
    ("rms_norm", "decode", 128): TileConfig(row_tile=16),
    # 256 / 2048 rows: 4,582 / 5,382 cycles; 8-row tiles (the prefill entry above) 4,752 / 49,397, 32-row
    # 5,022 / 11,583, 128-row 5,339 / 6,539. 64 x 128 is a third of the 12 x 2048 tile that fits the UB
    ("rms_norm", "prefill", 128): TileConfig(row_tile=64),
    # 1 row: 13,411 cycles (13,195 with 1-row tiles, static or not); 16 rows: 13,411 vs 100,167
    ("mrope", "decode", None): TileConfig(row_tile=16),
    # 700 rows: 52,689 cycles; 64-row tiles 75,532, 32-row 141,218
    ("mrope", "prefill", None): TileConfig(row_tile=128),
    # 1 token: 225,489 cycles (1.28x the bandwidth floor); as shipped before, 64/256 tiles: 615,549;
    # L1 reuse 4: 238,202, 12: 269,676, 16: 312,558
    ("swiglu_mlp", "decode", None): TileConfig(
        row_tile=16, cube_k=(128, 512), cube_n=(128, 256), pass_settings=((_L1_REUSE, -1, 8),)
    ),
    # 128 / 700 tokens: 309,716 / 1,355,690 cycles (1.7x / 7.7x the bandwidth floor; 700 tokens is
    # 2.8x the cube's compute floor). A cube task reads its weight tiles once per cube_m rows, so 128-row
    # cube tiles read the 135 MB of weights 6 times at 700 tokens where 32-row tiles (731,726 /
    # 3,663,045) read them 22 times. L1 reuse 16: 424,673 / 1,310,528; 64-row tiles 453,675 / 2,051,484
    ("swiglu_mlp", "prefill", None): TileConfig(
        row_tile=128,
        cube_m=128,
        cube_k=(128, 512),
        cube_n=(128, 256),
        act_rows=16,
        pass_settings=((_L1_REUSE, -1, 8),),
    ),
}


# The decoder-layer blocks (residual_rms_norm, mlp_block, attention_prologue), same keys. Kept apart from
# TILE_TABLE, whose every entry the per-op interpreter tests run: these are run by
# tests/kernels/test_kernels_pypto_blocks.py. Widths are the hidden size.
# mlp_block's decode tiles (2 to 16 rows); its one-row kernel takes the same matmul and activation tiles
_MLP_BLOCK_DECODE = TileConfig(
    row_tile=16,
    norm_rows=8,
    cube_k=(256, 2048),
    cube_n=(112, 112),
    down_cube_k=(256, 2048),
    down_cube_n=(96, 96),
    proj_cube_k=(256, 2048),
    proj_cube_n=(96, 96),
    act_cols=1024,
    pass_settings=((_L1_REUSE, -1, 9), (_L1_REUSE, 0, 1)),
)
BLOCK_TILE_TABLE: dict[tuple[str, str, int | None], TileConfig] = {
    ("residual_rms_norm", "decode", None): TileConfig(row_tile=1),
    ("residual_rms_norm", "prefill", None): TileConfig(row_tile=8, norm_one_task=False),
    # 1 / 8 tokens: 189,258 / 189,258 cycles (1.01x its floor at 8 rows). Every matmul reads the whole
    # hidden width (k1 2048) into L1 at once: a copy from global memory waits ~1,450 cycles however much it
    # moves, and a task's copies run one after another, so fewer, larger copies stream its weights faster.
    # Gate/up n [112, 112]: (16 + 112) x 2048 x 2 bytes = 512 KiB of L1, L0B 56 KiB; 9 tiles a task (L1
    # reuse 9): 22 tasks on the 24 cube cores, 62,081 cycles each (as before, k [128, 1024] x n [128, 128]
    # with 8 a task: 22 of 72,572). o_proj and down n [96, 96] (448 KiB, L0B 48 KiB): 22 tasks each where
    # 128 columns gave 16 (down 44,319 cycles a task over 6 k steps, where 16 of 66,166 over 11 took 72,000
    # cycles from first start to last end). Activation tiles of 1,024 columns: 11 tasks where 512 gave 22
    # (191,539 / 191,539 with 512). As shipped before: 221,539 / 221,539 (tile_search.json). The o_proj is
    # subgraph 0: kept out of cube_l1_reuse (merged 8 at a time it ran as 2 tasks of 96,792 cycles, 16 tasks
    # of 14,386 unmerged)
    ("mlp_block", "decode", None): _MLP_BLOCK_DECODE,
    # 1 token (batch-1 decode, the OCR case), one kernel for exactly 1 row: 172,934 cycles (0.92x its byte
    # floor: the cost model moves each core's copies at ~97 B a cycle whatever the others do, with no
    # chip-wide limit; the decode entry above 189,258). Its norm task normalises one row where the decode
    # kernel's runs two 8-row tiles whatever the valid rows (12,794 cycles), and its activation and residual
    # tasks copy 1-row tiles. The decode entry's matmul tiles; with 512-column activation tiles 175,541; as
    # shipped before (every matmul k [128, 1024] x n [128, 128], L1 reuse 8) 202,533 (tile_search.json)
    ("mlp_block", "one_row", None): replace(_MLP_BLOCK_DECODE, row_tile=1, static=True, norm_rows=1),
    # prefill entries: the shapes of the swiglu_mlp prefill entry, not searched further. 128 tokens:
    # 385,013 cycles (2.04x; the SwiGLU kernel alone: 309,716); the norm as one task: 505,060
    ("mlp_block", "prefill", None): TileConfig(
        row_tile=128,
        cube_m=128,
        norm_rows=4,
        norm_one_task=False,
        cube_k=(128, 512),
        cube_n=(128, 256),
        act_rows=16,
        pass_settings=((_L1_REUSE, -1, 8), (_L1_REUSE, 0, 1)),
    ),
    # 1 token: 33,269 cycles with L0B full (64 KiB); with room for a second tile, k [128, 1024]: 36,350,
    # n [64, 128]: 55,898 (tile_search.json)
    ("attention_prologue", "decode", None): TileConfig(
        row_tile=16, norm_rows=8, cube_k=(256, 1024), cube_n=(128, 128)
    ),
    # 1 token (batch-1 decode, the OCR case), one kernel for exactly 1 row: 30,870 cycles (2.26x its floor;
    # the 16-row entry above 33,269, 2.43x). 1-row vec tiles read x once per epilogue task where 8-row RMSNorm
    # tiles read it twice (6 copies of ~1,450 cycles a task -> 5); its 20 matmul tasks end at 17,766
    # (1.30x the floor alone), its 19 epilogue tasks start 270 cycles apart and take 7,944 each
    ("attention_prologue", "one_row", None): TileConfig(
        row_tile=1, static=True, norm_rows=1, cube_k=(256, 1024), cube_n=(128, 128)
    ),
    ("attention_prologue", "prefill", None): TileConfig(
        row_tile=128,
        cube_m=128,
        norm_rows=4,
        norm_one_task=False,
        cube_k=(128, 512),
        cube_n=(128, 256),
        act_rows=16,
        pass_settings=((_L1_REUSE, -1, 8),),
    ),
    # the attention core (pypto_attention.py), 1 row, GutenOCR-3B's heads, over a cache of several chunks (the
    # merge runs): 4,096 cached positions 46,013 cycles (8.4x the K/V bytes' floor; 47,656 while the kernel
    # made its mask from the lengths). Per chunk and kv head: scores in 2 tasks (n 512), softmax, P @ V in
    # 1 task; smaller tiles spread 4 chunks x 2 heads over more tasks than cores: scores n 256 51,917, P @ V
    # n 64 49,864; 512-position chunks 53,538, 2,048 53,405 (tile_search.json). The kernel's schedule
    # (pypto_attention.schedule) takes cube_n[0] and down_cube_n[0] as the narrowest scores and P @ V tasks
    # and widens them where the batch's kv heads fill the cores
    ("attention_core", "decode", None): TileConfig(
        row_tile=16,
        norm_rows=8,
        kv_chunk=1024,
        cube_k=(64, 128),
        cube_n=(512, 1024),
        down_cube_k=(256, 1024),
        down_cube_n=(128, 128),
    ),
    # the same over a cache of one chunk (at most kv_chunk positions: three stages, no merge): each kv head's
    # scores in 8 tasks of 128 positions and its P @ V in 4 of 32 output columns, 24 cube tasks on the 24
    # cube cores where the entry above runs 6: 1,024 positions 28,338 cycles (20.8x the K/V floor; the entry
    # above 32,131, 35,012 with the mask made in the kernel); scores n 256 29,117, P @ V n 64 28,684
    ("attention_core", "one_chunk", None): TileConfig(
        row_tile=16,
        norm_rows=8,
        kv_chunk=1024,
        cube_k=(64, 128),
        cube_n=(128, 128),
        down_cube_k=(256, 1024),
        down_cube_n=(32, 32),
    ),
    # a plain projection (pypto_blocks._build_linear): the cost model's per-op decoder layer only. 1 token,
    # 2048 -> 2048 / 2048 -> 256: 17,995 / 14,714 cycles with k [128, 1024], 32 KiB of L0B; with k
    # [256, 1024] (L0B full) 17,867 / 14,586; with the swiglu entry's (128, 512) tiles and L1 reuse 8:
    # 96,992 (2 tasks); 64-column tiles: 25,519 (32 tasks, 2 waves)
    ("linear", "decode", None): TileConfig(row_tile=16, cube_k=(128, 1024), cube_n=(128, 128)),
}


def attention_core_config(rows: int, width: int, cache_len: int) -> tuple[str, TileConfig]:
    """The attention core's class and TileConfig: "one_chunk" where the decode entry's chunk holds the whole
    cache (no merge: the chunk's work is spread over the cores instead), else tile_config's."""
    klass, config = tile_config("attention_core", rows, width)
    one_chunk = BLOCK_TILE_TABLE.get(("attention_core", "one_chunk", None))
    if klass == "decode" and one_chunk is not None and cache_len <= config.kv_chunk:
        return "one_chunk", one_chunk
    return klass, config


def shape_class(rows: int) -> str:
    return "decode" if rows <= DECODE_MAX_ROWS else "prefill"


def tile_config(op: str, rows: int, width: int) -> tuple[str, TileConfig]:
    """The shape class of a call with `rows` rows and its TileConfig (a width-specific entry wins); an op
    with a "one_row" entry gets it for exactly 1 row (a kernel of its own: static, 1-row tiles)."""
    klass = "one_row" if rows == 1 and (op, "one_row", None) in BLOCK_TILE_TABLE else shape_class(rows)
    table = BLOCK_TILE_TABLE if (op, klass, None) in BLOCK_TILE_TABLE else TILE_TABLE
    config = table.get((op, klass, width)) or table[(op, klass, None)]
    return klass, config
