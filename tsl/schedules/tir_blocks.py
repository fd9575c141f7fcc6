"""What the vector rules (`vector`, `window`) read of a TIR function's blocks."""

from __future__ import annotations


def spatial_only(sch, block) -> bool:
    """Whether every iteration variable of `block` is data-parallel (no reduction)."""
    return all(iv.iter_type == 0 for iv in sch.get(block).iter_vars)   # 0: data-parallel


def root_blocks(sch) -> list:
    """The blocks directly under the function's root block ([] when it has none)."""
    try:
        return sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:   # noqa: BLE001 — TVM raises a plain ScheduleError when absent
        return []


def dtype_bits(dtype) -> int:
    import tvm
    return tvm.runtime.DataType(str(dtype)).bits
