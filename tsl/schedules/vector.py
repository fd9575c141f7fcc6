"""Machine-generic vector schedules for the functions no tsl kernel takes (issue #24 part 3).

A rule reads a PrimFunc's block structure and, given the machine's vector facts (`lanes`: elements
per vector register for the output dtype, `cores`), returns a scheduled `s_tir.Schedule` or None
when the function is not of its kind. Names no back end: the facts come from the back end hook.

Rules (so far):
- `transpose` (tsl.schedules.transpose): one copy swapping two runs of axes (a layout
  conversion, NCHW <-> NHWC): tiles of lanes x lanes, or the input's rows in vectors.
- `injective`: spatial blocks only (element-wise / broadcast / layout glue, fused chains of them:
  the producers are inlined into the last block). Its loops are fused,
  split into (cores-parallel outer, lanes-vectorized inner), like TVM's `parallel` + `vectorize`.
- `window` (tsl.schedules.window): one sliding-window reduction (depthwise / grouped conv2d,
  max / avg pooling) with its padding and epilogue: (n, c) planes parallel, output columns in
  vectors. `channels_window` (same module): a window over channels-last data (NHWC max /
  avg pooling, depthwise conv with its epilogue, the mean over H, W): rows parallel, a vector
  of channels reduced over the window in a register.
- `rowwise`: blocks with reductions (softmax, layer_norm, mean, global pooling): all blocks
  computed row by row inside one parallel loop over the rows of the last block (single-consumer
  element-wise blocks inlined), reductions along the contiguous axis in lanes partial sums,
  element-wise blocks vectorized along the row (symbolic rows too: their reductions padded to
  whole vectors, `tsl.schedules.guarded`; a row's intermediates, of run-time length, sized
  by the back end at the symbol's bound, `UPPER_BOUNDS`); where TVM cannot nest a block so,
  each block's leading spatial loops fused and run parallel on their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .guarded import pad_reductions
from .tir_blocks import dtype_bits, root_blocks, spatial_only
from .transpose import transpose
from .window import channels_window, window


# A scheduled function's attribute: symbol name -> its largest value (the Relax graph's
# `tir_var_upper_bound`), so that a back end can size a buffer of run-time extent at its bound
# (a row on the stack, not a workspace allocated per row).
UPPER_BOUNDS = "tsl.upper_bounds"

ELEMENTS_TOGETHER = "tsl.elements_together"
"""A block annotation: the block's outermost axis enumerates values computed from the same
inputs (the 16 elements of a Winograd input tile). `injective` runs that axis inside the
parallel loop over the others, so that a tile's inputs are read once, from L1, for all of them:
ResNet-18 0.90x (0.87, 0.94) the time with the axis outermost (each pass re-reading the input
from memory, 56x56x64: 0.37 ms a call against 0.22)."""


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
        if _padding_peeled(sch, blocks[0], loops, lanes, facts.cores):
            return sch
        # A symbolic extent (a sequence length): fusing it into the whole nest makes every
        # vector a div/mod and a tail check (a 128 x 2304 transpose: 0.85 ms against 0.08 ms
        # static); the static innermost loop stays whole, in vectors, the others run parallel.
        sch.parallel(sch.fuse(*loops[:-1]))
        sch.vectorize(sch.split(loops[-1], factors=[None, lanes])[1])
        return sch
    if len(loops) > 1 and not isinstance(sch.get(loops[-1]).extent, tirx.IntImm):
        if _symbolic_columns_tiled(sch, loops, lanes, facts.cores):
            return sch
        # A symbolic innermost loop not tiled so (two loops, or too few before it): the others
        # run parallel, it stays one loop (a split by lanes would add a tail check per vector).
        sch.parallel(sch.fuse(*loops[:-1]))
        return sch
    ext = [sch.get(lp).extent for lp in loops]
    if all(isinstance(e, tirx.IntImm) for e in ext):   # two rules for static nests
        ext = [int(e) for e in ext]
        if (_padded_gather(sch, blocks[0], loops, ext, lanes, facts.cores)
                or _rows_of_wider_reads(sch, blocks[0], loops, ext, lanes)):
            return sch
    fused = sch.fuse(*loops)
    outer, inner = sch.split(fused, factors=[None, lanes])
    sch.parallel(outer)
    sch.vectorize(inner)
    return sch


def _padded_gather(sch, block, loops, ext: list, lanes: int, cores: int) -> bool:
    """A padded gather (Winograd's input transform) of static extents `ext`, the innermost a
    multiple of `lanes`: the outer loops fused parallel, the innermost split by lanes alone.
    Fused with the outer loops, its vectors' bound checks were not proven uniform and ran as
    scalars (25-49 ms against 0.23 ms at 56x56x64); split alone, each vector's check is one
    branch on the outer loops' variables. A block annotated `ELEMENTS_TOGETHER` runs its
    outermost loop inside the parallel one, unrolled inside each vector's loop: the elements'
    reads of one vector are the same few loads, shared once unrolled (Winograd F(4x4, 3x3)'s
    36 elements read 36 values of a tile: 56x56x64 0.046 ms a call against 0.090 with the
    elements looped; F(2x2, 3x3) at 14x14x256 0.017 against 0.024, at 56x56x64 0.095 against
    0.082). False, nothing done, otherwise."""
    if not _pads(sch.get(block)) or ext[-1] % lanes or math.prod(ext[:-1]) < cores:
        return False
    outer = loops[:-1]
    together = (ELEMENTS_TOGETHER in sch.get(block).annotations and len(loops) > 2
                and math.prod(ext[1:-1]) >= cores)
    if together:
        sch.reorder(*loops[1:-1], loops[0])
        outer = loops[1:-1]
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    vectors, lane = sch.split(loops[-1], factors=[None, lanes])
    sch.vectorize(lane)
    if together:
        sch.reorder(vectors, loops[0])
        sch.unroll(loops[0])
    return True


def _rows_of_wider_reads(sch, block, loops, ext: list, lanes: int) -> bool:
    """A copy between rows of different widths (the swap's crop of a conv's padded output
    channels, (1, 56, 56, 32) -> (1, 56, 56, 24)): with every loop fused, an output vector
    spans rows, and each lane is a gather (a div and a mod per lane): that crop took 64 us on
    a 2-core Zen 4, 28x28 48 -> 40 channels 36 us on 8 lanes. Here the rows run parallel
    (fused) and each row is copied in vectors of the largest power of two that divides it, up
    to `lanes` (8 of 24 channels), or as a loop of its own where that is under 4: 21 and 22 us
    (each a call from Python, ~10 us of it the call; benchmarks/README.md "mnv44"). `ext`: the
    loops' static extents. False, nothing done, where every read's rows are the output's
    (element-wise, broadcast)."""
    out = sch.get(block).writes[0].source
    row = getattr(out.shape[-1], "value", None)
    if not any(r.source.shape and not r.source.same_as(out)
               and getattr(r.source.shape[-1], "value", None) not in (1, row)
               for r in sch.get(block).reads):
        return False
    if len(loops) > 1 and math.prod(ext[:-1]) > 1:
        sch.parallel(sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0])
    width = math.gcd(ext[-1], lanes)
    if width >= 4:
        sch.vectorize(sch.split(loops[-1], factors=[None, width])[1])
    return True


def _padding_peeled(sch, block, loops, lanes: int, cores: int) -> bool:
    """A pack padded along a symbolic extent (the scores' B, (12, 64, s) into 32-column panels:
    `if_then_else(j < s, x[min(j, s - 1)], 0)`): the static loops before the first symbolic one
    run parallel, the symbolic ones get TVM's LoopPartition hint so that every panel but the
    last drops the check and the clamp (fused into the parallel loop, every vector was a gather
    under a check: 0.10 ms at s = 128 against 0.03 peeled). False, nothing done, where the
    block pads nothing or the static loops are fewer than the cores."""
    ext = [sch.get(lp).extent for lp in loops]
    lead = next(i for i, e in enumerate(ext) if not hasattr(e, "value"))
    if not lead or math.prod(int(e) for e in ext[:lead]) < cores or not _pads(sch.get(block)):
        return False
    sch.parallel(sch.fuse(*loops[:lead]) if lead > 1 else loops[0])
    for lp, e in zip(loops[lead:-1], ext[lead:-1]):
        if not hasattr(e, "value"):
            sch.annotate(lp, "pragma_loop_partition_hint", 1)
    sch.vectorize(sch.split(loops[-1], factors=[None, lanes])[1])
    return True


def _symbolic_columns_tiled(sch, loops, lanes: int, cores: int) -> bool:
    """A transpose into a symbolic innermost extent (the attention's K heads, (12, 64, s) from
    the (s, 2304) projections): the columns in vectors of lanes, the static loop before them
    inside each vector's loop, so that a tile's `lanes` input rows are read while in L1 and
    each output vector is one store; the loops before run parallel, the last partial vector
    peeled off (LoopPartition hint). Row by row, a scalar loop, the layer's K heads took
    0.121 ms at s = 128 against 0.036 so. False, nothing done, where the loops before the
    static one are symbolic or fewer than the cores."""
    ext = [sch.get(lp).extent for lp in loops]
    if (len(loops) < 3 or not all(hasattr(e, "value") for e in ext[:-1])
            or math.prod(int(e) for e in ext[:-2]) < cores):
        return False
    col, lane = sch.split(loops[-1], factors=[None, lanes])
    sch.reorder(col, loops[-2], lane)
    sch.parallel(sch.fuse(*loops[:-2]) if len(loops) > 3 else loops[0])
    sch.vectorize(lane)
    sch.annotate(col, "pragma_loop_partition_hint", 1)
    return True


def _pads(block) -> bool:
    """The block's value is chosen by a condition (`if_then_else`): a pad's bound check."""
    import tvm
    import tvm_ffi

    found = []
    tvm_ffi.structural_walk(block.body, [(tvm.ir.Call, lambda c, *_: found.append(
        getattr(c.op, "name", "").endswith("if_then_else")))], order="pre")
    return any(found)


def _symbolic_outer(sch, loops, lanes: int) -> bool:
    """Some loop has a symbolic extent and the innermost one a static multiple of `lanes`."""
    from tvm import tirx

    ext = [sch.get(lp).extent for lp in loops]
    return (len(loops) > 1 and any(not isinstance(e, tirx.IntImm) for e in ext)
            and isinstance(ext[-1], tirx.IntImm) and int(ext[-1]) % lanes == 0)


def rowwise(func, facts: VectorFacts):
    """Schedule a PrimFunc with reduction blocks (softmax, layer_norm, mean, pooling) row-wise.
    Preferably all blocks in one parallel loop over the rows (`_fused_rows`); where TVM cannot
    place them there, every block on its own (`_rows_per_block`). None when a block has no
    spatial outer loop to run rows over."""
    from tvm import s_tir
    from tvm.s_tir.schedule import ScheduleError

    sch = s_tir.Schedule(func)
    blocks = root_blocks(sch)
    if not blocks or any(not sch.get_loops(b) or sch.get(b).iter_vars[0].iter_type != 0
                         for b in blocks):
        return None
    try:
        return _fused_rows(s_tir.Schedule(func), facts)
    except ScheduleError:
        return _rows_per_block(sch, facts)


def _fused_rows(sch, facts: VectorFacts):
    """The blocks computed row by row inside the last block's parallel row loop: the
    single-consumer spatial blocks inlined (softmax's x - max into its exp; a mask's compare,
    not and cast into the max over them), the others placed under the row loop
    (`compute_at`), so that a row's intermediates stay in L1 (TVM allocates them per row) where
    block by block each is a whole tensor written and read back. Reductions are summed in lanes
    (`_lane_partials`), spatial blocks vectorized along the row. Raises ScheduleError where a
    block cannot be placed so (the caller falls back)."""
    from tvm import s_tir
    from tvm.s_tir.schedule import ScheduleError

    for b in root_blocks(sch)[:-1]:
        if spatial_only(sch, b) and len(sch.get_consumers(b)) == 1:
            sch.compute_inline(b)
    # Reductions over a row of run-time length padded to whole vectors, their bound check in
    # their bodies (`guarded`: a split's would be lost by `compute_at`); after the inlining,
    # which would recompute their reads' regions without the check.
    padded, names = pad_reductions(
        sch.mod["main"], lambda b: facts.lanes(dtype_bits(b.writes[0].source.dtype)))
    if names:
        sch = s_tir.Schedule(padded)
    last = root_blocks(sch)[-1]
    kinds = [iv.iter_type for iv in sch.get(last).iter_vars]
    if len(sch.get_loops(last)) != len(kinds) or len(kinds) < 2:
        raise ScheduleError("not TE's loop nest: rows unknown")
    rows = _row_loops(kinds, len(kinds))   # read before the rfactor reorders its iter vars
    partials = {sch.get(p).name_hint for b in root_blocks(sch) if not spatial_only(sch, b)
                for p in [_lane_partials(sch, b, facts)] if p is not None}
    blocks = root_blocks(sch)
    row = sch.fuse(*sch.get_loops(blocks[-1])[:rows])
    for b in reversed(blocks[:-1]):
        sch.compute_at(b, row, preserve_unit_loops=False)
    sch.parallel(row)
    for b in blocks:
        inner = sch.get_loops(b)[1:]
        if sch.get(b).name_hint in partials:   # the lanes loop last, in one vector
            lane = next(lp for lp in inner
                        if _extent(sch, lp) == _lanes(sch, b, facts))
            sch.reorder(*[lp for lp in inner if lp != lane], lane)
            sch.vectorize(lane)
            if _extent(sch, sch.get_loops(b)[-2]) is None:   # a padded row (`guarded`)
                _unchecked_partials(sch, b)
        elif spatial_only(sch, b) and inner and _extent(sch, inner[-1]) != 1:
            outer, lane = sch.split(inner[-1], factors=[None, _lanes(sch, b, facts)])
            sch.vectorize(lane)
            _partition_symbolic(sch, outer)
    return sch


def _extent(sch, loop):
    """The loop's extent, None where it is symbolic."""
    return getattr(sch.get(loop).extent, "value", None)


def _partition_symbolic(sch, loop):
    """TVM's LoopPartition hint on `loop` where its extent is symbolic: the vector that
    crosses the row's end peeled off, every whole vector unchecked (see `_rows_per_block`)."""
    if _extent(sch, loop) is None:
        sch.annotate(loop, "pragma_loop_partition_hint", 1)


def _lanes(sch, block, facts: VectorFacts) -> int:
    return facts.lanes(dtype_bits(sch.get(block).writes[0].source.dtype))


def _lane_partials(sch, block, facts: VectorFacts):
    """The block's innermost (reduction) loop split into lanes partial results (rfactor), the
    new block of partials returned; None when the loop does not split evenly into lanes."""
    lanes = _lanes(sch, block, facts)
    loop = sch.get_loops(block)[-1]
    extent = sch.get(loop).extent
    if not (_whole_vectors(extent, lanes) if not hasattr(extent, "value")   # `guarded`'s
            else extent.value % lanes == 0 and extent.value != lanes):
        return None
    _, ki = sch.split(loop, factors=[None, lanes])
    return sch.rfactor(ki, factor_axis=len(sch.get(block).writes[0].source.shape))


def _whole_vectors(extent, lanes: int) -> bool:
    """Whether a symbolic extent is provably a multiple of `lanes` (a split then has no
    predicate for `compute_at` to drop)."""
    from tvm import tirx
    from tvm.sym.analyzer import Analyzer

    return Analyzer().can_prove_equal(tirx.floormod(extent, lanes), 0)


def _rows_per_block(sch, facts: VectorFacts):
    """Every block's outermost loop, when spatial, runs parallel over the cores (one row per
    task), and every all-spatial block is vectorized along its innermost (contiguous) loop."""
    for b in root_blocks(sch):
        loops = sch.get_loops(b)
        kinds = [iv.iter_type for iv in sch.get(b).iter_vars]
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
    a float reduction itself (it may not reassociate). A row of run-time length (a softmax over
    the sequence) is split too, its partial vector peeled off (`_unchecked_partials`). False
    when a static loop does not split evenly into lanes, a symbolic innermost loop is not the
    reduction, or TVM refuses the rfactor; the block is then left row-parallel only."""
    from tvm.s_tir.schedule import ScheduleError

    loops = sch.get_loops(block)
    extent = sch.get(loops[-1]).extent
    symbolic = not hasattr(extent, "value")
    if len(loops) < 2 or (extent.value % lanes if not symbolic
                          else sch.get(block).iter_vars[-1].iter_type != 2):
        return False
    try:
        _, ki = sch.split(loops[-1], factors=[None, lanes])
        rf = sch.rfactor(ki, factor_axis=len(loops) - 1)
    except ScheduleError:
        return False
    sch.vectorize(sch.get_loops(rf)[-1])
    _parallel_rows(sch, rf, rows)
    if symbolic:
        _unchecked_partials(sch, rf)
    _parallel_rows(sch, block, rows)
    return True


def _unchecked_partials(sch, rf):
    """The lanes partials of a symbolic row (every vector under a bound check: the split's, or
    the `if_then_else` of a row padded by `guarded`): their init taken out of the row's loop,
    where a split's check guarded it (a row shorter than the lanes left lanes uninitialized:
    NaN at s = 5) and where TVM's LoopPartition would peel the first vector for the init's
    `k == 0` instead of the row's end (every vector but the first then a checked scalar
    loop), and the loop partitioned (see `_rows_per_block`) so that whole vectors run
    unchecked, the partial one peeled off."""
    outer = sch.get_loops(rf)[-2]
    init = sch.decompose_reduction(rf, outer)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.annotate(outer, "pragma_loop_partition_hint", 1)


RULES = (transpose, injective, window, channels_window, rowwise)
