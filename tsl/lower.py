"""Generic lowering: a recorded TSL schedule replayed on `tvm.s_tir.Schedule`.

The loop structure (tile, reorder, fuse) is the same for every back end. What a memory level,
a compute level, a primitive or a packed layout becomes is asked of the back end's `Lowering`
(its hooks); the base class gives the plain s_tir meaning of each. Steps are applied in phases
that s_tir accepts (loops, packing, staging, epilogue, parallel, pipeline, tensorize), not in
the order the schedule function called them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import LoweringError, ScheduleError
from .ops.operator import Operator
from .primitives.layout import Blocked
from .primitives.schedule import Loop, Schedule, Stage
from .tam.machine import ComputeLevel, MemoryLevel, TensorPrimitive


@dataclass
class LowerContext:
    """What the hooks work on: the s_tir schedule of the padded operator, and the map from
    TSL loops to s_tir loops."""

    tsl: Schedule
    op: Operator  # the padded operator that is actually compiled
    sch: object  # tvm.s_tir.Schedule
    loops: dict = field(default_factory=dict)  # id(Loop) -> LoopRV
    layouts: dict = field(default_factory=dict)  # input index -> Blocked
    blocks: dict = field(default_factory=dict)  # name -> SBlockRV made by hooks
    unsigned_a: bool = False  # int8 A fed as uint8: the kernel takes a compensation argument
    b_dtype: str | None = None  # the dtype the kernel takes B in, when not the operator's
    main: str = "C"  # the reduction block the schedule works on ("C_rf" once split)

    def rv(self, loop: Loop):
        return self.loops[id(loop)]

    @property
    def block(self):
        return self.sch.get_sblock(self.main)

    def input_index(self, role: str) -> int:
        return [t.role for t in self.op.inputs].index(role)

    def input_dtype(self, i: int) -> str:
        """The dtype the kernel takes input `i` in (B may be widened: `b_dtype`)."""
        if self.b_dtype and i == self.input_index("B"):
            return self.b_dtype
        return self.op.inputs[i].dtype


class Lowering:
    """Back-end hooks with the plain s_tir meaning of each primitive. A back end subclasses
    this and overrides what differs on its machine."""

    a_dtype: str | None = None  # operand A dtype the primitive wants (None: the op's)
    b_dtype: str | None = None  # operand B dtype the kernel takes (None: the op's)

    def __init__(self, machine):
        self.machine = machine

    # -- hooks ------------------------------------------------------------------------------
    def layout(self, ctx: LowerContext, operand: str, layout: str) -> Blocked | None:
        """The blocked layout `pack(operand, layout)` means here; None keeps the layout."""
        return None

    def scope(self, level: MemoryLevel) -> str | None:
        """The storage scope of a memory level; None: nothing is copied (a hardware cache)."""
        return "global" if level.managed else None

    def cache(self, ctx: LowerContext, stage: Stage) -> None:
        scope = self.scope(stage.level)
        if scope is None:
            return
        sch, blk = ctx.sch, ctx.block
        if stage.operand == "C":
            cw = sch.cache_write(blk, 0, scope)
            sch.reverse_compute_at(cw, ctx.rv(stage.at), preserve_unit_loops=True)
            ctx.blocks["C_store"] = cw
        else:
            idx = ctx.input_index(stage.operand) if stage.operand in ("A", "B") else 0
            cr = sch.cache_read(blk, self._read_index(ctx, idx), scope)
            sch.compute_at(cr, ctx.rv(stage.at), preserve_unit_loops=True)
            ctx.blocks[f"{stage.operand}_{stage.level.name}"] = cr

    def split_reduction(self, ctx: LowerContext, rv) -> None:
        """`split_reduction(loop)`: the back end must place the pass that sums the partials."""
        raise LoweringError(f"the back end of {self.machine.name} does not lower "
                            f"split_reduction (a split reduction's partial sums need a pass "
                            f"that adds them); leave the reduction unsplit (split_k=1)")

    def bind(self, ctx: LowerContext, rv, level: ComputeLevel) -> None:
        ctx.sch.parallel(rv)

    def pipeline(self, ctx: LowerContext, loop: Loop, stages: int) -> None:
        """Nothing by default: machines with hardware prefetch overlap by themselves."""

    def epilogue(self, ctx: LowerContext, at: Loop | None) -> None:
        sch = ctx.sch
        try:
            out = sch.get_sblock("out")
        except Exception:  # noqa: BLE001 - TVM raises its own error type for a missing block
            return
        if "C_store" in ctx.blocks:
            # The copy-out of the staged accumulator becomes the epilogue itself.
            sch.compute_inline(ctx.blocks.pop("C_store"))
            out = sch.get_sblock("out")
            ctx.blocks["C_store"] = out
        if at is not None:
            sch.reverse_compute_at(out, ctx.rv(at), preserve_unit_loops=True)

    def tensorize(self, ctx: LowerContext, loop: Loop, prim: TensorPrimitive) -> None:
        raise LoweringError(f"back end of {self.machine.name} does not lower tensor primitive "
                            f"{prim.name}")

    def finalize(self, ctx: LowerContext) -> None:
        """Last touches after every step (unroll, vectorize, decompose the reduction...)."""

    # -- helpers ----------------------------------------------------------------------------
    def _read_index(self, ctx: LowerContext, input_index: int) -> int:
        """Position of an input among the reads of block C (stages such as A_pad or A_cast
        stand between the function argument and the block)."""
        names = [r.source.name for r in ctx.sch.get(ctx.block).reads]
        want = ctx.op.inputs[input_index].name
        for i, n in enumerate(names):
            if n == want or n.startswith(want + "_"):
                return i
        raise LoweringError(f"block C reads {names}, none of them input {want!r}")


def lower(schedule: Schedule, lowering: Lowering) -> LowerContext:
    """Replay `schedule` on s_tir with `lowering`'s hooks. TVM errors become LoweringError."""
    from tvm import s_tir

    op = schedule.op.padded(schedule.padded_extents())
    func = op.prim_func(lowering.a_dtype, lowering.b_dtype)
    ctx = LowerContext(schedule, op, s_tir.Schedule(func),
                       unsigned_a=op.dtype == "int8" and lowering.a_dtype == "uint8",
                       b_dtype=lowering.b_dtype)
    return replay(schedule, lowering, ctx)


def replay(schedule: Schedule, lowering: Lowering, ctx: LowerContext) -> LowerContext:
    """`schedule`'s steps on `ctx.sch` (also for a PrimFunc built elsewhere, such as one of
    run-time extents: tsl.dynamic.symbolic). TVM errors become LoweringError."""
    try:
        _replay(schedule, lowering, ctx)
    except (ScheduleError, LoweringError):
        raise
    except Exception as e:  # noqa: BLE001 - TVM's errors have no common base worth naming
        raise LoweringError(f"lowering {schedule.op} for {lowering.machine.name} failed in TVM; "
                            f"the schedule was:\n{schedule}\nTVM said: {_first_line(e)}") from e
    return ctx


def _replay(s: Schedule, hooks: Lowering, ctx: LowerContext) -> None:
    _replay_loops(s, hooks, ctx)
    _replay_packing(s, hooks, ctx)
    # Phase 3: staging (accumulator first: it brackets the reduction).
    for st in sorted(s.stages, key=lambda st: st.operand != "C"):
        hooks.cache(ctx, st)
    # Phase 4: epilogue.
    if s.epilogue_at is not None or "C_store" in ctx.blocks:
        hooks.epilogue(ctx, s.epilogue_at)
    # Phase 5: parallel.
    for lp in s.loops:
        if lp.parallel:
            hooks.bind(ctx, ctx.rv(lp), s.machine.compute_level(lp.parallel))
    # Phase 6: pipeline.
    for lp in s.loops:
        if lp.stages > 1:
            hooks.pipeline(ctx, lp, lp.stages)
    # Phase 7: tensorize.
    for lp in s.loops:
        if lp.tensorized is not None:
            hooks.tensorize(ctx, lp, lp.tensorized)
    hooks.finalize(ctx)


def _replay_loops(s: Schedule, hooks: Lowering, ctx: LowerContext) -> None:
    """Phase 1: loop structure (tile, reorder, fuse, split_reduction, parallel fuses)."""
    sch = ctx.sch
    blk = ctx.block
    # `current` maps each operator axis to its original loop, `by_loop` each TSL loop made by a
    # step to its s_tir loop.
    current = {ax.name: rv for ax, rv in zip(s.op.axes, sch.get_loops(blk))}
    by_loop = {}
    for step in s.steps:
        if step.primitive == "tile":
            new = sch.split(_rv(by_loop, current, step.args[0]),
                            factors=[lp.extent for lp in step.result])
            by_loop.update((id(lp), r) for lp, r in zip(step.result, new))
        elif step.primitive == "reorder":
            sch.reorder(*[_rv(by_loop, current, lp) for lp in step.args])
        elif step.primitive == "fuse":
            by_loop[id(step.result[0])] = sch.fuse(*[_rv(by_loop, current, lp)
                                                     for lp in step.args])
        elif step.primitive == "split_reduction":
            _split_reduction(sch, hooks, ctx, _rv(by_loop, current, step.args[0]),
                             (by_loop, current))
        elif step.primitive == "parallel" and step.result and isinstance(step.result[0], Loop):
            rvs = [_rv(by_loop, current, lp) for lp in step.args[0]]
            by_loop[id(step.result[0])] = sch.fuse(*rvs) if len(rvs) > 1 else rvs[0]
    ctx.loops.update(by_loop)  # loops since fused stay reachable for the hooks
    for lp in s.loops:
        ctx.loops[id(lp)] = _rv(by_loop, current, lp)


def _replay_packing(s: Schedule, hooks: Lowering, ctx: LowerContext) -> None:
    """Phase 2: packing (an operand read in the layout its `pack` step gave)."""
    sch = ctx.sch
    blk = ctx.block  # the partial sums' block after split_reduction
    # Block C's read of the operand is transformed: for a function argument that changes the
    # signature (the artifact packs the array), for a stage such as A_pad the stage itself
    # writes the packed layout inside the kernel.
    for operand, layout in s.packed.items():
        lay = hooks.layout(ctx, operand, layout)
        if lay is not None and not lay.is_identity():
            idx = ctx.input_index(operand)
            pos = hooks._read_index(ctx, idx)
            if operand == "A" and sch.get(blk).reads[pos].source.name == ctx.op.inputs[idx].name:
                # Activations are packed by a stage inside the kernel, so that the time of
                # packing is counted; weights (B) are packed once, by the artifact.
                ctx.blocks["A_pack"] = sch.cache_read(blk, pos, "global")
                pos = hooks._read_index(ctx, idx)
            buf = sch.get(blk).reads[pos].source.name
            sch.transform_layout(blk, ("read", pos), lay.index_map)
            if buf == ctx.op.inputs[idx].name:
                ctx.layouts[idx] = lay


def _split_reduction(sch, hooks: Lowering, ctx: LowerContext, rv, tables) -> None:
    """The hook's split (s_tir rfactor) moves the reduction into a new block with new loops;
    the loop references in `tables` are moved to their counterparts there."""
    before = [sch.get_sref(r) for r in sch.get_loops(ctx.block)]
    where = []
    for table in tables:
        for key, r in table.items():
            try:
                sref = sch.get_sref(r)
            except Exception:  # noqa: BLE001 - a loop split before: no longer there
                continue
            pos = next((n for n, b in enumerate(before) if b.same_as(sref)), None)
            if pos is not None:
                where.append((table, key, pos))
    hooks.split_reduction(ctx, rv)
    after = sch.get_loops(ctx.block)
    for table, key, pos in where:
        table[key] = after[pos]


def _rv(by_loop, current, lp: Loop):
    if id(lp) in by_loop:
        return by_loop[id(lp)]
    return current[lp.axes[0]]


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    for line in reversed(text):
        if line.strip() and not line.startswith(("  ", "File", "Stack")):
            return line.strip()[:500]
    return text[0][:500] if text else type(e).__name__
