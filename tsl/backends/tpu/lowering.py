"""How the shared schedule's steps become s_tir calls for a TPU.

Memory levels become storage scopes named after them ("global.vmem", "global.vmem_acc"), so the
staged buffers in the TIR say where they live; the emitter reads those scopes. A parallel loop
and a pipelined loop are annotated (XLA has no construct for either: the emitter turns the
pipeline into loop-carried prefetch and the estimate splits the parallel loop over TensorCores).
`pack` keeps the operator's layouts: `dot_general` names its contracting dimensions, so B
needs no transposition for the MXU.
"""

from __future__ import annotations

from ...lower import LowerContext, Lowering
from ...primitives.schedule import Loop
from . import intrinsics

PARALLEL = "tsl.parallel"
PIPELINE = "tsl.pipeline_stages"


class TPULowering(Lowering):
    def scope(self, level) -> str | None:
        return "global" if level.role == "global" else f"global.{level.name}"

    def bind(self, ctx: LowerContext, rv, level) -> None:
        ctx.sch.annotate(rv, PARALLEL, level.name)

    def pipeline(self, ctx: LowerContext, loop: Loop, stages: int) -> None:
        ctx.sch.annotate(ctx.rv(loop), PIPELINE, stages)

    def tensorize(self, ctx: LowerContext, loop: Loop, prim) -> None:
        """Zero the accumulator once per tile (outside the reduction), then mark the nest."""
        s = ctx.tsl
        k_outer = next(lp for lp in s.loops if s.role_of(lp.axes[0]) == "k")
        ctx.blocks["C_init"] = ctx.sch.decompose_reduction(ctx.block, ctx.rv(k_outer))
        ctx.blocks["mxu"] = intrinsics.mark(ctx.sch, ctx.rv(loop), prim)
