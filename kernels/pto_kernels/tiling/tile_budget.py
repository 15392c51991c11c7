"""What a kernel's matmul tiles take of the AI Core's buffers, by PyPTO's documented formulas; over budget
is refused before pypto compiles.

PyPTO's cost model (SIM) and its CPU interpreter accept tilings that do not fit the chip, so an entry can
simulate well and still fail, or fault, at its first NPU compile. The formulas are those of PyPTO's
`set_cube_tile_shapes` documentation (hicann/pypto docs/api/config/pypto-set_cube_tile_shapes.md, space
constraints for fp16 / bf16 / fp32 inputs; the accumulator is fp32), for tiles
`set_cube_tile_shapes([mL0, mL1], [kL0, kL1], [nL0, nL1])`:

    L0A  align16(mL0) * align16(kL0) * in_bytes                                   <= 64 KiB
    L0B  align16(nL0) * align16(kL0) * in_bytes                                   <= 64 KiB
    L0C  align16(mL0) * align16(nL0) * 4                                          <= 128 KiB
    L1   align16(mL1) * align16(kL1) * in_bytes + align16(nL1) * align16(kL1) * in_bytes <= 512 KiB

with each L0 size at most its L1 size and dividing it. PyPTO's matmul performance guide
(docs/tutorials/debug/matmul_performance_guide.md) adds that L0A / L0B tiles of at most 32 KiB, half the
buffer, leave room for double buffering (the next tile loads while the cube works on this one).
Sizes: Ascend 910B (A2) and A3, as PyPTO's lib/configs/A2A3.ini gives them.

Where the matrix is smaller than a tile (a narrow test model), the tile covers the matrix only: `dims`
clips each tile to the matrix, rounded up to whole 16-element blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tile_table import TileConfig

BLOCK = 16  # elements: the cube's fractal, to which each tile dimension is rounded up
ACCUMULATOR_BYTES = 4  # fp32 in L0C for fp16 / bf16 / fp32 inputs


@dataclass(frozen=True)
class Buffers:
    """One AI Core's cube buffers, in bytes."""

    chip: str
    l0a: int
    l0b: int
    l0c: int
    l1: int


A2A3 = Buffers(chip="Ascend910B (A2/A3)", l0a=64 * 1024, l0b=64 * 1024, l0c=128 * 1024, l1=512 * 1024)


@dataclass(frozen=True)
class CubeTiles:
    """One matmul's tiles: (L0, L1) per axis, as `set_cube_tile_shapes` takes them."""

    matmul: str  # which of the kernel's matmuls, e.g. "gate/up"
    m: tuple[int, int]
    k: tuple[int, int]
    n: tuple[int, int]


def cube_tiles(op: str, config: TileConfig) -> list[CubeTiles]:
    """The matmuls `op`'s kernel runs under `config` (none for the vector-only kernels)."""
    m = (config.cube_m, config.cube_m)
    main = CubeTiles("gate/up", m, config.cube_k, config.cube_n)
    down = CubeTiles("down", m, config.down_cube_k or config.cube_k, config.down_cube_n or config.cube_n)
    proj = CubeTiles(
        "projection", m, config.proj_cube_k or config.cube_k, config.proj_cube_n or config.cube_n
    )
    return {
        "swiglu_mlp": [main, down],
        "mlp_block": [CubeTiles("o_proj", m, proj.k, proj.n), main, down],
        "attention_prologue": [CubeTiles("q/k/v", m, proj.k, proj.n)],
        "linear": [proj],
        "attention_core": [
            CubeTiles("scores", m, config.cube_k, config.cube_n),
            CubeTiles("P @ V", m, down.k, down.n),
        ],
    }.get(op, [])


def _align(value: int) -> int:
    return -(-value // BLOCK) * BLOCK


def footprint(tiles: CubeTiles, in_bytes: int, dims: tuple[int, int, int] | None = None) -> dict[str, int]:
    """Bytes of L0A, L0B, L0C and L1 that `tiles` take for inputs of `in_bytes` a value; `dims` (M, K, N),
    the matmul's own sizes, clip tiles larger than the matrix."""
    (m0, m1), (k0, k1), (n0, n1) = tiles.m, tiles.k, tiles.n
    if dims is not None:
        cap_m, cap_k, cap_n = (_align(d) for d in dims)
        m0, m1, k0, k1 = min(m0, cap_m), min(m1, cap_m), min(k0, cap_k), min(k1, cap_k)
        n0, n1 = min(n0, cap_n), min(n1, cap_n)
    m0, m1, k0, k1, n0, n1 = (_align(v) for v in (m0, m1, k0, k1, n0, n1))
    return {
        "l0a": m0 * k0 * in_bytes,
        "l0b": n0 * k0 * in_bytes,
        "l0c": m0 * n0 * ACCUMULATOR_BYTES,
        "l1": (m1 * k1 + n1 * k1) * in_bytes,
    }


def _shape_problems(tiles: CubeTiles) -> list[str]:
    found = []
    for axis, (l0, l1) in (("m", tiles.m), ("k", tiles.k), ("n", tiles.n)):
        if l0 <= 0 or l0 > l1 or l1 % l0:
            found.append(
                f"{tiles.matmul}: {axis}L0 {l0} must be positive, at most {axis}L1 {l1} and divide it"
            )
    return found


def problems(
    op: str,
    config: TileConfig,
    in_bytes: int = 2,
    buffers: Buffers = A2A3,
    dims: dict[str, tuple[int, int, int]] | None = None,
) -> list[str]:
    """Each way `op`'s matmul tiles under `config` break the documented budgets, one line each (empty: fits).

    dims: matmul name -> its (M, K, N), to clip tiles to the matrix; None checks the tiles as they are
    (any width), which is how the tile tables are held to the budgets."""
    found = []
    for tiles in cube_tiles(op, config):
        found += _shape_problems(tiles)
        used = footprint(tiles, in_bytes, None if dims is None else dims.get(tiles.matmul))
        for buffer, size in used.items():
            limit = getattr(buffers, buffer)
            if size > limit:
                found.append(
                    f"{tiles.matmul}: {buffer.upper()} {size // 1024} KiB over the {limit // 1024} KiB of an"
                    f" {buffers.chip} (m {list(tiles.m)}, k {list(tiles.k)}, n {list(tiles.n)}, {in_bytes}-byte inputs)"
                )
    return found


def double_buffered(op: str, config: TileConfig, in_bytes: int = 2, buffers: Buffers = A2A3) -> bool:
    """True when every matmul's L0A and L0B tiles take at most half their buffer (room for a second one)."""
    for tiles in cube_tiles(op, config):
        used = footprint(tiles, in_bytes)
        if used["l0a"] > buffers.l0a // 2 or used["l0b"] > buffers.l0b // 2:
            return False
    return True


class TileBudgetError(ValueError):
    """A tiling that does not fit the chip's buffers: refused before pypto compiles it."""


def check(op: str, config: TileConfig, in_bytes: int, dims: dict[str, tuple[int, int, int]]) -> None:
    """Raise TileBudgetError naming each overflow of `op`'s tiles at these matmul sizes."""
    found = problems(op, config, in_bytes, dims=dims)
    if found:
        raise TileBudgetError(f"pypto {op} tiling does not fit the chip: {'; '.join(found)}")
