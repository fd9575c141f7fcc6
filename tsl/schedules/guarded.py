"""Reductions over a row of run-time length padded to whole vectors, the padding guarded in
the reduction's own body.

A softmax over a sequence reduces rows of symbolic length `n`. Split into lanes partials, TVM
guards the partial vector with the split's predicate (`T.where(k_0 * 16 + k_1 < n)`), and TVM
0.27's `compute_at` drops that predicate when it moves the rfactored block under a row loop
(benchmarks/README.md, dyn39b): the partials read past the row. `pad_reductions` instead gives
the block a reduction domain of whole vectors (`ceildiv(n, lanes) * lanes`) and the update
`acc = op(acc, if_then_else(k < n, x[.., k], init))`: the check is in the body, which every
schedule primitive keeps, and the split by lanes is exact (no predicate). TVM's
`if_then_else` is lazy (a branch in LLVM): the padding's loads are not made. The block's
declared reads are clamped (`x[.., min(k, n - 1)]`) so that `compute_at` gives the producers
of `x` loops of the row's length; in the body the clamp would stay in the whole vectors after
the partition (TVM does not prove `k <= n - 1` there), every load a gather: the BERT layer's
(12, s, s) softmax at s = 128 ran 0.37-0.44 ms so, alone, against 0.12-0.19 (benchmarks/README.md,
seq41b).
"""

from __future__ import annotations


def pad_reductions(func, lanes_of):
    """`func` with every reduction block over one symbolic innermost loop padded and guarded as
    above (`lanes_of(block)`: the lanes of its output dtype), and the names of the blocks so
    changed; (func, []) where there is none."""
    import tvm_ffi
    from tvm import s_tir, tirx

    # The new blocks are made before mapping: tvm_ffi's structural_map is not re-entrant.
    found = []
    tvm_ffi.structural_walk(func.body, [(s_tir.SBlockRealize, found.append)], order="pre")
    new = {r.block.name_hint: (r.iter_values[-1], b) for r in found
           for b in [_padded(r, lanes_of)] if b is not None}

    def on_realize(r):
        if r.block.name_hint not in new:
            return r
        return s_tir.SBlockRealize(r.iter_values, r.predicate, new[r.block.name_hint][1])

    def on_for(f):
        if not isinstance(f.body, s_tir.SBlockRealize) or f.body.block.name_hint not in new:
            return f
        var, block = new[f.body.block.name_hint]
        if not var.same_as(f.loop_var):
            return f
        return tirx.For(f.loop_var, f.min, block.iter_vars[-1].dom.extent, f.kind, f.body,
                        f.thread_binding, f.annotations)

    body = tvm_ffi.structural_map(func.body, [(s_tir.SBlockRealize, on_realize),
                                              (tirx.For, on_for)])
    return func.with_body(body), sorted(new)


def _padded(realize, lanes_of):
    """The block of `realize` padded and guarded, or None where it is not one reduction
    (`acc = op(acc, x)` with an init that `op` leaves unchanged: `_identity`) over a symbolic
    innermost iterator bound to a loop."""
    import tvm_ffi
    from tvm import ir, s_tir, tirx

    block = realize.block
    last = block.iter_vars[-1] if block.iter_vars else None
    if (last is None or last.iter_type != 2 or hasattr(last.dom.extent, "value")
            or block.init is None or not isinstance(realize.iter_values[-1], tirx.Var)
            or sum(iv.iter_type == 2 for iv in block.iter_vars) != 1):
        return None
    store, n = block.body, last.dom.extent
    acc = tirx.BufferLoad(store.buffer, store.indices)
    op = store.value
    if not (isinstance(op, (tirx.Add, tirx.Max, tirx.Min, tirx.Mul))
            and tvm_ffi.structural_equal(op.a, acc) and _identity(op, block.init.value)):
        return None
    k = last.var
    clamp = _substitute(k, tirx.min(k, n - 1))
    guarded = tirx.if_then_else(k < n, op.b, block.init.value)
    lanes = lanes_of(block)
    padded = tirx.floordiv(n + lanes - 1, lanes) * lanes
    iters = list(block.iter_vars[:-1]) + [
        tirx.IterVar(ir.Range.from_min_extent(last.dom.min, padded), k, 2)]
    reads = [tirx.BufferRegion(r.source, [ir.Range.from_min_extent(clamp(x.min), x.extent)
                                          for x in r.region]) for r in block.reads]
    return s_tir.SBlock(iters, reads, block.writes, block.name_hint,
                        tirx.BufferStore(store.buffer, type(op)(op.a, guarded), store.indices),
                        block.init, block.alloc_buffers, block.match_buffers,
                        block.annotations)


def _identity(op, init) -> bool:
    """Whether `init` adds nothing when folded in again by `op`, as the padding's elements are:
    any init of a max or min (the accumulator starts there and only moves away), 0 for a sum,
    1 for a product (a sum whose init is a bias would count it once per padded element)."""
    from tvm import tirx

    if isinstance(op, (tirx.Max, tirx.Min)):
        return True
    unit = 0 if isinstance(op, tirx.Add) else 1
    return isinstance(init, (tirx.IntImm, tirx.FloatImm)) and init.value == unit


def _substitute(var, value):
    """A function replacing `var` by `value` in an expression."""
    import tvm_ffi
    from tvm import tirx

    return lambda e: tvm_ffi.structural_map(
        e, [(tirx.Var, lambda v: value if v.same_as(var) else v)])
