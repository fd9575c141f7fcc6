"""Transposes on the vector unit: a layout conversion (NCHW <-> NHWC) as tiles in registers.

`injective` fuses a function's loops and vectorizes the fused loop: for a transpose every output
vector is then a gather with a div and a mod per lane (the output's innermost axis is not the
input's), and for an innermost axis narrower than a vector (3 channels) a vector spans several
rows of the input: 64x56x56 NHWC -> NCHW took 0.29-0.38 ms and 3x224x224 NCHW -> NHWC
0.17 ms in ResNet-18, 0.08-0.11 and 0.045-0.06 so (2-core Xeon, benchmarks/README.md
"nhwc42"). Here the copy is seen as a 2-D
transpose per leading index, out[.., a, b] = in[.., b, a] (a and b runs of axes, fused), and
cut into tiles of `lanes` x `lanes` elements: each output vector reads one tile's column, the
tile's rows in L1. Where the output's contiguous run is narrower than a vector, the input's
run is the vector instead (whole loads, the stores `b` apart, `b` unrolled).

Names no back end: `lanes` and `cores` come from `VectorFacts`.
"""

from __future__ import annotations


def transpose(func, facts):
    """Schedule a PrimFunc that is one copy `out[v] = in[perm(v)]` whose permutation swaps two
    runs of axes after a common prefix (see above); None when it is not one, a run does not
    split into whole vectors, or TVM refuses a step."""
    from tvm import s_tir
    from tvm.s_tir.schedule import ScheduleError

    from .tir_blocks import dtype_bits, root_blocks

    sch = s_tir.Schedule(func)
    blocks = root_blocks(sch)
    if len(blocks) != 1:
        return None
    runs = _swapped_runs(sch.get(blocks[0]))
    if runs is None or len(sch.get_loops(blocks[0])) != sum(runs):
        return None
    lanes = facts.lanes(dtype_bits(sch.get(blocks[0]).writes[0].source.dtype))
    loops = sch.get_loops(blocks[0])
    lead, n_a = runs[0], runs[1]
    try:
        a = sch.fuse(*loops[lead:lead + n_a])
        b = sch.fuse(*loops[lead + n_a:])
        return _tiled(sch, loops[:lead], a, b, lanes)
    except ScheduleError:
        return None


def _tiled(sch, prefix: list, a, b, lanes: int):
    """The (a, b) loops cut into `lanes` x `lanes` tiles, the output's run `b` vectorized; or,
    `b` narrower than a vector, `a` (the input's contiguous run) vectorized under `b`
    unrolled. The prefix and the tiles' outer loops run parallel. None where a run that is cut
    does not divide into vectors (a predicate per vector)."""
    ea, eb = (int(sch.get(lp).extent) for lp in (a, b))
    if eb >= lanes:
        if eb % lanes or (ea >= lanes and ea % lanes):
            return None
        b_o, b_i = sch.split(b, factors=[None, lanes])
        a_o, a_i = sch.split(a, factors=[None, lanes]) if ea >= lanes else (None, a)
        outer = [lp for lp in (a_o, b_o) if lp is not None]
        sch.reorder(*outer, a_i, b_i)
        sch.parallel(sch.fuse(*prefix, *outer))
        sch.vectorize(b_i)
        return sch
    if ea % lanes:
        return None
    a_o, a_i = sch.split(a, factors=[None, lanes])
    sch.reorder(a_o, b, a_i)
    sch.parallel(sch.fuse(*prefix, a_o))
    sch.unroll(b)
    sch.vectorize(a_i)
    return sch


def _swapped_runs(block):
    """(prefix, len(a), len(b)) in loops when `block` stores `in[prefix, b, a]` to
    `out[prefix, a, b]` (its iter vars in that order, a copy: no arithmetic), else None.
    Axes of extent 1 (indexed 0 once simplified) go with whichever run holds them."""
    from tvm import tirx
    from tvm.ir.expr import TensorLoad

    st = block.body
    if not isinstance(st, tirx.BufferStore) or not isinstance(st.value, TensorLoad):
        return None
    ivars = [iv.var for iv in block.iter_vars]
    unit = [int(getattr(iv.dom.extent, "value", 0)) == 1 for iv in block.iter_vars]
    out, src = list(st.indices), list(st.value.indices)
    if (any(iv.iter_type != 0 for iv in block.iter_vars) or len(out) != len(ivars)
            or not all(o.same_as(v) or (u and _zero(o)) for o, v, u in zip(out, ivars, unit))):
        return None
    pos = [next((j for j, v in enumerate(ivars) if v.same_as(s)), -1) for s in src]
    if any(p < 0 and not _zero(s) for p, s in zip(pos, src)):
        return None
    kept = [i for i in range(len(ivars)) if not unit[i]]
    order = [kept.index(p) for p in pos if p >= 0 and not unit[p]]
    k = len(kept)
    for lead in range(k):
        for cut in range(lead + 1, k):
            if order == list(range(lead)) + list(range(cut, k)) + list(range(lead, cut)):
                return kept[lead], kept[cut] - kept[lead], len(ivars) - kept[cut]
    return None


def _zero(e) -> bool:
    return getattr(e, "value", None) == 0
