"""Shared-memory layouts of the sm_90 GEMM kernel (`hopper.py`): the TMA boxes that fill a
pipeline stage, the 128-byte swizzle they are written with, and the wgmma matrix descriptors
that read them back. Plain integers, no TVM: the kernel generator takes every number from
here, and tests/test_tensorcore_sm90.py checks them against a reimplementation of the PTX
ISA's canonical layouts.

A stage holds a BM x 64 tile of A and a BN x 64 tile of B (64 two-byte elements of k = one
128-byte row, the widest row the 128-byte swizzle allows):

    A, [M, K] row-major ("K-major"):  BM rows of 128 B; one TMA box (64 k, BM rows)
    B, [N, K] (dense weights, K-major): BN rows of 128 B; one TMA box (64 k, BN rows)
    B, [K, N] (matmul, "MN-major"):   BN / 64 chunks, each 64 k-rows of 128 B (64 n); one TMA
                                      box (64 n, 64 k) per chunk, chunk j at j * 8 KiB

The TMA writes the 16-byte unit u of row r of a box (row = 128 B) to unit u ^ (r % 8) (the
swizzle is a function of the shared address bits [4:7) ^ [7:10), so every stage starts at a
multiple of 1024 B). wgmma reads a descriptor (start address, leading- and stride-dimension
byte offsets LBO / SBO in 16-byte units, swizzle mode) and applies the same XOR.
"""

from __future__ import annotations

from dataclasses import dataclass

ROW_BYTES = 128  # one swizzled row: 64 fp16/bf16 elements
ATOM_BYTES = 8 * ROW_BYTES  # 8 rows: the period of the 128-byte swizzle
BLOCK_K = ROW_BYTES // 2  # k elements per pipeline stage (2-byte types)
WGMMA_K = 16  # k of one wgmma.mma_async m64nNk16 (f16 / bf16)
WGMMA_M = 64  # rows of one warpgroup's wgmma
SWIZZLE_128B = 3  # TVM's encode_matrix_descriptor / CU_TENSOR_MAP_SWIZZLE_128B enum value


@dataclass(frozen=True)
class Descriptor:
    """The fields of a wgmma shared-memory matrix descriptor (offsets in bytes)."""

    start: int  # byte offset of the matrix in shared memory
    lbo: int  # leading-dimension byte offset
    sbo: int  # stride-dimension byte offset
    k_major: bool

    def encoded(self) -> tuple[int, int]:
        """(LBO, SBO) as the descriptor stores them: 16-byte units."""
        return self.lbo // 16, self.sbo // 16


def swizzle(offset: int) -> int:
    """Where the 128-byte swizzle puts byte `offset` of a 1024-byte aligned region."""
    return offset ^ (((offset >> 7) & 7) << 4)


def a_descriptor(stage_base: int, warpgroup: int, kk: int) -> Descriptor:
    """A (K-major) of consumer warpgroup `warpgroup` (its 64 rows) at k-slice `kk` (16 k)."""
    return Descriptor(stage_base + warpgroup * WGMMA_M * ROW_BYTES + kk * WGMMA_K * 2,
                      16, ATOM_BYTES, True)


def b_descriptor(stage_base: int, kk: int, k_major: bool) -> Descriptor:
    """B at k-slice `kk`: K-major ([N, K]) advances 32 B within the rows; MN-major ([K, N])
    advances 16 k-rows, and its 64-wide n chunks are BLOCK_K rows apart (LBO)."""
    if k_major:
        return Descriptor(stage_base + kk * WGMMA_K * 2, 16, ATOM_BYTES, True)
    return Descriptor(stage_base + kk * WGMMA_K * ROW_BYTES, BLOCK_K * ROW_BYTES, ATOM_BYTES,
                      False)


def b_boxes(block_n: int, k_major: bool) -> list[tuple[int, int]]:
    """(shared byte offset in the stage, n offset in the tile) of each TMA box of B."""
    if k_major:
        return [(0, 0)]
    return [(j * BLOCK_K * ROW_BYTES, j * 64) for j in range(block_n // 64)]


def accumulator(i: int, lane: int, warp: int) -> tuple[int, int]:
    """(row, column) in the warpgroup's 64 x N tile of f32 accumulator register `i` of `lane`
    in warp `warp` (0..3) of the warpgroup (m64nNk16 D fragment)."""
    return (16 * warp + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2)


def tensor_maps(p) -> list[dict]:
    """The two CUtensorMaps the kernel takes (its first parameters, by value as
    `const __grid_constant__ CUtensorMap`), as cuTensorMapEncodeTiled's arguments: encoded on
    the host from the A and B device pointers before the launch."""
    b_dims = [p.k, p.n] if p.b_k_major else [p.n, p.k]
    b_box = [BLOCK_K, p.block_n] if p.b_k_major else [64, BLOCK_K]
    common = {"dtype": p.dtype, "rank": 2, "element_strides": [1, 1], "interleave": 0,
              "swizzle": SWIZZLE_128B, "l2_promotion": 0, "oob_fill": 0}
    return [{"tensor": "A", "dims": [p.k, p.m], "strides_bytes": [p.k * 2],
             "box": [BLOCK_K, p.block_m]} | common,
            {"tensor": "B", "dims": b_dims, "strides_bytes": [b_dims[0] * 2], "box": b_box}
            | common]
