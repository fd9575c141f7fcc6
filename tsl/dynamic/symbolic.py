"""Kernels whose row count is a run-time argument: one compile serves every value.

A GEMM family's symbol on its rows (dense's batch, matmul's M) needs no kernel per value:
the schedule is recorded at one value, and the same steps are replayed on a PrimFunc whose
row extent is `n * block` -- `block` the schedule's outer row tile, `n` a scalar argument
of the kernel -- so the row-block loop runs `n` times and a value is padded only to the
block, not to a rung. The steps are the generic lowering's (`tsl.lower._replay`) with one
change: a tile of the symbolic extent leaves its outer factor to TVM (`n`).

Back ends whose code needs static shapes (an instruction stream, a Mosaic grid) keep the
per-rung kernels of `tsl.dynamic.plan`; a back end offers this path with a
`build_symbolic(schedule, block)` method.
"""

from __future__ import annotations

import math

from ..errors import LoweringError, ScheduleError
from ..lower import LowerContext, _first_line, _replay
from ..primitives.schedule import Schedule

GEMMS = ("matmul", "batch_matmul", "dense")


def supports(op, axis: str) -> bool:
    """Whether `op`'s TE can be rebuilt with axis `axis` symbolic (a GEMM's rows)."""
    return op.name in GEMMS and axis == "i"


def row_block(s: Schedule, axis: str = "i") -> int:
    """The rows one iteration of the outer row loop covers (the padded extent over the
    outer tile's count): what a value is padded to."""
    for step in s.steps:
        if step.primitive == "tile" and step.args[0].axes == (axis,):
            return s.padded_extents()[axis] // step.result[0].extent
    return s.padded_extents()[axis]


def _prim_func(op, rows, a_dtype, b_dtype):
    """The operator's PrimFunc with `rows` (a PrimExpr) rows; the scalar `n` is appended to
    the arguments by the caller."""
    from tvm import te

    from ..ops.defs import _gemm_te

    shape = op.params["shape"]
    batch = shape[0] if op.name == "batch_matmul" else 0
    N, K = shape[-2], shape[-1]
    build = _gemm_te(op.name, op.dtype, op.acc_dtype, op.epilogue, batch, rows, N, K,
                     op.params["transpose_b"], (1 if batch else 0) + 1)
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


def lower_symbolic(s: Schedule, lowering, block: int) -> LowerContext:
    """`s` (recorded at a value padded to a multiple of `block`) replayed on the PrimFunc of
    `n * block` rows; the kernel takes `n` after its tensors."""
    from tvm import s_tir, te, tirx

    if not supports(s.op, "i"):
        raise ScheduleError(f"{s.op}: only a GEMM's rows can be a run-time argument")
    op = s.op.padded(s.padded_extents())
    if op.output.shape[-2] % block:
        raise ScheduleError(f"{s.op}: rows {op.output.shape[-2]} are not whole blocks of "
                            f"{block}")
    n = tirx.Var("n", "int32")
    args = _prim_func(op, n * block, lowering.a_dtype, lowering.b_dtype)
    func = te.create_prim_func(list(args) + [n])
    ctx = LowerContext(s, op, _SymbolicSplit(s_tir.Schedule(func)),
                       unsigned_a=op.dtype == "int8" and lowering.a_dtype == "uint8",
                       b_dtype=lowering.b_dtype)
    try:
        _replay(s, lowering, ctx)
    except (ScheduleError, LoweringError):
        raise
    except Exception as e:  # noqa: BLE001 - TVM's errors have no common base worth naming
        raise LoweringError(f"lowering {s.op} with symbolic rows for {lowering.machine.name} "
                            f"failed in TVM: {_first_line(e)}") from e
    return ctx


def blocks(rows: int, block: int) -> int:
    return max(1, math.ceil(rows / block))
