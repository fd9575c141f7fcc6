"""Relax PrimFuncs with symbolic dims (a sequence length): one tsl family per function, its
micro-kernels dispatched on the run-time value inside the Relax graph (issue #25, part 4).

A fused PrimFunc whose buffers have a symbolic extent `s` is recognized by matching it at two
values of `s` (`match.match` on the function with `s` substituted): the operator dims that
change are the ones that follow `s`, so the function is the family with `tsl.ops.sym` there,
bounded by the Relax function's `tir_var_upper_bound` (what `torch.export` with
`Dim(max=...)` records) or by `pipeline(..., upper_bounds={"s": 512})`. `tsl.build` of the
family gives the micro-kernels and the table that picks them per value; each call site of the
function becomes a call of a private Relax function

    def dispatch(x: (s, K)):           # the call site's weights packed once, per kernel layout
        if s <= hi_0:  y = crop(call_tir(kernel_0, pad(x, blocks of kernel 0), n = ceil(s/b0)))
        elif ...       (nested by halves of the ranges)
        else:          y = crop(call_tir(kernel_n, ...))

so the graph compiles once and runs at any `s` up to the bound. Where `s` is whole blocks of
the kernel (or a per-rung kernel's own value) the kernel takes x and gives y as they are, no
pad and crop copies (`_exact`). After the graph's other functions are scheduled,
`entry.one_dispatch` replaces the sites' dispatch functions by one branch at the graph's entry.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError, TSLError
from ..ops.operator import np_dtype
from . import match as matching
from .entry import DISPATCH_ATTR


def symbols(func) -> list:
    """The symbolic tir Vars in `func`'s parameter shapes, in order of appearance."""
    import tvm_ffi
    from tvm import tirx

    out = []

    def on_var(v):
        if not any(v.same_as(x) for x in out):
            out.append(v)
    for p in func.params:
        shape = getattr(p.ty, "shape", None)
        for d in shape or ():
            if not isinstance(d, tirx.IntImm):
                tvm_ffi.structural_walk(d, [(tirx.Var, on_var)], order="pre")
    return out


def upper_bounds(mod, given: dict | None) -> dict[str, int]:
    """Symbol name -> upper bound: the Relax functions' `tir_var_upper_bound` attributes,
    overridden by the `upper_bounds` the caller gave."""
    from tvm import relax

    out: dict[str, int] = {}
    for _, f in mod.functions.items():
        if isinstance(f, relax.Function) and f.attrs and "tir_var_upper_bound" in f.attrs:
            out.update({str(k): int(v) for k, v in f.attrs["tir_var_upper_bound"].items()})
    for k, v in (given or {}).items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise InputError(f"upper_bounds[{k!r}] = {v!r}: give a positive integer")
        out[str(k)] = int(v)
    return out


def _at(func, var, value: int):
    """`func` with symbol `var` replaced by `value` (its parameter shapes included)."""
    import tvm_ffi
    from tvm import tirx

    const = tirx.IntImm(str(var.ty), value)
    return tvm_ffi.structural_map(func, [(tirx.Var, lambda v: const if v.same_as(var) else v)])


# Two values the function is matched at: the dims that differ between them follow the symbol.
# Small (matching builds only TIR, nothing is compiled) and unlike any fixed extent of a layer.
_PROBES = (5, 7)


def _follows(a: tuple, b: tuple, what: str) -> tuple:
    """`a` (at the first probe) with the dims that follow the symbol as None."""
    lo, hi = _PROBES
    out = []
    for x, y in zip(a, b):
        if x == y:
            out.append(x)
        elif (x, y) == (lo, hi):
            out.append(None)
        else:
            raise matching.NoMatch(f"{what} has a dim that is a function of the symbol "
                                   f"({x} at {lo}, {y} at {hi}), not the symbol itself")
    return tuple(out)


@dataclass
class SymMatch:
    """A symbolic PrimFunc as a tsl family: operand shapes with None where the symbol goes."""

    func: object  # the PrimFunc
    var: object  # its tir Var
    family: object  # tsl.ops.Family
    match: matching.Match  # at the first probe value (structure: params, epilogue)
    operands: dict  # name -> (param, shape with None dims)
    result_shape: tuple  # what the function writes, with None dims
    out_shape: tuple  # what the operator writes, with None dims

    @property
    def pattern(self) -> str:
        return f"{self.match.pattern}, " + ", ".join(
            f"{s.name} in [1, {s.upper}]" for s in self.family.syms.values())


def match_symbolic(func, bounds: dict[str, int]) -> SymMatch:
    """The family `func` computes; NoMatch / NotGemm as `match.match`, InputError when its
    symbol has no upper bound."""
    from ..ops import defs
    from ..ops.sym import sym

    vs = symbols(func)
    if len(vs) != 1:
        raise matching.NoMatch(f"{len(vs)} symbolic dims {[str(v) for v in vs]} (tsl takes one)")
    var = vs[0]
    ms = [matching.match(_at(func, var, v)) for v in _PROBES]
    if any(m.tail for m in ms):
        raise matching.NoMatch("element-wise blocks after the kernel with a symbolic shape")
    if ms[0].op.name not in ("matmul", "batch_matmul"):
        raise matching.NoMatch(f"{ms[0].op.name} with a symbolic dim (GEMMs only)")
    name = str(var.name)
    if name not in bounds:
        raise InputError(f"symbolic dim {name!r} of {ms[0].op.name} has no upper bound: export "
                         f"with one (torch.export Dim(..., max=N)) or pass "
                         f"tsl.relax.pipeline(target, upper_bounds={{{name!r}: N}})")
    s = sym(name, upper=bounds[name])
    a, b = (m.op.params["shape"] for m in ms)
    dims = [s if d is None else d for d in _follows(a, b, "the operator")]
    op = ms[0].op
    batch = {"batch": dims.pop(0)} if op.name == "batch_matmul" else {}
    fam = getattr(defs, op.name)(**batch, M=dims[0], N=dims[1], K=dims[2], dtype=op.dtype,
                                 acc_dtype=op.acc_dtype,
                                 transpose_b=op.params["transpose_b"], epilogue=op.epilogue)
    operands = {k: (o.param, _follows(o.shape, ms[1].operands[k].shape, f"operand {k}"))
                for k, o in ms[0].operands.items()}
    return SymMatch(func, var, fam, ms[0], operands,
                    _follows(ms[0].result_shape, ms[1].result_shape, "the result"),
                    _follows(ms[0].op.output.shape, ms[1].op.output.shape, "the output"))


@dataclass
class Plan:
    """A symbolic function tsl takes: its match, the family's artifact, and per call site the
    private Relax function that dispatches (filled by `add_dispatch`)."""

    sm: SymMatch
    art: object  # tsl.dynamic.DynamicArtifact
    sites: list = field(default_factory=list)  # (call, dispatch GlobalVar, call args)
    kernels: list = field(default_factory=list)  # the kernels' GlobalVars (add_dispatch)
    glue: object = None  # the swap pass's Glue (add_dispatch)

    def knobs(self) -> dict:
        return {f"{self.sm.var.name}<={r.hi}": self.art.kernels[r.kernel].knobs
                for r in self.art.table.ranges}

    def call(self, call):
        """The call site's replacement: a call of its dispatch function."""
        from tvm import relax

        gv, args = next((g, a) for c, g, a in self.sites if c.same_as(call))
        return relax.Call(gv, args)


_BUILDS: dict = {}


def _build(fam, machine, database):
    """tsl.build of the family, once per process (layers of a model repeat shapes)."""
    from ..build import build

    key = (str(fam), repr(fam.dims.get("epilogue")), machine.name, id(database))
    if key not in _BUILDS:
        _BUILDS[key] = build(fam, machine, knobs=database)
    return _BUILDS[key]


def plan_one(func, machine, bounds: dict[str, int], database=None) -> Plan:
    """The Plan of symbolic `func`; NoMatch when tsl does not take it, with the reason."""
    sm = match_symbolic(func, bounds)
    art = _build(sm.family, machine, database)
    if any(r.chunk for r in art.table.ranges):
        raise matching.NoMatch("its plan cuts values in chunks (not in a Relax graph)")
    if any(k.artifact.ctx.unsigned_a for k in art.kernels):
        raise matching.NoMatch("an unsigned-A kernel with a symbolic dim")
    return Plan(sm, art)


# -- the dispatch functions --------------------------------------------------------------------
def _ceil_to(v, block: int):
    return v if block == 1 else (v + block - 1) // block * block


def _kernel_shape(art, static: tuple, dims: dict, v, exact: bool = False) -> tuple:
    """A kernel tensor's shape at symbol value `v` (a PrimExpr): run-time extents padded to
    their blocks (`exact`: v itself, for values that are whole blocks); a static kernel's
    shapes are its own."""
    blocks = getattr(art, "blocks", None)
    if not blocks:
        return tuple(static)
    return tuple(_ceil_to(v, 1 if exact else blocks[dims[d]]) if d in dims else n
                 for d, n in enumerate(static))


def _with(shape: tuple, v) -> tuple:
    return tuple(v if d is None else d for d in shape)


def _branch(bb, plan: Plan, kn: int, params, consts: dict, v, exact: bool = False):
    """Emit kernel `kn`'s call at value `v` on the dispatch function's `params`; its result.
    `exact`: for the values whose tensors are the kernel's as they are (whole blocks of a
    kernel with run-time rows, a per-rung kernel's own value): no pad before it, no crop
    after it."""
    from tvm import relax, tirx

    g = plan.glue

    sm, kernel = plan.sm, plan.art.kernels[kn]
    art = kernel.artifact
    big, ctx = art.ctx.op, art.ctx
    in_dims = getattr(art, "in_dims", [{}] * len(big.inputs))
    fed = []
    for i, (t, tb) in enumerate(zip(sm.match.op.inputs, big.inputs)):
        param, shape = sm.operands[t.role]
        lay = ctx.layouts.get(i)
        dtype = ctx.input_dtype(i)
        if param in consts:
            fed.append(_packed_constant(consts, param, shape, tb.shape, lay, dtype))
            continue
        want = _kernel_shape(art, tb.shape, in_dims[i], v, exact)
        x = params[param]
        view = _view(bb, g, x, want, dtype, exact) if lay is None else None
        if view is not None:
            fed.append(view)
        else:
            fed.append(_emit_te(bb, lambda n, shape=shape, tb=tb, i=i, lay=lay, dtype=dtype,
                                tname=t.name: g.pack(
                                    _with(shape, n),
                                    _kernel_shape(art, tb.shape, in_dims[i], n, exact),
                                    lay, dtype, f"tsl_pack_{tname}"), x, v))
    out_shape = _kernel_shape(art, big.output.shape, getattr(art, "out_dims", {}), v, exact)
    kdtype = str(art.mod["main"].params[len(fed)].ty.dtype)
    blocks = getattr(art, "blocks", None) or {}
    scalars = [_ceil_to(v, blocks[a]) // blocks[a] for a in sorted(blocks)]
    scalars = [relax.prim_value(tirx.Cast("int32", n)) for n in scalars]
    y = bb.emit(relax.call_tir(plan.kernels[kn], fed + scalars,
                               relax.TensorType(out_shape, kdtype)))
    want, res = str(sm.match.result_buffer.dtype), _with(sm.result_shape, v)
    view = _view(bb, g, y, res, want, exact)
    if view is not None:
        y = view
    else:
        y = _emit_te(bb, lambda n: g.crop(None, _with(sm.out_shape, n),
                                            _with(sm.result_shape, n), want), y, v)
    return y


def _view(bb, g, x, shape: tuple, dtype: str, exact: bool):
    """`x` as a tensor of `shape` without a copy, or None: itself where the shapes are
    provably equal; where `exact`, a shape cast checked at run time (a per-rung kernel's
    (12, 128, 128) at s = 128), when only the symbol's dims differ."""
    from tvm import relax, tirx

    have = tuple(x.ty.shape)
    if str(x.ty.dtype) != dtype or len(have) != len(shape):
        return None
    if g.same(have, shape):
        return x
    fixed = [(a, b) for a, b in zip(have, shape)
             if isinstance(a, tirx.IntImm) and isinstance(b, (int, tirx.IntImm))]
    if not exact or any(int(a) != int(b) for a, b in fixed):
        return None
    return bb.match_cast(x, relax.TensorType(list(shape), dtype))


def _emit_te(bb, make, x, v):
    """bb.emit_te of the TE function `make(n)` on `x`, where `n` is the symbol as the generated
    PrimFunc sees it (emit_te gives each PrimFunc its own copy of the caller's vars: a TE
    function that closed over the caller's `v` would read a variable it does not define)."""
    return bb.emit_te(lambda X, n: make(n)(X), x, v)


def _packed_constant(consts: dict, param: int, shape: tuple, padded: tuple, lay, dtype):
    """A constant operand reshaped, zero padded to the kernel's shape, in its layout and dtype,
    as a Relax constant (computed once per layout: kernels that share one share it)."""
    from tvm import relax

    key = (param, tuple(padded), repr(lay), dtype)
    if key not in consts["packed"]:
        x = consts[param].reshape(shape).astype(np_dtype(dtype))
        x = np.pad(x, [(0, b - a) for a, b in zip(x.shape, padded)])
        consts["packed"][key] = relax.const(np.ascontiguousarray(lay.apply(x) if lay else x))
    return consts["packed"][key]


def _dispatch(bb, plan: Plan, call, name: str):
    """Add the private Relax functions that run `call` (one call site) through the table: one
    per kernel (pad, kernel, crop) and the dispatch between them. Each kernel's call is a
    function of its own: TVM's memory planning of allocations inside If branches reused a
    storage across branches that the taken branch never allocated (a crash at run time)."""
    from tvm import relax, tirx


    args = list(call.args[1].fields)
    consts = {"packed": {}}
    for i, a in enumerate(args):
        c = plan.glue.constant(a)
        if c is not None:
            consts[i] = c
    sm = plan.sm
    v = tirx.Var(str(sm.var.name), str(sm.var.ty))
    kernels, upper = {}, sm.family.syms[str(v.name)].upper
    for r in plan.art.table.ranges:
        for exact in ((False, True) if _exact(plan, r.kernel, v) is not None else (False,)):
            if (r.kernel, exact) not in kernels:
                params = _params(sm, args, consts, v)
                # The bound lets TVM plan the kernel's buffers once (no allocation per call).
                with bb.function(f"{name}_k{r.kernel}{'_exact' if exact else ''}",
                                 list(params.values()), private=True,
                                 attrs={"tir_var_upper_bound": {str(v.name): upper}}):
                    kernels[r.kernel, exact] = bb.emit_func_output(
                        _branch(bb, plan, r.kernel, params, consts, v, exact))
    params = _params(sm, args, consts, v)

    def call(kn, exact):
        return bb.emit(relax.Call(kernels[kn, exact], list(params.values())))

    def run(kn):
        """Where `_exact` holds the kernel runs on its tensors as they are: the pad and crop
        copies (a 128 x 3072 output: 0.1 ms) only at the other values."""
        cond = _exact(plan, kn, v)
        if cond is None:
            return call(kn, False)
        return _if(bb, cond, lambda: call(kn, True), lambda: call(kn, False))
    # Marked for `entry.one_dispatch`, which replaces the graph's sites' dispatch by one.
    with bb.function(name, list(params.values()), private=True, attrs={DISPATCH_ATTR: upper}):
        gv = bb.emit_func_output(_chain(bb, list(plan.art.table.ranges), run, v))
    return gv, [a for i, a in enumerate(args) if i not in consts]


def _exact(plan: Plan, kn: int, v):
    """When kernel `kn` takes the tensors at value `v` as they are: v whole blocks of each
    block above 1 (run-time rows), v its value (a per-rung kernel); None when always."""
    from tvm import tirx

    kernel = plan.art.kernels[kn]
    blocks = getattr(kernel.artifact, "blocks", None)
    if blocks is None:
        return tirx.EQ(v, tirx.IntImm(str(v.ty), kernel.value))
    zero = tirx.IntImm(str(v.ty), 0)
    whole = [tirx.EQ(tirx.floormod(v, b), zero) for b in sorted(set(blocks.values())) if b > 1]
    return functools.reduce(tirx.And, whole) if whole else None


def _if(bb, cond, yes, no):
    """Emit `if cond: yes() else: no()` (each emitting its branch's bindings); its value."""
    from tvm import relax

    bb._begin_binding_block()
    a = yes()
    a_block = bb._end_block()
    bb._begin_binding_block()
    b = no()
    b_block = bb._end_block()
    return bb.emit(relax.If(relax.prim_value(cond), relax.SeqExpr([a_block], a),
                            relax.SeqExpr([b_block], b)))


def _params(sm: SymMatch, args, consts: dict, v) -> dict:
    """Call argument index -> a Relax parameter for each argument that is not a constant:
    the PrimFunc's parameter shape, its symbol now `v`."""
    import tvm_ffi
    from tvm import relax, tirx

    out = {}
    for i, a in enumerate(args):
        if i not in consts:
            shape = [tvm_ffi.structural_map(d, [(tirx.Var, lambda x: v if x.same_as(sm.var)
                                                 else x)]) for d in sm.func.params[i].ty.shape]
            out[i] = relax.Var(f"x{i}", relax.TensorType(shape, str(a.ty.dtype)))
    return out


def _chain(bb, ranges: list, run, v):
    """run(the kernel of the range holding v), by halving the ranges: ~4 Ifs for 14 ranges,
    not up to 13 (each If a few VM instructions, per GEMM call)."""
    if len(ranges) == 1:
        return run(ranges[0].kernel)
    half = len(ranges) // 2
    return _if(bb, v <= ranges[half - 1].hi, lambda: _chain(bb, ranges[:half], run, v),
               lambda: _chain(bb, ranges[half:], run, v))


def _scalars_first(f):
    """The kernel with its run-time extents before its output: call_tir passes the tensors and
    values it is given as the leading parameters, the output last."""
    from tvm import tirx

    n = sum(1 for p in f.params if not hasattr(p.ty, "shape"))
    if not n:
        return f
    ps = list(f.params)
    return tirx.PrimFunc(ps[:-n - 1] + ps[-n:] + [ps[-n - 1]], f.body, f.ret_type, f.attrs)


@dataclass(frozen=True)
class Glue:
    """What the swap pass lends the dispatch functions (passed in: swap imports this module):
    `kernel(art, name)` the kernel as the module takes it, `pack` / `crop` the TE functions
    around a kernel, `same(shape, shape)` whether two shapes are provably equal, `constant(expr)`
    a constant argument's NumPy value (None when computed at run time)."""

    kernel: object
    pack: object
    crop: object
    same: object
    constant: object


def add_dispatch(mod, plans: dict, glue: Glue):
    """`mod` with the kernels of every symbolic Plan in `plans` and one dispatch function per
    call site (`Plan.sites`)."""
    import tvm
    import tvm_ffi
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")
    sym = {n: p for n, p in plans.items() if isinstance(p, Plan)}
    if not sym:
        return mod
    bb = relax.BlockBuilder(mod)
    for name, p in sym.items():
        p.glue = glue
        p.kernels = [bb.add_func(_scalars_first(glue.kernel(k.artifact, name)),
                                 f"{name}_tsl{n}") for n, k in enumerate(p.art.kernels)]
    calls = []

    def on_call(c):
        if c.op.same_as(call_tir) and c.args[0].name_hint in sym:
            calls.append(c)
    for _, f in mod.functions.items():
        if isinstance(f, relax.Function):
            tvm_ffi.structural_walk(f.body, [(relax.Call, on_call)], order="pre")
    for c in calls:
        p = sym[c.args[0].name_hint]
        gv, args = _dispatch(bb, p, c, f"{c.args[0].name_hint}_dispatch")
        p.sites.append((c, gv, args))
    return bb.get()


def decide(func, machine, bounds, database, decision, report):
    """Fill `decision` (a swap.Decision, added to `report`) for symbolic `func`; the Plan when
    tsl takes it. A missing bound is the caller's to fix: its InputError propagates."""
    try:
        p = plan_one(func, machine, bounds, database)
    except matching.NotGemm:
        report.other.append(decision.function)
        return None
    except (matching.NoMatch, TSLError) as e:
        if isinstance(e, InputError):
            raise
        report.decisions.append(decision)
        decision.reason = (str(e) if isinstance(e, matching.NoMatch)
                           else f"{type(e).__name__}: {str(e).splitlines()[0]}")
        return None
    report.decisions.append(decision)
    decision.taken, decision.pattern, decision.knobs = True, p.sm.pattern, p.knobs()
    return p
