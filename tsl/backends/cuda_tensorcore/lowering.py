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
"""

from __future__ import annotations

from ...errors import LoweringError
from ...lower import LowerContext, Lowering
from ...primitives.schedule import Loop
from . import intrinsics

SHARED = "shared.dyn"
VECTOR_BYTES = 16  # one cp.async / ld.global.v4 per thread


class TensorCoreLowering(Lowering):
    def __init__(self, machine, primitive):
        super().__init__(machine)
        self.primitive = primitive

    # -- staging ----------------------------------------------------------------------------
    def cache(self, ctx: LowerContext, stage) -> None:
        sch, blk, at = ctx.sch, ctx.block, ctx.rv(stage.at)
        role = stage.level.role
        if stage.operand == "C":
            # fragments -> a 16x16 tile of static shared memory per warp -> epilogue -> global
            store = sch.cache_write(blk, 0, "shared")
            acc = sch.cache_write(blk, 0, "wmma.accumulator")
            sch.reverse_compute_at(acc, at, preserve_unit_loops=True)
            sch.reverse_compute_at(store, at, preserve_unit_loops=True)
            ctx.blocks.update(C_acc=acc, C_store=store)
            return
        idx = self._read_index(ctx, ctx.input_index(stage.operand))
        if role == "scratchpad":
            cr = sch.cache_read(blk, idx, SHARED)
            _blocked(sch, cr, ("write", 0))
            ctx.blocks[f"{stage.operand}_shared"] = cr
        elif role == "operand":
            cr = sch.cache_read(blk, idx, f"wmma.matrix_{stage.operand.lower()}")
            ctx.blocks[f"{stage.operand}_frag"] = cr
        else:
            raise LoweringError(f"the Tensor Core back end has no {role} level for "
                                f"{stage.operand}")
        sch.compute_at(cr, at, preserve_unit_loops=True)

    def bind(self, ctx: LowerContext, rv, level) -> None:
        ctx.sch.bind(rv, level.bind)

    def pipeline(self, ctx: LowerContext, loop: Loop, stages: int) -> None:
        """The shared tiles of iteration t+stages-1 are fetched (cp.async) while the warps
        compute on iteration t."""
        sch = ctx.sch
        rv = ctx.rv(loop)
        body = sch.get(rv).body
        n = len(body.seq) if hasattr(body, "seq") else 1
        sch.annotate(rv, "software_pipeline_stage", [0] * (n - 1) + [stages - 1])
        sch.annotate(rv, "software_pipeline_order", list(range(n)))
        if self.machine.params.get("cp_async", False):
            sch.annotate(rv, "software_pipeline_async_stages", [0])

    def epilogue(self, ctx: LowerContext, at: Loop | None) -> None:
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
        if op.name == "conv2d":
            raise LoweringError(
                f"conv2d on {self.machine.name}: the implicit-GEMM lowering is not done yet (the "
                f"kernel-window offset of an A fragment, r + p and s + q, is not a multiple of "
                f"16, which wmma tensorization needs; an im2col reindex of A is the way). "
                f"matmul, batch_matmul and dense build")
        dt, acc = op.dtype, op.acc_dtype
        b_col = bool(op.params.get("transpose_b"))  # B given as [N, K]: column-major fragments
        k_outer = next(lp for lp in s.loops if s.role_of(lp.axes[0]) == "k")
        init = sch.decompose_reduction(ctx.block, ctx.rv(k_outer))
        _tile16(sch, init, intrinsics.intrin("fill", acc))
        _tile16(sch, ctx.blocks["A_frag"], intrinsics.intrin("load", dt, SHARED, "A", False))
        _tile16(sch, ctx.blocks["B_frag"], intrinsics.intrin("load", dt, SHARED, "B", b_col))
        # One fragment at a time goes out through shared memory to the epilogue.
        _, frag, tile = _split16(sch, ctx.blocks["C_acc"])
        sch.reverse_compute_at(ctx.blocks["C_store"], frag, preserve_unit_loops=True)
        sch.tensorize(tile, intrinsics.intrin("store", acc, "shared"))
        sch.tensorize(ctx.rv(loop), intrinsics.intrin("sync", dt, acc, b_col))

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
        for operand in ("A", "B"):
            _spread(sch, ctx.blocks[f"{operand}_shared"], warps, ctx.op.dtype)
        _spread(sch, ctx.blocks["C_store"], 1, ctx.op.out_dtype)


def _blocked(sch, block, buffer) -> None:
    """Store a buffer 16-blocked: (.., x) -> (x // 16, .., x % 16)."""
    from tvm.tirx import IndexMap

    ndim = len(sch.get(block).writes[0].source.shape)
    sch.transform_layout(block, buffer, IndexMap.from_func(
        lambda *i: (i[-1] // 16, *i[:-1], i[-1] % 16), ndim=ndim, index_dtype="int32"))


def _split16(sch, block):
    """Split the innermost two loops of `block` (multiples of 16) into 16x16 tiles:
    (loop over tile rows, loop over tile columns, the tile's first loop)."""
    a, b = sch.get_loops(block)[-2:]
    a0, a1 = sch.split(a, [None, 16])
    b0, b1 = sch.split(b, [None, 16])
    sch.reorder(a0, b0, a1, b1)
    return a0, b0, a1


def _tile16(sch, block, intrin: str) -> None:
    sch.tensorize(_split16(sch, block)[2], intrin)


def _spread(sch, block, warps: int, dtype: str) -> None:
    """A copy block's own loops fused and split over (warps, 32 lanes, one vector each)."""
    from ...tam.machine import dtype_bytes

    loops = sch.get_loops(block)[-len(sch.get(block).iter_vars):]
    total = 1
    for lp in loops:
        total *= int(sch.get(lp).extent)
    vec = int(VECTOR_BYTES // dtype_bytes(dtype))
    inner = sch.get(loops[-1]).extent
    while vec > 1 and (total % (vec * 32 * warps) or int(inner) % vec):
        vec //= 2
    fused = sch.fuse(*loops)
    factors = [None] + ([warps] if warps > 1 else []) + [32, vec]
    parts = sch.split(fused, factors)
    if warps > 1:
        sch.bind(parts[1], "threadIdx.y")
    sch.bind(parts[-2], "threadIdx.x")
    sch.vectorize(parts[-1])
