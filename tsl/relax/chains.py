"""Layout copies and row-wise neighbours computed inside their consumers: one function each.

TVM's `FuseOps` does not fuse a producer into several consumers, nor through `take` (legalized
as an opaque gather) or into the swap's operand packs, which come after fusion. An attention
layer imported from PyTorch is therefore a chain of whole-tensor copies between its GEMMs: the
QKV result transposed (3, seq, 1, d), each third taken out (`take`), split into heads (with the
scale multiplied in), and packed for the batch matmul: four copies of Q, K and V each.

This pass (run after the swap and the layout planning, before the vector rules) merges a
*copy* (a non-tsl PrimFunc whose blocks are all spatial and store a load of one input, at most
scaled, shifted or cast: data movement, nothing worth computing twice) into every consumer that
is itself all spatial, with TVM's `FuseTIR`; a copy read by three consumers is computed inside
each, reading only the part each needs. Repeated until no copy feeds such a consumer, each
chain becomes one function, which the `injective` rule inlines into one loop nest: the
attention's Q, K and V each go from the QKV result to the batch matmul's operand in one pass.

A function read by one consumer only is merged into it too when nothing is computed twice:
an element-wise function into an all-spatial consumer, and an element-wise function or a row
reduction into a consumer that reduces rows (`_merges`): the residual add and the layer norm
after it, the attention mask's max and the softmax, each become one function that
`vector.rowwise` computes row by row. Symbolic shapes are merged alike (the dynamic-seq BERT
layer's glue, as in its static build); the GEMMs with a symbolic dim are calls of
`tsl.relax.symbolic`'s dispatch functions, not call_tirs, and stay as they are.
"""

from __future__ import annotations


def fuse_copy_chains(mod):
    """`mod` with every producer (see above) computed inside its consumers, until no such pair
    is left; functions no longer called are dropped."""
    from tvm import relax

    names = [gv.name_hint for gv, f in mod.functions.items()
             if isinstance(f, relax.Function) and "Primitive" not in f.attrs]
    for _ in range(16):   # each round takes one link off every chain; chains are a few long
        pairs = {n: p for n in names for p in [_pairs(mod, mod[n])] if p}
        if not pairs:
            break
        for name, p in pairs.items():
            mod = _merge(mod, name, p)
        mod = relax.transform.DeadCodeElimination(names)(relax.transform.FuseTIR()(mod))
    return mod


def _pairs(mod, func) -> dict:
    """consumer call -> (argument position, producer call) for every call_tir of `func` that
    `_merges` into all its users (call_tirs, nothing else reads it)."""
    calls, users = _calls_and_users(func)
    pairs = {}
    for var, call in calls.items():
        uses = users.get(var, [])
        if not uses or None in uses or not _merges(mod, call, uses):
            continue
        for u in uses:
            pos = next(i for i, a in enumerate(u.args[1].fields) if a.same_as(var))
            pairs.setdefault(u, (pos, call))   # one producer per consumer and round
    return pairs


def _merges(mod, call, uses: list) -> bool:
    """Whether `call` is computed inside each of its `uses`: a copy into all-spatial consumers;
    an element-wise function into its only consumer; an element-wise function or a reduction
    over rows into its only consumer when that reduces rows too (a residual add into the layer
    norm after it, the attention mask's max into the softmax: `vector.rowwise` computes them
    row by row, each row read back from L1, not from a tensor written before)."""
    if _is_copy(mod, call) and all(_is_spatial(mod, u) for u in uses):
        return True
    if len(uses) != 1:
        return False
    if _reduces_rows(mod, uses[0]):
        return _is_spatial(mod, call) or _reduces_rows(mod, call)
    return _is_spatial(mod, call) and _is_spatial(mod, uses[0])


def _reduces_rows(mod, call) -> bool:
    """`call` runs a non-tsl PrimFunc with reductions, none of them a sliding window (those
    are `tsl.schedules.window`'s: it places their producers itself) or a sum of products of
    two tensors (a matmul or conv the swap left to TVM: not a row reduction)."""
    from ..schedules.window import _slides
    from .match import blocks

    f = _prim(mod, call)
    if f is None:
        return False
    reds = [b for b in blocks(f) if any(iv.iter_type != 0 for iv in b.iter_vars)]
    return bool(reds) and not any(_slides(b) or _sums_products(b) for b in reds)


def _sums_products(block) -> bool:
    """The block accumulates products of two tensors (as the swap's matcher reads a GEMM)."""
    from .match import NoMatch, _product

    try:
        _product(block.body.value, block.writes[0].source)
    except (NoMatch, AttributeError):   # AttributeError: not a single store
        return False
    return True


def _calls_and_users(func):
    """(var -> its call_tir, var -> the calls that read it: a call_tir reading it as an
    argument, None for any other use)."""
    from tvm import relax

    calls, users = {}, {}
    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            if _call_tir(v):
                calls[b.var] = v
                for a in v.args[1].fields:
                    _note(users, a, v if isinstance(a, relax.Var) else None)
            else:
                _note(users, v, None)
    _note(users, func.body.body, None)
    return calls, users


def _note(users: dict, expr, user) -> None:
    from tvm import relax

    for v in relax.analysis.free_vars(expr):
        users.setdefault(v, []).append(user)


def _call_tir(expr) -> bool:
    """A call_tir without scalar arguments whose result and arguments have known shapes."""
    import tvm
    from tvm import relax

    if not (isinstance(expr, relax.Call) and expr.op.same_as(tvm.ir.Op.get("relax.call_tir"))
            and len(expr.args) == 2 and isinstance(expr.args[1], relax.Tuple)):
        return False
    sinfos = [expr.ty] + [a.ty for a in expr.args[1].fields]
    return all(isinstance(s, relax.TensorType) and s.shape is not None for s in sinfos)


KEEP_APART = "tsl.keep_apart"
"""A PrimFunc attribute: the function is merged with no neighbour. Winograd's input transform
reads each element of its input up to 16 times; the output transform and relu before it,
merged in, were computed that often (56x56x64: 1.0 ms a call against 0.16 + 0.27 apart)."""


def _prim(mod, call):
    """The PrimFunc `call` runs, None when it is a tsl kernel or `KEEP_APART` (never merged)."""
    f = mod[call.args[0]]
    return None if "tsl.machine" in f.attrs or KEEP_APART in f.attrs else f


def _is_spatial(mod, call) -> bool:
    """Whether `call` runs a non-tsl PrimFunc whose blocks are all spatial (no reduction)."""
    from .match import blocks

    f = _prim(mod, call)
    return f is not None and all(iv.iter_type == 0 for b in blocks(f) for iv in b.iter_vars)


def _is_copy(mod, call) -> bool:
    """Whether `call` runs a copy: all blocks spatial, each storing one load, at most scaled,
    shifted or cast by constants."""
    import tvm_ffi
    from tvm import tirx

    f = _prim(mod, call)
    if f is None or not _is_spatial(mod, call):
        return False
    stores = []
    tvm_ffi.structural_walk(f.body, [(tirx.BufferStore, stores.append)], order="pre")
    return bool(stores) and all(_moves(s.value) for s in stores)


def _moves(e) -> bool:
    """`e` is a load, cast or combined with constants by + - * /: data movement."""
    from tvm import tirx
    from tvm.ir.expr import TensorLoad

    while isinstance(e, tirx.Cast):
        e = e.value
    if isinstance(e, TensorLoad):
        return True
    if isinstance(e, (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div)):
        const = (tirx.FloatImm, tirx.IntImm)
        return ((isinstance(e.a, const) and _moves(e.b))
                or (isinstance(e.b, const) and _moves(e.a)))
    return False


def _merge(mod, name: str, pairs: dict):
    """`mod` with each consumer call of `pairs` (in function `name`) replaced by a call of a new
    primitive Relax function that runs its producer, then itself (for `FuseTIR` to make one
    PrimFunc of)."""
    from tvm import relax

    bb = relax.BlockBuilder(mod)
    replace = {}
    for consumer, (pos, producer) in pairs.items():
        func, args = _group(consumer, pos, producer)
        gv = bb.add_func(func, _name(mod, producer, consumer))
        replace[consumer] = relax.Call(gv, args)

    @relax.expr_functor.mutator
    class _Replace(relax.PyExprMutator):
        def visit_call_(self, call):
            new = replace.get(call)
            return new if new is not None else super().visit_call_(call)

    out = bb.get()
    out[name] = _Replace(out).visit_expr(out[name])
    return out


def _group(consumer, pos: int, producer):
    """(the primitive Relax function running `producer` then `consumer`, its call's arguments):
    the producer's arguments, then the consumer's others."""
    from tvm import relax

    outer = list(producer.args[1].fields) + [a for i, a in enumerate(consumer.args[1].fields)
                                             if i != pos]
    params = [relax.Var(f"a{i}", a.ty) for i, a in enumerate(outer)]
    n = len(producer.args[1].fields)
    bb = relax.BlockBuilder()
    with bb.function("group", params, attrs={"Primitive": True}, private=True):
        with bb.dataflow():
            t = bb.emit(relax.call_tir(producer.args[0], params[:n], producer.ty))
            args = params[n:]
            args.insert(pos, t)
            out = bb.emit_output(relax.call_tir(consumer.args[0], args, consumer.ty))
        bb.emit_func_output(out)
    return bb.get()["group"], outer


def _name(mod, producer, consumer) -> str:
    """The merged function's name: its parts' names without their `fused_` prefixes."""
    parts = [c.args[0].name_hint.removeprefix("fused_") for c in (producer, consumer)]
    return "fused_" + "_".join(parts)
