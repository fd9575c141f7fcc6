"""One dispatch per graph instead of one per call site (issue #25).

`tsl.relax.symbolic` makes every call of a GEMM with a symbolic dim a call of a private
dispatch function: a tree of `relax.If` on the symbol's value (the table's ranges, then
whether the value is whole blocks of the kernel) whose leaves call one private function per
kernel. In the Relax VM each If costs three packed calls (the condition's value, a shape
function, `read_if_cond`) and each function level a shape heap, tensor checks and shape
matches: ~40 VM instructions per GEMM call at seq 128, where the static build runs ~4
(benchmarks/README.md, seq42).

Every site's choice is a function of the same symbol, so this pass decides them all once, at
the entry: it evaluates each site's tree at every value of the symbol up to its bound (vector
arithmetic on the conditions, no compile), groups the values whose leaves are the same at
every site, and gives each group a copy of the entry function in which each site calls its
leaf directly. The entry becomes a tree of Ifs on the conditions the sites' trees use, its
leaves calls of the copies. Each copy is planned by TVM's memory planner on its own, with the
group's largest value as the symbol's bound. The PrimFuncs (kernels, glue) are shared by the
copies: only Relax bindings are copied. A graph whose sites would need more than
`MAX_COPIES` copies keeps its per-site dispatch.
"""

from __future__ import annotations

import numpy as np

# More copies than this and the graph keeps its per-site dispatch: each copy is the whole
# entry function again through TVM's memory planning and VM code generation.
MAX_COPIES = 96

# The attribute that marks a dispatch function (`tsl.relax.symbolic`): its symbol's bound.
DISPATCH_ATTR = "tsl.dispatch_upper"


def one_dispatch():
    """The Relax module pass (after the sites' dispatch functions exist, before memory
    planning): see the module docstring."""
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.OneDispatch")
    def _pass(mod, _ctx):
        out = mod
        for gv, f in list(mod.functions.items()):
            if (isinstance(f, relax.Function) and f.attrs
                    and "global_symbol" in f.attrs):
                out = _specialize(out, gv, f)
        # The dispatch functions the copies replaced, the leaves no copy calls and the
        # kernels only those called: TVM's dead-code pass drops what no public function reaches.
        return mod if out is mod else relax.transform.DeadCodeElimination()(out)

    return _pass


class _Unsupported(Exception):
    """A dispatch function or condition this pass does not take (the graph keeps its
    per-site dispatch)."""


def _specialize(mod, gv, f):
    """`mod` with entry function `f` (at `gv`) branching once into its copies."""
    sites = _sites(mod, f)
    if not sites:
        return mod
    try:
        var, values = _symbol(f, sites)
        choice, conds = _choices(mod, sites, var, values)
    except _Unsupported:
        return mod
    # group[i]: which copy serves values[i] (the same leaf at every site)
    keys, group = np.unique(choice, axis=1, return_inverse=True)
    group = group.reshape(-1)
    if keys.shape[1] > MAX_COPIES:
        return mod
    leaves = [s[2] for s in sites]
    copies = [_copy(f, var, {s[0]: leaves[n][keys[n, g]] for n, s in enumerate(sites)},
                    int(values[group == g].max())) for g in range(keys.shape[1])]
    return _entry(mod, gv, f, copies, _tree(np.arange(len(values)), group, conds))


def _sites(mod, f) -> list:
    """(dispatch GlobalVar, its function, [] for its leaves' GlobalVars, its calls) of every
    dispatch function `f` calls, in order of first call."""
    import tvm_ffi
    from tvm import relax

    out = {}

    def on_call(c):
        op = c.op
        if isinstance(op, relax.GlobalVar) and op in mod.functions:
            callee = mod[op]
            if (isinstance(callee, relax.Function) and callee.attrs
                    and DISPATCH_ATTR in callee.attrs):
                out.setdefault(op.name_hint, (op, callee, [], []))[3].append(c)
    tvm_ffi.structural_walk(f.body, [(relax.Call, on_call)], order="pre")
    return list(out.values())


def _symbol(f, sites) -> tuple:
    """`f`'s symbolic var, which every site passes as its dispatch function's symbol, and
    the values 1..the smallest of the sites' bounds (their families are built up to it)."""
    from tvm import tirx

    from .symbolic import symbols

    vs = symbols(f)
    if len(vs) != 1:
        raise _Unsupported("one symbol")
    for _, d, _, calls in sites:
        inner = symbols(d)
        if len(inner) != 1:
            raise _Unsupported("one symbol per dispatch function")
        for c in calls:  # a site whose symbol is 2 * s (say) is not s's choice
            for p, a in zip(d.params, c.args):
                for dp, da in zip(p.ty.shape, a.ty.shape):
                    if (isinstance(dp, tirx.Var) and dp.same_as(inner[0])
                            and not da.same_as(vs[0])):
                        raise _Unsupported(f"a site whose symbol is {da}")
    bound = min(int(d.attrs[DISPATCH_ATTR]) for _, d, _, _ in sites)
    return vs[0], np.arange(1, bound + 1, dtype=np.int64)


def _choices(mod, sites, var, values) -> tuple:
    """Per site, per value, the index of the leaf its tree takes (sites x values), and the
    trees' conditions in `var` with their truth at every value."""
    import tvm_ffi
    from tvm import tirx

    from .symbolic import symbols

    choice, conds = [], {}
    for _, d, leaves, _ in sites:
        v = symbols(d)[0]
        on_var = [(tirx.Var, lambda x, v=v: var if x.same_as(v) else x)]

        def cond(e, v=v, on_var=on_var):
            truth = _eval(e, v, values).astype(bool)
            conds.setdefault(truth.tobytes(), (tvm_ffi.structural_map(e, on_var), truth))
            return truth
        choice.append(_walk(d.body, d.params, cond, leaves, len(values)))
    return np.stack(choice), list(conds.values())


def _walk(expr, params, cond, leaves: list, n: int):
    """The leaf index `expr` (a dispatch function's body) takes at each of `n` values;
    `leaves` receives the leaves' GlobalVars. `cond(e)` is a condition's truth per value."""
    from tvm import relax

    if isinstance(expr, relax.SeqExpr):
        body = next((b.value for blk in expr.blocks for b in blk.bindings
                     if b.var.same_as(expr.body)), expr.body)
        return _walk(body, params, cond, leaves, n)
    if isinstance(expr, relax.If):  # its condition a PrimExpr (`relax.prim_value`)
        return np.where(cond(expr.cond), _walk(expr.true_branch, params, cond, leaves, n),
                        _walk(expr.false_branch, params, cond, leaves, n))
    if (isinstance(expr, relax.Call) and isinstance(expr.op, relax.GlobalVar)
            and len(expr.args) == len(params)
            and all(a.same_as(p) for a, p in zip(expr.args, params))):
        if not any(g.same_as(expr.op) for g in leaves):
            leaves.append(expr.op)
        return np.full(n, next(i for i, g in enumerate(leaves) if g.same_as(expr.op)))
    raise _Unsupported(f"{type(expr).__name__} in a dispatch function")


_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
           "FloorDiv": np.floor_divide, "FloorMod": np.mod, "Min": np.minimum,
           "Max": np.maximum, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
           "GE": np.greater_equal, "EQ": np.equal, "NE": np.not_equal,
           "And": np.logical_and, "Or": np.logical_or}


def _eval(e, v, values: np.ndarray) -> np.ndarray:
    """Integer expression `e` of var `v` at every one of `values` (vectorized)."""
    from tvm import tirx

    if isinstance(e, tirx.Var):
        if not e.same_as(v):
            raise _Unsupported(f"a condition on {e.name}")
        return values
    if isinstance(e, tirx.IntImm):
        return np.full(values.shape, int(e.value), dtype=np.int64)
    if isinstance(e, tirx.Cast):
        return _eval(e.value, v, values)
    if isinstance(e, tirx.Not):
        return np.logical_not(_eval(e.a, v, values))
    op = _BINARY.get(type(e).__name__)
    if op is None:
        raise _Unsupported(f"{type(e).__name__} in a condition")
    return op(_eval(e.a, v, values), _eval(e.b, v, values))


def _tree(idx: np.ndarray, group: np.ndarray, conds: list):
    """A decision tree over the values `idx`: a group index (a leaf) or (condition, true
    subtree, false subtree); each split the condition that leaves the fewest groups on its
    larger side (a binary search over the ranges where they split evenly)."""
    here = np.unique(group[idx])
    if len(here) == 1:
        return int(here[0])
    best, score = None, None
    for e, truth in conds:
        t = truth[idx]
        if t.all() or not t.any():
            continue
        s = max(len(np.unique(group[idx[t]])), len(np.unique(group[idx[~t]])))
        if score is None or s < score:
            best, score = (e, t), s
    e, t = best  # two values that differ in a leaf differ in some site's condition
    return (e, _tree(idx[t], group, conds), _tree(idx[~t], group, conds))


def _copy(f, var, leaf_of: dict, upper: int):
    """A private copy of `f` in which each dispatch call calls its leaf, the symbol bounded by
    `upper`."""
    import tvm_ffi
    from tvm import relax

    c = relax.utils.copy_with_new_vars(f)
    c = tvm_ffi.structural_map(c, [(relax.GlobalVar, lambda g: next(
        (leaf for d, leaf in leaf_of.items() if d.same_as(g)), g))])
    return c.without_attr("global_symbol").with_attr(
        "tir_var_upper_bound", {str(var.name): upper})


def _entry(mod, gv, f, copies: list, tree):
    """`mod` with the copies added and `f` (at `gv`) replaced by the tree's Ifs calling them."""
    from tvm import relax

    from .symbolic import _if

    bb = relax.BlockBuilder(mod)
    gvs = [bb.add_func(c, f"{gv.name_hint}_v{i}") for i, c in enumerate(copies)]

    def emit(node):
        if not isinstance(node, tuple):
            return bb.emit(relax.Call(gvs[node], list(f.params)))
        e, yes, no = node
        return _if(bb, e, lambda: emit(yes), lambda: emit(no))
    with bb.function(f"{gv.name_hint}_entry", list(f.params)):
        tmp = bb.emit_func_output(emit(tree))
    out = bb.get()
    new = out[tmp]
    out = _without(out, {tmp.name_hint})
    out[gv] = relax.Function(new.params, new.body, f.ret_ty, f.is_pure, f.attrs)
    return out


def _without(mod, names: set):
    import tvm

    return tvm.IRModule({g: f for g, f in mod.functions.items() if g.name_hint not in names},
                        attrs=mod.attrs)
