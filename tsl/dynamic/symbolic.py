"""Kernels whose symbolic extents are run-time arguments: one compile serves every value.

A GEMM family's symbol (dense's batch, matmul's M, attention's sequence in M, N or the
reduction) needs no kernel per value: the schedule is recorded at one value, and the same
steps are replayed on a PrimFunc where each axis that follows the symbol has extent
`n_axis * block` -- `block` the schedule's tile of that axis inside its outermost loop,
`n_axis` a scalar argument of the kernel -- so a value is padded only to the blocks, not to
a rung. The steps are the generic lowering's (`tsl.lower._replay`) with one change: a tile
of a symbolic extent leaves its outer factor to TVM.

Back ends whose code needs static shapes (an instruction stream, a Mosaic grid) keep the
per-rung kernels of `tsl.dynamic.plan`; a back end offers this path with a
`build_symbolic(schedule, blocks, dims)` method.
"""

from __future__ import annotations

import math

from ..errors import ScheduleError
from ..lower import LowerContext, replay
from ..primitives.schedule import Schedule

# The operators whose TE is rebuilt with symbolic extents: parameter -> operator axis.
PARAM_AXIS = {"matmul": {"M": "i", "N": "j", "K": "k"},
              "batch_matmul": {"batch": "b", "M": "i", "N": "j", "K": "k"},
              "dense": {"batch": "i", "out_features": "j", "in_features": "k"}}


def supports(op, axes=()) -> bool:
    """A GEMM whose symbolic `axes` are not its reduction: the CPU lowering of a reduction of
    run-time extent fails in TVM (it reads the extent as an int), so a symbol there keeps the
    per-rung kernels."""
    roles = {a.name: a.role for a in op.axes}
    return op.name in PARAM_AXIS and all(roles[a] != "k" for a in axes)


def block_of(s: Schedule, axis: str) -> int:
    """What one iteration of `axis`'s outermost loop covers (the padded extent over the
    outer tile's count; 1 for an axis never tiled): what a value is padded to."""
    for step in s.steps:
        if step.primitive == "tile" and step.args[0].axes == (axis,):
            return s.padded_extents()[axis] // step.result[0].extent
    return 1


def blocks_of(s: Schedule, axes) -> dict[str, int]:
    return {a: block_of(s, a) for a in axes}


def padded(v: int, block: int) -> int:
    return max(1, math.ceil(v / block)) * block


def padded_op(fam, v: int, blocks: dict[str, int]):
    """The family's operator with each symbolic parameter at v padded to its axis's block
    (padding may take it past the symbol's bound: the operator is built directly)."""
    from ..ops.sym import Sym

    axis = PARAM_AXIS[fam.name]
    return fam.make(**{p: padded(v, blocks.get(axis[p], 1)) if isinstance(x, Sym) else x
                       for p, x in fam.dims.items()})


def _prim_func(op, ext: dict, a_dtype, b_dtype):
    """The operator's tensors with axis extents `ext` (ints or PrimExprs)."""
    from ..ops.defs import _gemm_te

    batch = ext["b"] if op.name == "batch_matmul" else 0
    build = _gemm_te(op.name, op.dtype, op.acc_dtype, op.epilogue, batch, ext["i"], ext["j"],
                     ext["k"], op.params["transpose_b"], (1 if batch else 0) + 1)
    return build(a_dtype, b_dtype)


class _SymbolicSplit:
    """The s_tir schedule, with a split of a symbolic extent given `None` as its outer
    factor (the others stay the recorded tile's)."""

    def __init__(self, sch):
        self._sch = sch

    def __getattr__(self, name):
        return getattr(self._sch, name)

    def split(self, loop, factors, **kw):
        from tvm import tirx

        if not isinstance(self._sch.get(loop).extent, tirx.IntImm):
            factors = [None] + list(factors[1:])
        return self._sch.split(loop, factors=factors, **kw)


def lower_symbolic(s: Schedule, lowering, blocks: dict[str, int]) -> LowerContext:
    """`s` replayed on the PrimFunc whose axes in `blocks` have extent n_axis * block; the
    kernel takes the n_axis (sorted by axis name) after its tensors."""
    from tvm import s_tir, te, tirx

    if not supports(s.op):
        raise ScheduleError(f"{s.op}: only a GEMM's extents can be run-time arguments")
    op = s.op.padded(s.padded_extents())
    ext = {a.name: a.extent for a in op.axes}
    scalars = []
    for a in sorted(blocks):
        if ext[a] % blocks[a]:
            raise ScheduleError(f"{s.op}: axis {a} of {ext[a]} is not whole blocks of "
                                f"{blocks[a]}")
        n = tirx.Var(f"n_{a}", "int32")
        scalars.append(n)
        ext[a] = n * blocks[a] if blocks[a] > 1 else n
    func = te.create_prim_func(list(_prim_func(op, ext, lowering.a_dtype, lowering.b_dtype))
                               + scalars)
    ctx = LowerContext(s, op, _SymbolicSplit(s_tir.Schedule(func)),
                       unsigned_a=op.dtype == "int8" and lowering.a_dtype == "uint8",
                       b_dtype=lowering.b_dtype)
    return replay(s, lowering, ctx)


def dim_axes(op, axes) -> tuple[dict, ...]:
    """Per input and then the output: {dim: axis} for its dims along the symbolic `axes`
    (A, B and C from the operator's tiles; a channel operand along the columns)."""
    ext = {a.name: a.extent for a in op.axes}
    tiles = {r: [ax for ax, _, _ in op.tile_shape(r, ext)] for r in ("A", "B", "C")}
    out = []
    for t in list(op.inputs) + [op.output]:
        names = tiles.get(t.role, tiles["C"] if len(t.shape) == len(tiles["C"]) else ["j"])
        out.append({d: a for d, a in enumerate(names) if a in axes})
    return tuple(out)
