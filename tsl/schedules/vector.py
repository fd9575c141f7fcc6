"""Machine-generic vector schedules for the functions no tsl kernel takes (issue #24 part 3).

A rule reads a PrimFunc's block structure and, given the machine's vector facts (`lanes`: elements
per vector register for the output dtype, `cores`), returns a scheduled `s_tir.Schedule` or None
when the function is not of its kind. Names no back end: the facts come from the back end hook.

Rules (so far):
- `injective`: spatial blocks only (element-wise / broadcast / layout glue, fused chains of them:
  the producers are inlined into the last block). Its loops are fused,
  split into (cores-parallel outer, lanes-vectorized inner), like TVM's `parallel` + `vectorize`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VectorFacts:
    """What a rule needs of the machine: vector lanes per dtype bits and the core count."""
    vector_bits: int
    cores: int

    def lanes(self, dtype_bits: int) -> int:
        return max(1, self.vector_bits // dtype_bits)


def _spatial_only(sch, block) -> bool:
    return all(iv.iter_type == 0 for iv in sch.get(block).iter_vars)   # 0: data-parallel


def injective(func, facts: VectorFacts):
    """Schedule an all-spatial PrimFunc: inline the producers, fuse the loops, parallel outer,
    vectorize inner. Returns the schedule, or None when `func` is not injective (reduction axes)."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root")) if _has_root(sch) else []
    if not blocks or not all(_spatial_only(sch, b) for b in blocks):
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
    fused = sch.fuse(*loops)
    bits = _dtype_bits(sch.get(blocks[0]).writes[0].source.dtype)
    lanes = facts.lanes(bits)
    outer, inner = sch.split(fused, factors=[None, lanes])
    sch.parallel(outer)
    sch.vectorize(inner)
    return sch


def _has_root(sch) -> bool:
    try:
        sch.get_sblock("root")
        return True
    except Exception:   # noqa: BLE001 — TVM raises a plain ScheduleError when absent
        return False


def _dtype_bits(dtype) -> int:
    import tvm
    return tvm.runtime.DataType(str(dtype)).bits


RULES = (injective,)
