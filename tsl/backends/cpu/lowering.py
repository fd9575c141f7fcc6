"""How the shared schedule's steps become s_tir calls on an LLVM CPU."""

from __future__ import annotations

import math

from ...errors import LoweringError
from ...lower import LowerContext, Lowering
from ...primitives.layout import Blocked
from ...primitives.schedule import Loop
from ...tam.machine import dtype_bytes
from . import intrinsics


def _accumulator_blocks(op, p):
    """The index map that keeps the register tile in the primitive's output blocks, or None
    where the operator's own layout already does. Channels go innermost in NCHW (NCHWc) so
    that the primitive's n lanes are contiguous; a primitive of m > 1 rows (smmla's 2x2)
    gets its m x n block contiguous, rows (output pixels for conv2d) outer. The epilogue
    writes the blocks back to the operator's layout."""
    m, n = p.m, p.n
    if op.name == "conv2d":
        if op.params["layout"] == "NCHW":
            if m == 1:
                return lambda b, k, h, w: (b, k // n, h, w, k % n)
            return lambda b, k, h, w: (b, k // n, h, w // m, w % m, k % n)
        if m == 1:
            return None
        return lambda b, h, w, k: (b, h, w // m, k // n, w % m, k % n)
    if m == 1:
        return None
    return lambda *ix: (*ix[:-2], ix[-2] // m, ix[-1] // n, ix[-2] % m, ix[-1] % n)


def _rows_before_columns(ctx: LowerContext, prim_loops) -> None:
    """A primitive of m > 1 rows is described over (rows, columns, reduction) block
    iterators in that order; NCHW conv2d's block iterates output channels (columns) before
    output pixels (rows), so its iterators are reordered (the loops stay as they are)."""
    s = ctx.tsl
    names = [a.name for a in ctx.op.axes]
    row = names.index(next(lp for lp in prim_loops if s.role_of(lp.axes[0]) == "m").axes[0])
    col = names.index(next(lp for lp in prim_loops if s.role_of(lp.axes[0]) == "n").axes[0])
    if row > col:
        order = list(range(len(names)))
        order.remove(row)
        order.insert(col, row)
        ctx.sch.reorder_block_iter_var(ctx.block, order)


def _merge_reduction_blocks(ctx: LowerContext, loops) -> None:
    """Run as one loop each pair of loops that split one reduction axis and sit one in the
    other, with nothing but loops of one iteration between them (a 1x1 window's r and s).
    On a CPU the inner one only sizes the tiles the caches keep (nothing is staged between
    them), so the access order is the same either way; left as a short loop of constant trip
    count, LLVM unrolls it whole around the unrolled register tile, and its scheduler then
    hoists the operand loads of every step and spills accumulators (int8 1024³, 8x1 tile:
    k_inner = 8 ran 34 ms, k_inner = 1 and 2 ran 27.6 ms)."""
    s, sch = ctx.tsl, ctx.sch
    runs = [lp for lp in loops if lp.extent > 1]
    for outer, inner in zip(runs, runs[1:]):
        chain = loops[loops.index(outer):loops.index(inner) + 1]
        nested = all(sch.get(ctx.rv(a)).body.same_as(sch.get(ctx.rv(b)))
                     for a, b in zip(chain, chain[1:]))
        if outer.axes == inner.axes and all(s.reduces(lp) for lp in chain) and nested:
            fused = sch.fuse(*[ctx.rv(lp) for lp in chain])
            for lp in chain:
                ctx.loops[id(lp)] = fused


def _split_edges(ctx: LowerContext) -> None:
    """The loops of a predicated axis (`Schedule.predicate`), but its innermost (the vector
    lanes), are marked for TVM's LoopPartition: each is cut where the predicate stops being
    true for all of its inner iterations, so the whole tiles run without it (their vector
    loads and stores unmasked) and only the last, partial one keeps it (left to LLVM,
    element by element). Unsplit, TVM's vectorizer scalarizes every tile under the test."""
    s = ctx.tsl
    for axis in s.predicated:
        loops = [lp for lp in s.loops if axis in lp.axes]
        for lp in loops[:-1]:
            if lp.extent > 1:
                ctx.sch.annotate(ctx.rv(lp), "pragma_loop_partition_hint", 1)


# The loop annotations `codegen`'s prefetch pass reads: k steps ahead to prefetch B at; steps
# ahead to prefetch the rows of A's scalar loads at, and A's elements per cache line.
PREFETCH_STEPS = "tsl_prefetch_steps"
PREFETCH_ROWS = "tsl_prefetch_rows"
PREFETCH_LINE = "tsl_prefetch_line"


def _prefetch_weights(ctx: LowerContext, loops, row_bytes: int, l1_bytes: int) -> None:
    """Mark the innermost reduction loop around a GEMM's register tile for a software
    prefetch of the packed weights, `params.prefetch_bytes` ahead (whole k steps of
    `row_bytes`, the tile's B row), on machines that set it, where the tile's weight panel
    (K rows) outgrows the level B is read from (`l1_bytes`): a panel that fits stays there
    for the next row tiles, and the hints only cost issue slots (attention's K = 64 products
    ran 1-2% slower with them). Only GEMMs with B packed: a conv's innermost reduction loop
    is a short channel loop inside the window's, whose next steps are not where its loads go
    next."""
    s = ctx.tsl
    ahead = s.machine.params.prefetch_bytes
    if not ahead or ctx.op.name == "conv2d" or "B" not in s.packed:
        return
    k = math.prod(lp.extent for lp in s.loops if s.role_of(lp.axes[0]) == "k")
    runs = [lp for lp in loops if s.role_of(lp.axes[0]) == "k" and lp.extent > 1]
    if runs and k * row_bytes > l1_bytes:
        ctx.sch.annotate(ctx.rv(runs[-1]), PREFETCH_STEPS, -(-ahead // row_bytes))


def _prefetch_rows(ctx: LowerContext, loops, line_bytes: int) -> None:
    """Mark the channel loop of a stride-1 NCHW conv's window (`loops`: the reduction loops
    around the register tile, channels outermost, then the window's rows and columns) for a
    software prefetch of the input rows its body broadcasts from, `params.prefetch_channels`
    channels ahead, where a channel's plane is longer than the strides the hardware
    prefetchers follow (`params.prefetch_stride_bytes`) (ResNet-18's 64x56x56 and
    128x28x28 3x3 convs ran 7-12% and 1-14% faster with it on the 2-core Emerald Rapids;
    14x14, 7x7, stride 2 and the stem gained nothing). The window's loops are unrolled, so that the
    body's loads are the step's whole window; not done where channels run in blocks inside
    the window (ci_inner > 1): that body would be a whole block's windows."""
    s, op = ctx.tsl, ctx.op
    ahead = s.machine.params.prefetch_channels
    if not ahead or op.name != "conv2d" or op.params["layout"] != "NCHW" \
            or op.params["stride"] != 1:
        return
    _, _, h, w, _, rows, cols = op.params["shape"]
    pad, elem = op.params["padding"], dtype_bytes(op.input("A").dtype)
    plane = (h + 2 * pad) * (w + 2 * pad) * elem
    ks = [lp for lp in loops if s.role_of(lp.axes[0]) == "k"]
    if plane <= s.machine.params.prefetch_stride_bytes or rows * cols == 1 or not ks \
            or ks[0].axes != ("ci",) or ks[0].extent == 1 \
            or math.prod(lp.extent for lp in ks[1:]) > rows * cols:
        return
    for lp in ks[1:]:
        ctx.sch.unroll(ctx.rv(lp))
    ctx.sch.annotate(ctx.rv(ks[0]), PREFETCH_ROWS, ahead)
    ctx.sch.annotate(ctx.rv(ks[0]), PREFETCH_LINE, line_bytes // elem)


class CPULowering(Lowering):
    def __init__(self, machine, primitive):
        super().__init__(machine)
        self.primitive = primitive
        self.how = intrinsics.lowering(machine, primitive) if primitive is not None else None
        # The dtypes the kernel's operands are read in: the primitive's, or what its
        # instruction kind widens them to (weights converted by the artifact, like packing).
        self.a_dtype, self.b_dtype = intrinsics.operand_dtypes(machine, primitive)
        lane = machine.compute_level("lane")
        self.lanes = lane.count if lane else 4

    def layout(self, ctx: LowerContext, operand: str, layout: str) -> Blocked | None:
        """B (weights) in blocks of the register tile's width, and of the primitive's k when
        it reduces several elements (VNNI's 4); A in channel blocks for a k > 1 primitive."""
        op, p = ctx.op, self.primitive
        t = op.input(operand)
        nd = len(t.shape)
        if op.name == "conv2d":
            nchw = op.params["layout"] == "NCHW"
            if operand == "A":
                if nchw and p.k > 1:
                    # N, C, H, W -> N, C/k, H, W, k: the primitive reads k contiguous channels.
                    return Blocked({1: p.k}, ((0, "o"), (1, "o"), (2, "o"), (3, "o"), (1, "i")))
                if not nchw and p.m > 1:
                    # N, H, W, C -> N, H, C/k, W, k: the m pixels x k channels the primitive
                    # reads are contiguous too (NHWC's k channels already are, its pixels not).
                    return Blocked({3: p.k}, ((0, "o"), (1, "o"), (3, "o"), (2, "o"), (3, "i")))
                if not nchw and op.params["shape"][5] * op.params["shape"][6] > 1:
                    # N, H, W, C -> N, C/cb, H, W, cb with cb channels per cache line: a
                    # window's taps are C elements apart in NHWC, a power of two for most
                    # layers, so they fall into a few L1 sets and evict each other (ResNet-18's
                    # 7x7x512 layer ran 1.6x slower than in NCHW); in blocks they are adjacent.
                    cb = self._channel_block(t.shape[3], self.a_dtype or t.dtype)
                    if cb > 1:
                        return Blocked({3: cb}, ((0, "o"), (3, "o"), (1, "o"), (2, "o"), (3, "i")))
                return None
            kd, cd = (0, 1) if nchw else (3, 2)
            spatial = (2, 3) if nchw else (0, 1)
            blocks = {kd: p.n} | ({cd: p.k} if p.k > 1 else {})
            inner = ((kd, "i"),) + (((cd, "i"),) if p.k > 1 else ())
            return Blocked(blocks, ((kd, "o"), (cd, "o")) + tuple((d, "o") for d in spatial)
                           + inner)
        batch = ((0, "o"),) if nd == 3 else ()
        kb = {p.k} - {1}
        if operand == "A":
            # A[M, K] -> A[M/mr, K/pk, mr, pk]: the rows of one accumulator tile are
            # contiguous at each k (no 4 KiB aliasing between rows, one cache line per step).
            md, kd = nd - 2, nd - 1
            mr = ctx.tsl.knob_values.get("m_inner", 1) * p.m
            blocks = {md: mr} | ({kd: p.k} if kb else {})
            inner = ((md, "i"),) + (((kd, "i"),) if kb else ())
            return Blocked(blocks, batch + ((md, "o"), (kd, "o")) + inner)
        nb = ctx.tsl.knob_values.get("n_inner", 1) * p.n
        kd, nd_ = (nd - 1, nd - 2) if op.params["transpose_b"] else (nd - 2, nd - 1)
        blocks = {nd_: nb} | ({kd: p.k} if kb else {})
        inner = ((nd_, "i"),) + (((kd, "i"),) if kb else ())
        return Blocked(blocks, batch + ((nd_, "o"), (kd, "o")) + inner)

    def _channel_block(self, channels: int, dtype: str) -> int:
        """Channels per block of the packed activations: those of one line of the level the
        primitive reads A from (its `alignment`), halved until they divide `channels`."""
        line = self.machine.memory_level(self.primitive.a_level).alignment
        cb = max(1, int(line // dtype_bytes(dtype)))
        while cb > 1 and channels % cb:
            cb //= 2
        return cb

    def scope(self, level) -> str | None:
        return "global" if level.managed else None

    def cache(self, ctx: LowerContext, stage) -> None:
        super().cache(ctx, stage)
        op, p = ctx.op, self.primitive
        if stage.operand == "A" and "A_phases" not in ctx.blocks:
            ctx.blocks["A_phases"] = self._split_phases(ctx)
        if stage.operand != "C":
            return
        blocks = _accumulator_blocks(op, p)
        if blocks is not None:
            ctx.sch.transform_layout(ctx.block, ("write", 0), blocks)

    def _split_phases(self, ctx: LowerContext):
        """conv2d with stride > 1 on a primitive of m > 1 rows (output pixels): the data's
        columns are stored split by phase, w -> (w % stride, w // stride), so that the m
        pixels of a row block, input columns q * stride + s for consecutive q, are
        consecutive at every kernel offset s (the Tensor Core back end does the same). The
        packing stage (`layout`) writes that layout; a width that the stride does not divide is padded
        with zeros that no output reads. Returns the stage, or None where nothing changes."""
        from tvm.tirx import IndexMap, const

        op, p, sch, blk = ctx.op, self.primitive, ctx.sch, ctx.block
        st = int(op.params.get("stride", 1)) if op.name == "conv2d" else 1
        if p is None or p.m == 1 or st == 1:
            return None
        idx = ctx.input_index("A")
        pos = self._read_index(ctx, idx)
        if sch.get(blk).reads[pos].source.name == op.inputs[idx].name:
            return None  # A not packed (a schedule without pack("A")): smmla cannot read it
        stage = sch.get_sblock(sch.get(blk).reads[pos].source.name)
        shape = [int(d) for d in sch.get(blk).reads[pos].source.shape]
        wd = 3  # `layout` stores both NCHW and NHWC as (N, C/k, H, W, k) or (N, H, C/k, W, k)
        sch.transform_layout(
            blk, ("read", pos),
            IndexMap.from_func(lambda *ix: (*ix[:wd], ix[wd] % st, ix[wd] // st, *ix[wd + 1:]),
                               ndim=len(shape), index_dtype="int32"),
            pad_value=None if shape[wd] % st == 0 else const(0, op.input("A").dtype))
        return stage

    def tensorize(self, ctx: LowerContext, loop: Loop, prim) -> None:
        """Unroll the register tile, map the primitive (a TensorIntrin, or the n-loop vectorized
        into FMAs) and zero the accumulator once per tile, outside the reduction."""
        if self.how is None:
            raise LoweringError(f"machine {self.machine.name} has no tensor primitive to lower "
                                f"{prim.name} with")
        sch, s = ctx.sch, ctx.tsl
        order = s.loops
        t = order.index(loop)
        k_outer = next(lp for lp in order if s.role_of(lp.axes[0]) == "k")
        last_k = max(i for i, lp in enumerate(order[:t]) if s.role_of(lp.axes[0]) == "k")
        _merge_reduction_blocks(ctx, order[:last_k + 1])
        for lp in order[last_k + 1:t]:
            sch.unroll(ctx.rv(lp))
        inner = [lp for lp in order[t:] if not (lp.extent == 1 and lp is not order[-1])]
        if self.how == "vector":
            # The n-loop becomes the vector lanes: it goes innermost, the rest is unrolled.
            n_loop = next(lp for lp in order[t:] if s.role_of(lp.axes[0]) == "n")
            rest = [lp for lp in order[t:] if lp is not n_loop]
            sch.reorder(*[ctx.rv(lp) for lp in rest + [n_loop]])
            for lp in rest:
                sch.unroll(ctx.rv(lp))
            sch.vectorize(ctx.rv(n_loop))
            ctx.blocks["C_init"] = sch.decompose_reduction(ctx.block, ctx.rv(k_outer))
            nr = math.prod(lp.extent for lp in order[last_k + 1:]
                           if s.role_of(lp.axes[0]) == "n")
            _prefetch_weights(ctx, order[:last_k + 1],
                              nr * dtype_bytes(self.b_dtype or self.primitive.b_dtype),
                              self.machine.memory_level(self.primitive.b_level).capacity)
            _prefetch_rows(ctx, order[:last_k + 1],
                           self.machine.memory_level(self.primitive.a_level).alignment)
            return
        if self.primitive.m > 1:
            _rows_before_columns(ctx, order[t:])
        ctx.blocks["C_init"] = sch.decompose_reduction(ctx.block, ctx.rv(k_outer))
        sch.tensorize(ctx.rv(inner[0]), self.how)

    def finalize(self, ctx: LowerContext) -> None:
        sch = ctx.sch
        _split_edges(ctx)
        for name in ("C_init", "C_store"):
            if name in ctx.blocks:
                self._vectorize_innermost(sch, ctx.blocks[name])
        # Whole-tensor stages before the main nest (the int8 -> uint8 shift or int16 widening, padding, packing
        # of activations): one pass each, merged where possible, spread over the cores.
        self._pack_in_stored_order(ctx)
        stages = [n for n in ("A_cast", "A_pad", "A_global") if self._has(sch, n)]
        if len(stages) > 1 and stages[0] == "A_cast":
            sch.compute_inline(sch.get_sblock("A_cast"))
            stages = stages[1:]
        for name in stages:
            blk = sch.get_sblock(name)
            loops = sch.get_loops(blk)
            if len(loops) > 1:
                sch.parallel(sch.fuse(*loops[:2]) if len(loops) > 2 else loops[0])
            self._vectorize_innermost(sch, blk)

    def _pack_in_stored_order(self, ctx: LowerContext) -> None:
        """The stage that packs A inside the kernel runs over the packed layout, not over A:
        where the layout moves another dimension innermost (a GEMM's mr rows at each k), a
        pass over A's order writes one element per store, 4 bytes apart in every line (dense
        128x3072: 263 us of a 3.6 ms kernel on the 2-core Xeon); in stored order each store
        is a whole vector of the tile's rows (115 us), gathered from rows that the pass reads
        on along their lines."""
        if "A_pack" not in ctx.blocks or "A" not in ctx.tsl.packed:
            return
        lay = self.layout(ctx, "A", ctx.tsl.packed["A"])
        nd = len(ctx.op.input("A").shape)
        if lay is None or lay.order[-1][0] == nd - 1:
            return
        from tvm.tirx import IndexMap

        ctx.sch.transform_block_layout(ctx.blocks["A_pack"], IndexMap.from_func(
            lay.index_map, ndim=nd, index_dtype="int32"))

    @staticmethod
    def _has(sch, name: str) -> bool:
        try:
            sch.get_sblock(name)
            return True
        except Exception:  # noqa: BLE001 - s_tir raises its own error for a missing block
            return False

    def _vectorize_innermost(self, sch, blk) -> None:
        inner = sch.get_loops(blk)[-1]
        ext = int(sch.get(inner).extent)
        if ext % self.lanes == 0 and ext > self.lanes:
            _, inner = sch.split(inner, [None, self.lanes])
        if ext >= 4:
            sch.vectorize(inner)
