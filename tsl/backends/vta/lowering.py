"""How the shared schedule's steps become s_tir calls for VTA.

The result is TIR that the codegen can read as a VTA program: operand tiles copied into
"local.inp" / "local.wgt" blocks, the accumulator in "local.acc", every 1 x 16 x 16 product a
`tsl_vta_gemm` call and every accumulator zeroing a `tsl_vta_reset` call, the epilogue one block
from the accumulator to the output, and every tensor in VTA's blocked layouts (data NCHW1n16c,
kernel OIHW16o16i, output and accumulator like data). Loops run as virtual threads carry
the annotation `VTHREADS`, pipelined loops the annotation `STAGES`.
"""

from __future__ import annotations

from ...errors import LoweringError
from ...lower import LowerContext, Lowering
from ...primitives.layout import Blocked
from ...primitives.schedule import Loop
from . import intrinsics

STAGES = "tsl.vta_stages"
VTHREADS = "tsl.vta_vthreads"


class VTALowering(Lowering):
    def __init__(self, machine, primitive):
        super().__init__(machine)
        self.p = primitive

    # -- layouts ------------------------------------------------------------------------------
    def blocked(self, op, tensor: str) -> Blocked:
        """The VTA layout of input "A", "B" or the output "out": the channel (or k / n) dim in
        blocks of the primitive's k / n, that block innermost (a weight entry is [n][k])."""
        p = self.p
        if op.name == "conv2d":
            n_, c_, h_, w_ = (0, 1, 2, 3) if op.params["layout"] == "NCHW" else (0, 3, 1, 2)
            if tensor == "B":
                o_, i_, r_, s_ = (0, 1, 2, 3) if op.params["layout"] == "NCHW" else (3, 2, 0, 1)
                return Blocked({o_: p.n, i_: p.k}, ((o_, "o"), (i_, "o"), (r_, "o"), (s_, "o"),
                                                    (o_, "i"), (i_, "i")))
            blk = p.k if tensor == "A" else p.n
            return Blocked({c_: blk}, ((n_, "o"), (c_, "o"), (h_, "o"), (w_, "o"), (c_, "i")))
        if op.params["shape"] and len(op.params["shape"]) == 4:
            raise LoweringError("VTA does not run batch_matmul; use matmul or dense")
        if tensor == "A":
            return Blocked({1: p.k}, ((0, "o"), (1, "o"), (1, "i")))
        if tensor == "out":
            return Blocked({1: p.n}, ((0, "o"), (1, "o"), (1, "i")))
        n_, k_ = (0, 1) if op.params["transpose_b"] else (1, 0)
        return Blocked({n_: p.n, k_: p.k}, ((n_, "o"), (k_, "o"), (n_, "i"), (k_, "i")))

    def layout(self, ctx: LowerContext, operand: str, layout: str) -> Blocked:
        lay = self.blocked(ctx.op, operand)
        if operand == "A" and ctx.op.params.get("padding"):
            # The zero-padding stage A_pad stays in the TIR (the codegen turns it into DMA
            # padding); it reads A in the same blocked layout.
            sch = ctx.sch
            sch.transform_layout(sch.get_sblock("A_pad"), ("read", 0), lay.index_map)
        # The artifact always passes the inputs packed: s_tir may keep an argument in its old
        # layout behind a copy stage, which the codegen then reads as the argument itself.
        ctx.layouts[ctx.input_index(operand)] = lay
        return lay

    def scope(self, level) -> str:
        return "global" if level.role == "global" else f"local.{level.name}"

    def cache(self, ctx: LowerContext, stage) -> None:
        if stage.operand in ("A", "B") and ctx.input_index(stage.operand) not in ctx.layouts:
            # VTA's buffers hold whole entries: an operand the schedule did not pack is packed
            # here, as `pack` would.
            lay = self.layout(ctx, stage.operand, "primitive")
            pos = self._read_index(ctx, ctx.input_index(stage.operand))
            ctx.sch.transform_layout(ctx.block, ("read", pos), lay.index_map)
        super().cache(ctx, stage)
        if stage.operand == "C":
            out = self.blocked(ctx.op, "out")
            ctx.sch.transform_layout(ctx.block, ("write", 0), out.index_map)

    def epilogue(self, ctx: LowerContext, at) -> None:
        if "C_store" not in ctx.blocks or ctx.op.out_dtype != "int8":
            raise LoweringError(f"{ctx.op}: VTA stores int8 results only; give the operator a "
                                f"requantize epilogue (tsl.ops.requantize(shift, ...))")
        super().epilogue(ctx, at)
        sch, lay = ctx.sch, self.blocked(ctx.op, "out")
        out = sch.get_sblock("out")
        sch.transform_layout(out, ("write", 0), lay.index_map)
        if "residual" in [t.role for t in ctx.op.inputs]:
            # The residual (the output's shape) is passed in the output's blocked layout, so
            # that one LOAD ACC_8BIT brings a tile of it next to the accumulator tile.
            names = [r.source.name for r in sch.get(out).reads]
            sch.transform_layout(out, ("read", names.index("residual")), lay.index_map)
            ctx.layouts[ctx.input_index("residual")] = lay
        # Split the channel loop into blocks and lanes, so that each loop walks one dim of the
        # blocked output (the codegen's index analysis is affine per loop).
        loops = sch.get_loops(out)[-len(ctx.op.output.shape):]
        chan = ctx.op.channel_axis % len(loops)
        co, lanes = sch.split(loops[chan], [None, self.p.n])
        sch.reorder(*[co if lp is loops[chan] else lp for lp in loops], lanes)

    # -- compute ------------------------------------------------------------------------------
    def bind(self, ctx: LowerContext, rv, level) -> None:
        """Virtual threads: the loop (fused or not) is annotated with the thread count; the
        codegen runs `count` consecutive iterations as interleaved instruction streams. A loop
        whose extent the count does not divide stays serial. (Splitting the loop in s_tir
        instead would stop tensorize: it cannot blockize under a split of a fused loop.)"""
        if level.count > 1 and int(ctx.sch.get(rv).extent) % level.count == 0:
            ctx.sch.annotate(rv, VTHREADS, level.count)

    def pipeline(self, ctx: LowerContext, loop: Loop, stages: int) -> None:
        ctx.sch.annotate(ctx.rv(loop), STAGES, stages)

    def tensorize(self, ctx: LowerContext, loop: Loop, prim) -> None:
        if prim.m != 1:
            raise LoweringError(f"the VTA back end supports BATCH = 1 only (primitive "
                                f"{prim.name} has m = {prim.m})")
        sch, s = ctx.sch, ctx.tsl
        m = self.machine
        scopes = tuple(self.scope(m.memory_level(name))
                       for name in (prim.c_level, prim.a_level, prim.b_level))
        gemm, reset = intrinsics.register(prim.n, prim.k, scopes)
        k_outer = next(lp for lp in s.loops if s.role_of(lp.axes[0]) == "k")
        init = sch.decompose_reduction(ctx.block, ctx.rv(k_outer))
        inner = s.loops[s.loops.index(loop):]
        n_loop = next(lp for lp in inner if s.role_of(lp.axes[0]) == "n")
        sch.tensorize(ctx.rv(n_loop), gemm)
        sch.tensorize(sch.get_loops(init)[-1], reset)
