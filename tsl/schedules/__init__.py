"""The default TSL schedules: one function per operator family, written against TAM roles
and knobs only. Every back end accepts these functions unchanged.

The nest they build, outer to inner (the same on every machine; what each loop becomes is the
back end's business)::

    b, i.0, j.0     blocks of the output     -> parallel over the "core" compute level
    i.1, j.1        accumulator tiles         -> parallel over "subcore" (warps) if present;
                                                 C is staged in the "accumulator" level here
    k.0             reduction blocks          -> A and B staged in "scratchpad" levels, pipelined
    k.1             reduction steps           -> A and B staged in "operand" levels if present
    i.2, j.2        primitive tiles of the accumulator tile
    i.3, j.3, k.2   one tensor primitive      -> tensorize
"""

from __future__ import annotations

import math

from ..errors import ScheduleError
from ..primitives.schedule import Schedule
from ..tam.machine import dtype_bytes


def _primitive(s: Schedule):
    p = s.primitive
    if p is None:
        raise ScheduleError(f"machine {s.machine.name} has no tensor primitive for operands of "
                            f"{s.op.dtype}; its primitives take "
                            f"{sorted({(q.a_dtype, q.b_dtype) for q in s.machine.primitives})}")
    return p


def _reuse(mi: float, ni: float) -> float:
    """Primitive calls per operand block fed, for an mi x ni tile in primitive units: each
    call reuses a block of A across ni calls and a block of B across mi calls."""
    return mi * ni / (mi + ni)


def _waste(extent: int, tile: int) -> float:
    """Fraction of useful iterations when `extent` is padded to a multiple of `tile`."""
    return extent / (-(-extent // tile) * tile)


def _pick_acc_tile(s: Schedule, p, m_choices, n_choices, m_extent, n_extent):
    """(m_inner, n_inner) in primitive units: the accumulator tile that fits the accumulator
    level with the most reuse per useful (not padded) element; ties go to the larger tile."""
    acc = s.level("accumulator", "C")
    cap = acc.capacity - p.scratch if acc else 1 << 62
    ab = dtype_bytes(s.op.acc_dtype)
    best = None
    for mi in m_choices:
        for ni in n_choices:
            mr, nr = mi * p.m, ni * p.n
            if mr * nr * ab > cap:
                continue
            useful = _waste(m_extent, mr) * _waste(n_extent, nr)
            key = (round(_reuse(min(mr, m_extent) / p.m, min(nr, n_extent) / p.n) * useful, 6),
                   mr * nr)
            if best is None or key > best[0]:
                best = (key, mi, ni)
    if best is None:
        return m_choices[0], n_choices[0]
    return best[1], best[2]


def _pick_k(s: Schedule, p, mr, nr, k_choices, k_extent, stages):
    """k_inner in primitive units: the deepest reduction block that pads the reduction by at
    most 10% and whose A and B tiles (times the pipeline depth) fit every scratchpad that
    holds them."""
    best = k_choices[0]
    for kc in k_choices:
        kk = kc * p.k
        if kc != k_choices[0] and _waste(k_extent, kk) < 0.9:
            continue
        need = {}
        for operand, elems in (("A", mr * kk), ("B", nr * kk)):
            lv = s.level("scratchpad", operand)
            if lv is not None:
                need[lv] = need.get(lv, 0) + elems * dtype_bytes(s.op.dtype) * stages
        if all(v <= lv.capacity for lv, v in need.items()):
            best = kc
    return best


def _round_choices(extent: int, unit: int, choices):
    """Outer tile multipliers that do not exceed the padded extent needlessly."""
    top = max(1, -(-extent // unit))
    kept = [c for c in choices if c <= top]
    return kept or [1]


def _stage_and_map(s: Schedule, tiles, k_block, k_step, prim_loop, stages: int) -> None:
    """The part every operator shares: accumulator tiles over the subcore level (when there is
    one) with C staged there, operands packed, staged per reduction block and step, the block
    loop pipelined, the primitive mapped and the epilogue fused."""
    tile = s.parallel(tiles, "subcore") or tiles[-1]
    s.cache("C", "accumulator", at=tile)
    s.pack("A")
    s.pack("B")
    for operand in ("A", "B"):
        s.cache(operand, "scratchpad", at=k_block)
        s.cache(operand, "operand", at=k_step)
    s.pipeline(k_block, stages)
    s.tensorize(prim_loop)
    s.fuse_epilogue()


def schedule_gemm(s: Schedule) -> None:
    """matmul, batch_matmul and dense: a multi-level tiled GEMM feeding the tensor primitive."""
    p = _primitive(s)
    (i,), (j,), (k,) = s.axes("m"), s.axes("n"), s.axes("k")
    b = s.axes("b")
    M, N, K = i.extent, j.extent, k.extent
    stages = s.knob("stages", (2, 1))
    m_tiles, n_tiles = (1, 2, 4, 6, 8, 12, 16), (1, 2, 3, 4, 6, 8)
    mi0, ni0 = _pick_acc_tile(s, p, m_tiles, n_tiles, M, N)
    sub = s.machine.compute_level("subcore")
    # Accumulator tiles per block side: 2 x 2 when there are warps to run them.
    mo0 = no0 = 2 if sub and sub.count >= 4 else 1
    # Every core needs a block: a small operator gets fewer and then smaller tiles per block.
    batch = math.prod(a.extent for a in b)
    while batch * -(-M // (mi0 * p.m * mo0)) * -(-N // (ni0 * p.n * no0)) < s.machine.cores():
        if mo0 * no0 > 1:
            mo0, no0 = (mo0 // 2, no0) if mo0 >= no0 else (mo0, no0 // 2)
        elif mi0 * ni0 > 1:
            mi0, ni0 = ((max(t for t in m_tiles if t < mi0), ni0) if mi0 * p.m >= ni0 * p.n
                        and mi0 > 1 or ni0 == 1 else (mi0, max(t for t in n_tiles if t < ni0)))
        else:
            break
    m_inner = s.knob("m_inner", m_tiles, mi0)
    n_inner = s.knob("n_inner", n_tiles, ni0)
    mr, nr = m_inner * p.m, n_inner * p.n
    m_choices = _round_choices(M, mr, (1, 2, 4, 8, 16, 32))
    n_choices = _round_choices(N, nr, (1, 2, 4, 8, 16, 32))
    m_outer = s.knob("m_outer", m_choices, min(mo0, max(m_choices)))
    n_outer = s.knob("n_outer", n_choices, min(no0, max(n_choices)))
    k_choices = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    k_inner = s.knob("k_inner", k_choices,
                     _pick_k(s, p, mr * m_outer, nr * n_outer, k_choices, K, stages))
    i0, i1, i2, i3 = s.tile(i, mr * m_outer, mr, p.m)
    j0, j1, j2, j3 = s.tile(j, nr * n_outer, nr, p.n)
    k0, k1, k2 = s.tile(k, k_inner * p.k, p.k)
    # The operand whose panel is larger is the one kept resident: its block loop goes outer.
    outer = s.knob("outer", ("n", "m"), "n" if nr * n_outer > mr * m_outer else "m")
    blocks = [j0, i0] if outer == "n" else [i0, j0]
    s.reorder(*b, *blocks, i1, j1, k0, k1, i2, j2, i3, j3, k2)
    s.parallel(b + blocks, "core")
    _stage_and_map(s, [i1, j1], k0, k1, i3, stages)


def schedule_conv2d(s: Schedule) -> None:
    """conv2d (NCHW or NHWC) as an implicit GEMM: output pixels are rows (m), output channels
    columns (n), input channels the reduction (k) fed to the primitive; the kernel window
    loops run around the primitive."""
    p = _primitive(s)
    n, = [a for a in s.axes("m") if a.name == "n"]
    oh, ow = s.loop("oh"), s.loop("ow")
    co, ci = s.loop("co"), s.loop("ci")
    r, w = s.loop("r"), s.loop("s")
    stages = s.knob("stages", (2, 1))
    P, Q, K, C = oh.extent, ow.extent, co.extent, ci.extent
    # Rows of the accumulator tile come from ow (times p.m); tile_h stacks several rows of oh.
    mi0, ni0 = _pick_acc_tile(s, p, (1, 2, 4, 7, 8, 14, 16, 28), (1, 2, 4, 8), Q, K)
    # 56 and 16 are choices (for VTA's published tiles) but never picked by default.
    w_inner = s.knob("w_inner", (1, 2, 4, 7, 8, 14, 16, 28, 56), mi0)
    co_inner = s.knob("co_inner", (1, 2, 4, 8, 16), ni0)
    h_inner = s.knob("h_inner", _round_choices(P, 1, (1, 2, 4, 7, 8, 14)), 1)
    co_outer = s.knob("co_outer", _round_choices(K, co_inner * p.n, (1, 2, 4, 8)), 1)
    wr, cr = w_inner * p.m, co_inner * p.n
    k_choices = (1, 2, 4, 8, 16, 32, 64)
    ci_inner = s.knob("ci_inner", _round_choices(C, p.k, k_choices),
                      _pick_k(s, p, wr * h_inner * r.extent * w.extent,
                              cr * co_outer * r.extent * w.extent,  # the B tile has r x s
                              _round_choices(C, p.k, k_choices), C, stages))
    oh0, oh1 = s.tile(oh, h_inner)
    ow0, ow1, ow2 = s.tile(ow, wr, p.m)
    co0, co1, co2, co3 = s.tile(co, cr * co_outer, cr, p.n)
    ci0, ci1, ci2 = s.tile(ci, ci_inner * p.k, p.k)
    # reduce_rows: the h_inner rows of the accumulator tile share one pass over the reduction
    # (one load of each weight tile for all rows, as VTA's classic schedule does) instead of
    # one pass per row.
    if s.knob("reduce_rows", (False, True)):
        s.reorder(n, oh0, co0, ow0, co1, ci0, r, w, ci1, oh1, ow1, co2, ow2, co3, ci2)
    else:
        s.reorder(n, oh0, co0, ow0, co1, oh1, ci0, r, w, ci1, ow1, co2, ow2, co3, ci2)
    # parallel_axes: which output-block loops are spread over the "core" level: all of them
    # fused, or only the channel or only the row blocks (VTA's classic oc_nthread / h_nthread
    # virtual threads).
    axes = s.knob("parallel_axes", ("n_oh_co", "co", "oh"))
    s.parallel({"n_oh_co": [n, oh0, co0], "co": [co0], "oh": [oh0]}[axes], "core")
    _stage_and_map(s, [ow0, co1], ci0, ci1, ow2, stages)


DEFAULT = {"matmul": schedule_gemm, "batch_matmul": schedule_gemm, "dense": schedule_gemm,
           "conv2d": schedule_conv2d}


def default_schedule(op_name: str):
    try:
        return DEFAULT[op_name]
    except KeyError:
        raise ScheduleError(f"no default schedule for operator {op_name!r}; pass schedule=") from None
