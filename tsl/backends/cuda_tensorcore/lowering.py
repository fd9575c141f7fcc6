"""How the shared schedule's steps become s_tir calls for WMMA Tensor Cores.

    parallel(.., "core")        -> blockIdx.x (blocks)   parallel(.., "subcore") -> threadIdx.y
    cache(X, "scratchpad")      -> shared.dyn tile, filled by all warps with 16-byte vector loads
    cache(X, "operand")         -> wmma.matrix_a / wmma.matrix_b fragments (wmma.load_matrix_sync)
    cache("C", "accumulator")   -> wmma.accumulator fragments; each 16x16 fragment goes out
                                   through a static shared tile, so the fused epilogue reads it
                                   and writes global memory with 16-byte vector stores
    pipeline(k, n)              -> software pipeline over k with cp.async for the shared tiles
    tensorize                   -> wmma.mma_sync m16n16k16 (fill / load / store intrinsics around)

Every staged A/B tile is stored "16-blocked": its innermost dimension x becomes (x // 16, ..., x % 16),
so each 16x16 fragment is one contiguous, 256-bit aligned block of shared memory. That is what
wmma.load_matrix_sync needs (aligned pointer, ldm = 16) and it reads without bank conflicts.

On a machine with `mma_sync` (sm_80) the fp16 / bf16 / int8 GEMM family takes another path:

    cache(X, "scratchpad")      -> a row-major shared.dyn tile, swizzled (TVM's
                                   InjectPermutedLayout: 16-byte block b of row r at b ^ r % 8)
    cache(X, "operand")         -> "warp" registers in mma.sync's per-lane layout, loaded with
                                   ldmatrix.x4 (.trans for B given as [K, N]; 8-bit B given
                                   as [K, N], which no ldmatrix transposes: gathered by each
                                   lane, four bytes a register, intrinsics._lds_b)
    cache("C", "accumulator")   -> "warp" registers; the fused epilogue is computed by the
                                   store from them, two fp32 per lane as one 8-byte store
    tensorize                   -> two mma.sync.m16n8k16 per 16x16x16 step (m16n8k32 per
                                   16x16x32 step for int8)
    split_reduction(k.0)        -> s_tir rfactor: the GEMM kernel writes each part's partial
                                   sums to a workspace in global memory ([parts, M, N] of the
                                   accumulator's dtype); a second kernel adds them in order
                                   and applies the epilogue once (`_sum_partials`)

conv2d (NHWC data, RSCK weights) is an implicit GEMM: rows are output pixels, columns output
channels, the reduction is (r, s, input channel). The weights' tile is staged like a GEMM's B.
The data's tile is the kernel window, (h, w, c), not an im2col matrix (that would be R x S times
larger): it is stored (c // 16, n, h, w % stride, w // stride, c % 16), so the 16 pixels of an A
fragment at kernel offset (r, s) are 16 consecutive 32-byte rows wherever the window starts
(`_window_layout`). The fragment stage is indexed as the implicit GEMM's A (`_im2col_fragment`,
s_tir reindex_cache_read), so fragments sit at multiples of 16 there and the loads tensorize.
NCHW is refused: its tiles would need a transposing copy.
"""

from __future__ import annotations

import math

from ...errors import LoweringError
from ...lower import LowerContext, Lowering
from ...primitives.schedule import Loop
from ...tam.machine import dtype_bytes
from . import intrinsics, model

SHARED = "shared.dyn"
VECTOR_BYTES = 16  # one cp.async / ld.global.v4 per thread


class TensorCoreLowering(Lowering):
    def __init__(self, machine, primitive):
        super().__init__(machine)
        self.primitive = primitive
        self.rows: dict[str, int] = {}  # operand -> elements in a row of its shared tile

    def uses_mma(self, op) -> bool:
        """ldmatrix + mma.sync (machine param `mma_sync`) for the fp16 / bf16 / int8 GEMM
        family; WMMA for conv2d (its shared tile is the kernel window, not a matrix ldmatrix
        can address) and where the machine does not ask for mma.sync (model.py says which:
        the model prices the instruction the lowering emits)."""
        return model.planned_instruction(self.machine, op) == "mma_sync"

    # -- staging ----------------------------------------------------------------------------
    def cache(self, ctx: LowerContext, stage) -> None:
        sch, blk, at = ctx.sch, ctx.block, ctx.rv(stage.at)
        role = stage.level.role
        if ctx.op.name == "conv2d" and ctx.op.params["layout"] != "NHWC":
            raise LoweringError(
                f"{ctx.tsl.op} on {self.machine.name}: the Tensor Core back end builds conv2d "
                f"in layout='NHWC' only (data NHWC, weights RSCK: input channels innermost, "
                f"the implicit GEMM's reduction); {ctx.op.params['layout']} would need a "
                f"transposing copy of every tile. Use tsl.ops.conv2d(..., layout='NHWC')")
        self._bind_parallel(ctx)
        if self.uses_mma(ctx.op):
            return self._cache_mma(ctx, stage)
        if stage.operand == "C":
            # fragments -> a 16x16 tile of static shared memory per warp -> epilogue -> global
            store = sch.cache_write(blk, 0, "shared")
            acc = sch.cache_write(blk, 0, "wmma.accumulator")
            sch.reverse_compute_at(acc, at, preserve_unit_loops=True)
            sch.reverse_compute_at(store, at, preserve_unit_loops=True)
            ctx.blocks.update(C_acc=acc, C_store=store)
            return
        idx = self._read_index(ctx, ctx.input_index(stage.operand))
        window = stage.operand == "A" and ctx.op.name == "conv2d"
        if role == "scratchpad":
            cr = sch.cache_read(blk, idx, SHARED)
            if window:
                _window_layout(sch, cr, ctx.op)
            else:
                _blocked(sch, cr, ("write", 0))
            ctx.blocks[f"{stage.operand}_shared"] = cr
        elif role == "operand" and window:
            cr = _im2col_fragment(sch, blk, idx)
            ctx.blocks["A_frag"] = cr
        elif role == "operand":
            cr = sch.cache_read(blk, idx, f"wmma.matrix_{stage.operand.lower()}")
            ctx.blocks[f"{stage.operand}_frag"] = cr
        else:
            raise LoweringError(f"the Tensor Core back end has no {role} level for "
                                f"{stage.operand}")
        sch.compute_at(cr, at, preserve_unit_loops=True)
        if window and role == "operand":
            # Its loops follow block C's iterators (n, p, q, r, s, ci); rows, then columns
            # innermost, as the 16x16 fragment loads want them.
            iters = [iv.var.name.removeprefix("v_") for iv in sch.get(cr).iter_vars]
            loops = dict(zip(iters, sch.get_loops(cr)[-len(iters):]))
            offsets = [loops[a] for a in ("r", "s") if a in loops]
            if offsets:
                sch.reorder(*offsets, loops["q"])

    def _cache_mma(self, ctx: LowerContext, stage) -> None:
        """C in the warps' registers ("warp" scope, stored from there by the epilogue), A and
        B in plain row-major shared tiles (swizzled at the end, see finalize) and in
        registers."""
        sch, blk, at = ctx.sch, ctx.block, ctx.rv(stage.at)
        if stage.operand == "C":
            acc = sch.cache_write(blk, 0, "warp")
            sch.reverse_compute_at(acc, at, preserve_unit_loops=True)
            ctx.blocks.update(C_acc=acc, C_store=acc)
            return
        idx = self._read_index(ctx, ctx.input_index(stage.operand))
        role = stage.level.role
        if role not in ("scratchpad", "operand"):
            raise LoweringError(f"the Tensor Core back end has no {role} level for "
                                f"{stage.operand}")
        cr = sch.cache_read(blk, idx, SHARED if role == "scratchpad" else "warp")
        ctx.blocks[f"{stage.operand}_{'shared' if role == 'scratchpad' else 'frag'}"] = cr
        sch.compute_at(cr, at, preserve_unit_loops=True)
        if role == "scratchpad":  # the tile's row: its innermost loop (see finalize)
            self.rows[stage.operand] = int(sch.get(sch.get_loops(cr)[-1]).extent)

    def bind(self, ctx: LowerContext, rv, level) -> None:
        if ctx.sch.get(rv).thread_binding is None:  # not bound yet by _bind_parallel
            ctx.sch.bind(rv, level.bind)

    def _bind_parallel(self, ctx: LowerContext) -> None:
        """Bind the parallel loops (blocks, warps) before any tile is staged under them: a
        shared tile staged inside the warp loop is then the whole block's tile (s_tir relaxes
        a shared buffer's region over threadIdx-bound loops), which all warps fill together.
        Staged before the binding it would be one warp's tile, filled by threads of every
        warp: rows of it would never be loaded."""
        loops = ctx.tsl.loops
        first = next((i for i, lp in enumerate(loops) if lp.parallel), len(loops))
        serial = [lp.name for lp in loops[:first] if lp.extent > 1]
        if serial:
            where = (f"outside the loop spread over thread blocks ({loops[first].name})"
                     if first < len(loops) else "and no loop is spread over thread blocks")
            raise LoweringError(
                f"{ctx.tsl.op} on {self.machine.name}: loops {serial} run serially {where}; "
                f"one CUDA kernel needs every loop outside its blocks in the grid: make them "
                f"parallel over the core level too (for the default conv2d schedule: knob "
                f"parallel_axes='n_oh_co')")
        for lp in loops:
            if lp.parallel:
                self.bind(ctx, ctx.rv(lp), ctx.tsl.machine.compute_level(lp.parallel))

    def pipeline(self, ctx: LowerContext, loop: Loop, stages: int) -> None:
        """The shared tiles of iteration t+stages-1 are fetched (cp.async) while the warps
        compute on iteration t."""
        sch = ctx.sch
        rv = ctx.rv(loop)
        body = sch.get(rv).body
        n = len(body.seq) if hasattr(body, "seq") else 1
        sch.annotate(rv, "software_pipeline_stage", [0] * (n - 1) + [stages - 1])
        sch.annotate(rv, "software_pipeline_order", list(range(n)))
        if self.machine.params.cp_async:
            sch.annotate(rv, "software_pipeline_async_stages", [0])

    def split_reduction(self, ctx: LowerContext, rv) -> None:
        """The GEMM kernel computes the partial sums (block C_rf: [parts, M, N] of the
        accumulator's dtype, in global memory); the block that adds them ("C") and the
        epilogue become a second kernel (`_sum_partials`). mma.sync kernels only."""
        if not self.uses_mma(ctx.op):
            raise LoweringError(f"{ctx.tsl.op} on {self.machine.name}: a split reduction "
                                f"(split_k > 1) is built for the ldmatrix + mma.sync kernels "
                                f"only; use split_k=1")
        ctx.sch.rfactor(rv, factor_axis=0)
        ctx.main = "C_rf"

    def _sum_partials(self, ctx: LowerContext) -> None:
        """The second kernel of a split reduction: each thread sums the partials of 4 adjacent
        outputs in registers, in order (part 0 first: deterministic), applies the epilogue
        once and stores them, 16 bytes at a time; 32 threads a warp, warps along
        threadIdx.y."""
        sch = ctx.sch
        total, vec = math.prod(ctx.op.output.shape), 4  # N is padded to 16: whole vectors
        warps = next(w for w in (8, 4, 2, 1) if total % (w * 32 * vec) == 0)
        wb = sch.get_sblock("C")
        *spatial, last, parts = sch.get_loops(wb)
        last, v = sch.split(last, [None, vec])
        sch.reorder(parts, v)
        bx, ty, tx = sch.split(sch.fuse(*spatial, last), [None, warps, 32])
        sch.bind(bx, "blockIdx.x")
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        try:
            out = sch.get_sblock("out")
            sch.set_scope(wb, 0, "local")
        except Exception:  # noqa: BLE001 - no epilogue: the sums are copied out as they are
            out = sch.cache_write(wb, 0, "local")
        sch.decompose_reduction(wb, parts)
        sch.reverse_compute_at(out, tx, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(out)[-1])

    def epilogue(self, ctx: LowerContext, at: Loop | None) -> None:
        if ctx.main != "C":
            return self._sum_partials(ctx)
        if self.uses_mma(ctx.op):
            # Register-direct: the epilogue is computed by the store from the registers.
            try:
                out = ctx.sch.get_sblock("out")
            except Exception:  # noqa: BLE001 - no epilogue: the store is the plain copy
                return
            ctx.sch.reverse_compute_inline(out)
            return
        super().epilogue(ctx, at)
        try:
            ctx.blocks["C_store"] = ctx.sch.get_sblock("out")
        except Exception:  # noqa: BLE001 - no epilogue block: C_store stays the plain copy
            pass

    # -- the primitive ----------------------------------------------------------------------
    def tensorize(self, ctx: LowerContext, loop: Loop, prim) -> None:
        op, sch, s = ctx.op, ctx.sch, ctx.tsl
        missing = [b for b in ("C_acc", "A_frag", "B_frag", "A_shared", "B_shared")
                   if b not in ctx.blocks]
        if missing:
            raise LoweringError(f"tensorize({loop.name}) on {self.machine.name} needs A and B "
                                f"staged in the scratchpad and operand levels and C in the "
                                f"accumulator level (cache(...)); missing: {missing}")
        dt, acc = op.dtype, op.acc_dtype
        b_col = bool(op.params.get("transpose_b"))  # B given as [N, K]: column-major fragments
        k_outer = next(lp for lp in s.loops if s.reduces(lp))
        init = sch.decompose_reduction(ctx.block, ctx.rv(k_outer))
        if self.uses_mma(op):
            return self._tensorize_mma(ctx, loop, init, b_col)
        _tile16(sch, init, intrinsics.intrin("fill", acc))
        _tile16(sch, ctx.blocks["A_frag"], intrinsics.intrin("load", dt, SHARED, "A", False))
        _tile16(sch, ctx.blocks["B_frag"], intrinsics.intrin("load", dt, SHARED, "B", b_col))
        # One fragment at a time goes out through shared memory to the epilogue.
        _, frag, tile = _split16(sch, ctx.blocks["C_acc"])
        sch.reverse_compute_at(ctx.blocks["C_store"], frag, preserve_unit_loops=True)
        sch.tensorize(tile, intrinsics.intrin("store", acc, "shared"))
        sch.tensorize(ctx.rv(loop), intrinsics.intrin("sync", dt, acc, b_col, prim.k))

    def _tensorize_mma(self, ctx: LowerContext, loop: Loop, init, b_col: bool) -> None:
        """Registers in mma.sync's per-lane layouts (intrinsics.lane_a / lane_b): every warp
        buffer is re-indexed (tile row, tile column, lane, element), then the fragment loads
        become ldmatrix, the product mma.sync, and the store goes from the registers to
        global memory, two adjacent accumulators (8 bytes) per lane and store."""
        from tvm.tirx import IndexMap

        sch, op = ctx.sch, ctx.op
        dt, acc = op.dtype, op.acc_dtype
        k = intrinsics.mma_k(dt)
        lane_a, lane_b = intrinsics.lane_a, intrinsics.lane_b

        def relayout(block, buffer, rows, cols, lane):
            ndim = len(sch.get(block).writes[0].source.shape if buffer[0] == "write"
                       else sch.get(block).reads[buffer[1]].source.shape)
            sch.transform_layout(block, buffer, IndexMap.from_func(
                lambda *i: (*i[:-2], i[-2] // rows, i[-1] // cols,
                            *lane(i[-2] % rows, i[-1] % cols)),
                ndim=ndim, index_dtype="int32"))

        relayout(ctx.blocks["A_frag"], ("write", 0), 16, k, lambda i, j: lane_a(i, j, k))
        if b_col:  # [N, K]
            relayout(ctx.blocks["B_frag"], ("write", 0), 16, k, lambda n, j: lane_b(n, j, k))
        else:  # [K, N]
            relayout(ctx.blocks["B_frag"], ("write", 0), k, 16, lambda j, n: lane_b(n, j, k))
        relayout(ctx.blocks["C_acc"], ("read", 0), 16, 16, lane_a)
        _tile(sch, init, 16, 16, intrinsics.intrin("mma_fill", acc))
        loads = []
        for operand, trans in (("A", False), ("B", b_col)):
            frag = ctx.blocks[f"{operand}_frag"]
            rows, cols = (k, 16) if operand == "B" and not trans else (16, k)
            if operand == "B" and not trans and dtype_bytes(dt) == 1:
                # No 8-bit ldmatrix.trans: each lane loads its own bytes (not swizzled).
                _tile(sch, frag, rows, cols, intrinsics.intrin("lds_b", dt, SHARED))
                continue
            loads.append((operand, _tile(sch, frag, rows, cols,
                                         intrinsics.intrin("ldmatrix", dt, SHARED, operand,
                                                           trans))))
        sch.tensorize(ctx.rv(loop), intrinsics.intrin("mma", dt, acc))
        ctx.blocks["ldmatrix"] = loads
        # The store: lane 4 * (i % 8) + j % 8 // 2 holds rows i, i + 8 and columns j, j + 1.
        store = ctx.blocks["C_store"]
        i, j = sch.get_loops(store)[-2:]
        i0, i1, i2 = sch.split(i, [None, 2, 8])
        j0, j1, j2, j3 = sch.split(j, [None, 2, 4, 2])
        sch.reorder(i0, j0, i1, j1, i2, j2, j3)
        lane = sch.fuse(i2, j2)
        sch.bind(lane, "threadIdx.x")
        # The pair goes out through two local registers: TVM's warp-memory lowering reads
        # registers element by element only; the store to global memory is one 8-byte vector.
        pair = sch.cache_write(store, 0, "local")
        sch.reverse_compute_at(pair, lane, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(pair)[-1])

    def finalize(self, ctx: LowerContext) -> None:
        """Inline the padding stage into the shared copy; spread the copies over the warps'
        threads with 16-byte vectors (global -> shared, and shared -> epilogue -> global)."""
        sch, s = ctx.sch, ctx.tsl
        for name in ("A_pad",):
            try:
                sch.compute_inline(sch.get_sblock(name))
            except Exception:  # noqa: BLE001 - the operator has no such stage
                pass
        warps = next((lp.extent for lp in s.loops if lp.parallel
                      and s.machine.compute_level(lp.parallel).role == "subcore"), 1)
        _unroll_register_loops(ctx)
        if self.uses_mma(ctx.op):
            # Swizzled shared tiles (TVM's InjectPermutedLayout): the 16-byte column block
            # of row r is stored at block ^ (r % 8) (^ (r % 8 // 2) for 64-byte rows), for
            # the cp.async stores and the ldmatrix reads alike: no bank conflicts. It needs
            # rows of 32 elements or more, and a power of two of them: with rows of 96 the
            # XOR'ed index of a 16-byte vector is not seen to stay contiguous (the copy would
            # be scattered, no cp.async). Other tiles (a K or N of 16, k_inner = 6) stay
            # unswizzled. TVM's pass fails on 8-bit elements: int8 tiles read by ldmatrix
            # are padded instead (model.row_padding; rows of 64 bytes keep conflicts on
            # their ldmatrix reads, tsl_lds4's byte gathers anyway).
            loads = dict(ctx.blocks["ldmatrix"])
            for operand in ("A", "B"):
                blk = ctx.blocks[f"{operand}_shared"]
                _spread(sch, blk, warps, ctx.op.dtype)
                row = self.rows[operand]
                if operand not in loads or row & (row - 1):
                    continue
                if dtype_bytes(ctx.op.dtype) == 2 and row >= 32:
                    sch.annotate(blk, "permuted_layout", 1)
                    sch.annotate(loads[operand], "permuted_layout", 1)
                elif pad := model.row_padding(self.machine, ctx.op, operand, row):
                    # 8-bit rows of 128+ bytes, padded: the 8 rows an ldmatrix reads at one
                    # column fall in 8 different bank groups, and so do a quarter warp's
                    # cp.async chunks (in one row).
                    sch.storage_align(blk, 0, axis=-2, factor=row, offset=pad)
            return
        for operand in ("A", "B"):
            window = ctx.op.name == "conv2d" and operand == "A"
            # TVM turns a 16 x int8 copy with zero padding into neither cp.async nor
            # compilable CUDA (make_int4 of 16 chars): 4-byte copies for that one.
            narrow = window and ctx.op.dtype in ("int8", "uint8") and ctx.op.params["padding"]
            _spread(sch, ctx.blocks[f"{operand}_shared"], warps, ctx.op.dtype, window=window,
                    vector_bytes=4 if narrow else VECTOR_BYTES)
        # The epilogue computes in the accumulator's dtype: at most 16 bytes of that per
        # vector (TVM's CUDA code for int32x8, the math of 8 int8 outputs, does not compile).
        out_bytes, acc_bytes = dtype_bytes(ctx.op.out_dtype), dtype_bytes(ctx.op.acc_dtype)
        _spread(sch, ctx.blocks["C_store"], 1, ctx.op.out_dtype,
                vector_bytes=int(VECTOR_BYTES * min(1, out_bytes / acc_bytes)))


def _unroll_register_loops(ctx: LowerContext) -> None:
    """Unroll the serial loops between the accumulator's staging and the reduction (conv2d's
    output rows of a tile, h_inner, when they are not inside the reduction): each iteration
    uses its own accumulator fragments, and registers cannot be indexed by a loop counter;
    rolled (its body, the whole pipelined reduction, is too big for nvcc to unroll by
    itself), the fragments would live in local memory (a stack frame in ptxas -v)."""
    s = ctx.tsl
    acc = next((st.at for st in s.stages if st.operand == "C"), None)
    if acc is None:
        return
    for lp in s.loops[s.loops.index(acc) + 1:]:
        if s.reduces(lp):
            return
        if lp.extent > 1 and not lp.parallel:
            ctx.sch.unroll(ctx.rv(lp))


def _blocked(sch, block, buffer) -> None:
    """Store a buffer 16-blocked: (.., x) -> (x // 16, .., x % 16)."""
    from tvm.tirx import IndexMap

    ndim = len(sch.get(block).writes[0].source.shape)
    sch.transform_layout(block, buffer, IndexMap.from_func(
        lambda *i: (i[-1] // 16, *i[:-1], i[-1] % 16), ndim=ndim, index_dtype="int32"))


def _window_layout(sch, block, op) -> None:
    """The shared tile of a conv2d's (padded) NHWC input, the kernel window's rows of it:
    (n, h, w, c) -> (c // 16, n, h, w % stride, w // stride, c % 16).

    An A fragment of the implicit GEMM is 16 output pixels (rows) x 16 input channels at one
    kernel offset (r, s): input columns w = q * stride + s * dilation for 16 consecutive q.
    With the columns split by phase (w % stride) those are 16 consecutive rows of 16 channels,
    i.e. one contiguous 16x16 block (ldm = 16), whatever s is: it starts at any row, not at a
    multiple of 16, which is why the fragment stage is an im2col view (`_im2col_fragment`).
    A row of 16 int8 is 16 bytes: rows are padded to 32 so that every fragment starts 256-bit
    aligned, as wmma.load_matrix_sync requires."""
    from tvm.tirx import IndexMap, const

    st = int(op.params["stride"])
    if st == 1:
        index_map = lambda n, h, w, c: (c // 16, n, h, w, c % 16)  # noqa: E731
    else:
        index_map = lambda n, h, w, c: (c // 16, n, h, w % st, w // st, c % 16)  # noqa: E731
    extent = int(sch.get(block).writes[0].region[2].extent)
    sch.transform_layout(block, ("write", 0),
                         IndexMap.from_func(index_map, ndim=4, index_dtype="int32"),
                         pad_value=None if extent % st == 0 else const(0, op.dtype))
    row = 16 * dtype_bytes(op.dtype)
    if row % 32:
        sch.storage_align(block, 0, axis=-2, factor=int(32 // dtype_bytes(op.dtype)), offset=0)


def _im2col_fragment(sch, block, read_index):
    """A's wmma.matrix_a stage of a conv2d, indexed as the implicit GEMM's A (its rows are
    output pixels, its columns input channels at one kernel offset): every fragment is at a
    multiple of 16 there, so the fragment loads tensorize, reading the shared window tile at
    (p * stride + r, q * stride + s)."""
    import tvm_ffi
    from tvm import tirx
    from tvm.tirx import IndexMap

    blk = sch.get(block)
    used: set[str] = set()  # a kernel axis of extent 1 is not in the access (a 1x1 conv)
    for rng in blk.reads[read_index].region:
        tvm_ffi.structural_walk(rng.min, [(tirx.Var, lambda v: used.add(v.name))])
    names = [iv.var.name for iv in blk.iter_vars]
    pos = {n.removeprefix("v_"): i for i, n in enumerate(names) if n in used}
    order = [pos[a] for a in ("n", "p", "r", "s", "q", "ci") if a in pos]
    return sch.reindex_cache_read(block, read_index, "wmma.matrix_a", IndexMap.from_func(
        lambda *v: tuple(v[i] for i in order), ndim=len(names), index_dtype="int32"))


def _split16(sch, block):
    """Split the innermost two loops of `block` (multiples of 16) into 16x16 tiles:
    (loop over tile rows, loop over tile columns, the tile's first loop)."""
    a, b = sch.get_loops(block)[-2:]
    a0, a1 = sch.split(a, [None, 16])
    b0, b1 = sch.split(b, [None, 16])
    sch.reorder(a0, b0, a1, b1)
    return a0, b0, a1


def _tile(sch, block, rows: int, cols: int, intrin: str):
    """Tensorize the innermost two loops of `block` in rows x cols tiles with `intrin`; the
    block the intrinsic became."""
    a, b = sch.get_loops(block)[-2:]
    a0, a1 = sch.split(a, [None, rows])
    b0, b1 = sch.split(b, [None, cols])
    sch.reorder(a0, b0, a1, b1)
    sch.tensorize(a1, intrin)
    return sch.get_child_blocks(b0)[0]


def _tile16(sch, block, intrin: str) -> None:
    sch.tensorize(_split16(sch, block)[2], intrin)


def _spread(sch, block, warps: int, dtype: str, window: bool = False,
            vector_bytes: int = VECTOR_BYTES) -> None:
    """A copy block's own loops fused and split over (warps, 32 lanes, one vector each).

    `window`: the shared tile of a conv2d's input window, (n, h, w, c). Its size need not be
    a whole number of rounds of warps x 32 vectors (3 x 66 pixels x 32 channels): the last
    round is predicated. The vector is split off the channel loop before the pixel loops are
    fused, so that the pixel a vector belongs to (and the zero-padding test of the window)
    visibly does not depend on the lane: the copy stays one vector (cp.async with zero fill)."""
    loops = sch.get_loops(block)[-len(sch.get(block).iter_vars):]
    total = 1
    for lp in loops:
        total *= int(sch.get(lp).extent)
    vec = int(vector_bytes // dtype_bytes(dtype))
    inner = sch.get(loops[-1]).extent
    while vec > 1 and ((total % (vec * 32 * warps) and not window) or int(inner) % vec):
        vec //= 2
    if window:
        *pixels, channels = loops
        channels, lanes = sch.split(channels, [None, vec])
        fused = sch.fuse(*pixels, channels)
        factors = [None] + ([warps] if warps > 1 else []) + [32]
    else:
        fused = sch.fuse(*loops)
        factors = [None] + ([warps] if warps > 1 else []) + [32, vec]
    parts = sch.split(fused, factors)
    if window:
        parts.append(lanes)
    if warps > 1:
        sch.bind(parts[1], "threadIdx.y")
    sch.bind(parts[-2], "threadIdx.x")
    sch.vectorize(parts[-1])
