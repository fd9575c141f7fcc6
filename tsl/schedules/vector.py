"""Machine-generic vector schedules for the functions no tsl kernel takes (issue #24 part 3).

A rule reads a PrimFunc's block structure and, given the machine's vector facts (`lanes`: elements
per vector register for the output dtype, `cores`), returns a scheduled `s_tir.Schedule` or None
when the function is not of its kind. Names no back end: the facts come from the back end hook.

Rules (so far):
- `injective`: spatial blocks only (element-wise / broadcast / layout glue, fused chains of them:
  the producers are inlined into the last block). Its loops are fused,
  split into (cores-parallel outer, lanes-vectorized inner), like TVM's `parallel` + `vectorize`.
- `window` (tsl.schedules.window): one sliding-window reduction (depthwise / grouped conv2d,
  max / avg pooling) with its padding and epilogue: (n, c) planes parallel, output columns in
  vectors.
- `rowwise`: blocks with reductions (softmax, layer_norm, mean, global pooling): each block's
  leading spatial loops fused and run parallel, reductions along the contiguous axis in lanes
  partial sums, all-spatial blocks vectorized along the innermost loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tir_blocks import dtype_bits, root_blocks, spatial_only
from .window import window


@dataclass(frozen=True)
class VectorFacts:
    """What a rule needs of the machine: vector lanes per dtype bits and the core count."""
    vector_bits: int
    cores: int

    def lanes(self, dtype_bits: int) -> int:
        return max(1, self.vector_bits // dtype_bits)


def injective(func, facts: VectorFacts):
    """Schedule an all-spatial PrimFunc: inline the producers, fuse the loops, parallel outer,
    vectorize inner. Returns the schedule, or None when `func` is not injective (reduction axes)."""
    from tvm import s_tir, tirx

    sch = s_tir.Schedule(func)
    blocks = root_blocks(sch)
    if not blocks or not all(spatial_only(sch, b) for b in blocks):
        return None
    # A fused chain (add -> relu): every producer is inlined into the last block, as TVM fused them.
    from tvm.s_tir.schedule import ScheduleError

    try:
        for b in blocks[:-1]:
            sch.compute_inline(b)
    except ScheduleError:   # a producer TVM cannot inline (read at several points): not this rule's
        return None
    blocks = blocks[-1:]
    loops = sch.get_loops(blocks[0])
    if not loops:
        return None
    bits = dtype_bits(sch.get(blocks[0]).writes[0].source.dtype)
    lanes = facts.lanes(bits)
    if _symbolic_outer(sch, loops, lanes):
        # A symbolic extent (a sequence length): fusing it into the whole nest makes every
        # vector a div/mod and a tail check (a 128 x 2304 transpose: 0.85 ms against 0.08 ms
        # static); the static innermost loop stays whole, in vectors, the others run parallel.
        sch.parallel(sch.fuse(*loops[:-1]))
        sch.vectorize(sch.split(loops[-1], factors=[None, lanes])[1])
        return sch
    if len(loops) > 1 and not isinstance(sch.get(loops[-1]).extent, tirx.IntImm):
        # A symbolic innermost loop (a transpose into [.., seq]): the others run parallel, it
        # stays one loop (a split by lanes would add a tail check per vector).
        sch.parallel(sch.fuse(*loops[:-1]))
        return sch
    fused = sch.fuse(*loops)
    outer, inner = sch.split(fused, factors=[None, lanes])
    sch.parallel(outer)
    sch.vectorize(inner)
    return sch


def _symbolic_outer(sch, loops, lanes: int) -> bool:
    """Some loop has a symbolic extent and the innermost one a static multiple of `lanes`."""
    from tvm import tirx

    ext = [sch.get(lp).extent for lp in loops]
    return (len(loops) > 1 and any(not isinstance(e, tirx.IntImm) for e in ext)
            and isinstance(ext[-1], tirx.IntImm) and int(ext[-1]) % lanes == 0)


def rowwise(func, facts: VectorFacts):
    """Schedule a PrimFunc with reduction blocks (softmax, layer_norm, mean, pooling) row-wise:
    every block's outermost loop, when spatial, runs parallel over the cores (one row per task),
    and every all-spatial block is vectorized along its innermost (contiguous) loop.
    Returns None when a block has no spatial outer loop to run rows over."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    blocks = root_blocks(sch)
    if not blocks:
        return None
    for b in blocks:
        loops = sch.get_loops(b)
        kinds = [iv.iter_type for iv in sch.get(b).iter_vars]
        if not loops or kinds[0] != 0:
            return None
        rows = _row_loops(kinds, len(loops))
        lanes = facts.lanes(dtype_bits(sch.get(b).writes[0].source.dtype))
        if len(loops) > 1 and all(k == 0 for k in kinds):
            symbolic = not hasattr(sch.get(loops[-1]).extent, "value")
            outer, inner = sch.split(loops[-1], factors=[None, lanes])
            sch.vectorize(inner)
            if symbolic:
                # A symbolic row (softmax over a sequence): TVM's LoopPartition peels the
                # partial vector off the end, so the others carry no bound check (left in,
                # every vector is a checked scalar loop: the (12, s, s) softmax at s = 128
                # ran 1.2 ms split, 0.73 unsplit, 0.26 partitioned; static 0.15-0.29).
                sch.annotate(outer, "pragma_loop_partition_hint", 1)
            _parallel_rows(sch, b, rows)
        elif not _vector_reduce(sch, b, lanes, rows):
            _parallel_rows(sch, b, rows)
    return sch


def _row_loops(kinds: list, n_loops: int) -> int:
    """How many outer loops are rows: the leading spatial iter vars (a batch of 1 and the
    sequence of (1, 128, 768) are both rows), the innermost loop kept for the vector. A block
    whose loops do not follow its iter vars one to one (not TE's shape) gets its outermost."""
    if n_loops != len(kinds):
        return 1
    lead = next((i for i, k in enumerate(kinds) if k != 0), len(kinds))
    return max(1, min(lead, n_loops - 1))


def _parallel_rows(sch, block, rows: int):
    """Fuse the block's `rows` outer loops into one and run it parallel over the cores."""
    loops = sch.get_loops(block)[:rows]
    sch.parallel(sch.fuse(*loops) if len(loops) > 1 else loops[0])


def _vector_reduce(sch, block, lanes: int, rows: int) -> bool:
    """Reduce along the contiguous (innermost) axis in `lanes` partial sums (rfactor): the partial
    block is vectorized over the lanes, the lanes are then summed per row. LLVM will not vectorize
    a float reduction itself (it may not reassociate). False when the loop does not split evenly
    into lanes or TVM refuses the rfactor; the block is then left row-parallel only."""
    from tvm.s_tir.schedule import ScheduleError

    loops = sch.get_loops(block)
    extent = sch.get(loops[-1]).extent
    if len(loops) < 2 or not hasattr(extent, "value") or extent.value % lanes:
        return False
    try:
        _, ki = sch.split(loops[-1], factors=[None, lanes])
        rf = sch.rfactor(ki, factor_axis=len(loops) - 1)
    except ScheduleError:
        return False
    sch.vectorize(sch.get_loops(rf)[-1])
    _parallel_rows(sch, rf, rows)
    _parallel_rows(sch, block, rows)
    return True


RULES = (injective, window, rowwise)
