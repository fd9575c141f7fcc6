"""The swap pass: each recognized call gets tsl's kernel, fed and read through Relax.

A tsl kernel takes its operands padded to the schedule's tile multiples and its weights packed
in the primitive's blocked layout (see `Artifact.prepare`); it writes a padded output. The pass
keeps the model's meaning by rewriting each call site

    y = call_tir(fused_conv2d_add_relu, (x, w, b))
 -> x' = pad(x)                       (only when the schedule pads; a TE PrimFunc)
    w' = <w padded and packed>        (a constant when w is one: packed once, at compile time)
    k  = call_tir(fused_conv2d_add_relu_tsl, (x', w', b'))     # the tsl kernel, attrs tsl.*
    y  = crop / reshape (k)           (+ the element-wise tail TVM fused after the epilogue)

so every other function and every other call goes through TVM's pipeline unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..errors import TSLError
from ..ops.operator import np_dtype
from ..primitives.layout import Blocked
from . import match as matching
from . import symbolic
from .targets import machine_for


@dataclass
class Decision:
    """What the bridge did with one PrimFunc (all its call sites)."""

    function: str
    calls: int
    taken: bool
    pattern: str = ""  # the tsl operator and epilogue, when recognized
    schedule: str = ""
    knobs: dict = field(default_factory=dict)
    reason: str = ""  # why TVM keeps it

    def row(self) -> str:
        if self.taken:
            return (f"  tsl  {self.function} x{self.calls}: {self.pattern}; schedule "
                    f"{self.schedule}, knobs {self.knobs}")
        what = f"{self.pattern}: " if self.pattern else ""
        return f"  tvm  {self.function} x{self.calls}: {what}{self.reason}"


@dataclass
class Report:
    machine: str
    decisions: list = field(default_factory=list)
    other: list = field(default_factory=list)  # reductions that are not GEMM/conv (TVM's)
    rest: dict = field(default_factory=dict)  # function -> (rule, why) for the non-tsl ones

    @property
    def taken(self) -> list:
        return [d for d in self.decisions if d.taken]

    @property
    def left(self) -> list:
        return [d for d in self.decisions if not d.taken]

    def __str__(self) -> str:
        head = (f"tsl.relax on {self.machine}: {len(self.taken)} function(s) to tsl, "
                f"{len(self.left)} GEMM/conv-like left to TVM")
        other = (["  (other reductions, TVM's: " + ", ".join(self.other) + ")"]
                 if self.other else [])
        rest = [f"  rest {n}: {rule}" if rule else f"  UNSCHEDULED {n}: {why}"
                for n, (rule, why) in self.rest.items()]
        return "\n".join([head] + [d.row() for d in self.decisions] + other + rest)


_BUILDS: dict = {}


def _build(op, machine, database):
    """tsl.build with a per-process cache: a model repeats shapes (ResNet's blocks)."""
    from ..backend import get_backend
    from ..build import build

    key = (str(op), repr(op.params), op.dtype, op.acc_dtype, repr(op.epilogue), machine.name,
           id(database) if database is not None and not isinstance(database, dict)
           else json.dumps(database, sort_keys=True, default=str))
    if key not in _BUILDS:
        _BUILDS[key] = build(op, machine, knobs=database,
                             **get_backend(machine.backend).relax_options(machine))
    return _BUILDS[key]


def _callers(mod) -> dict:
    """GlobalVar name -> number of call_tir sites, over the module's Relax functions."""
    import tvm
    import tvm_ffi
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")
    counts: dict = {}

    def on_call(c):
        if c.op.same_as(call_tir):
            name = c.args[0].name_hint
            counts[name] = counts.get(name, 0) + 1

    for _, f in mod.functions.items():
        if isinstance(f, relax.Function):
            tvm_ffi.structural_walk(f.body, [(relax.Call, on_call)], order="pre")
    return counts


def plan(mod, machine, database=None, upper_bounds=None) -> tuple[dict, Report]:
    """For each PrimFunc called from Relax: (Match, Artifact) when tsl takes it (a
    `symbolic.Plan` for a function with a symbolic dim, bounded by `upper_bounds` or the
    model's annotations), and the report. Functions without a reduction are not mentioned
    (they are not tsl's business)."""
    from tvm import tirx

    counts = _callers(mod)
    bounds = symbolic.upper_bounds(mod, upper_bounds)
    report, plans = Report(machine.name), {}
    for gv, f in mod.functions.items():
        name = gv.name_hint
        if not isinstance(f, tirx.PrimFunc) or name not in counts or "tsl.machine" in f.attrs:
            continue
        if not any(iv.iter_type != 0 for b in matching.blocks(f) for iv in b.iter_vars):
            continue
        d = Decision(name, counts[name], False)
        if symbolic.symbols(f):
            p = symbolic.decide(f, machine, bounds, database, d, report)
            if p is not None:
                plans[name], d.schedule = p, _schedule_name(p.sm.family)
            continue
        try:
            m = matching.match(f)
        except matching.NotGemm:
            report.other.append(name)
            continue
        except matching.NoMatch as e:
            report.decisions.append(d)
            d.reason = str(e)
            continue
        report.decisions.append(d)
        d.pattern = m.pattern
        try:
            art = _build(m.op, machine, database)
        except TSLError as e:
            d.reason = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            continue
        fn = art.schedule
        d.taken, d.knobs = True, dict(fn.knob_values)
        d.schedule = _schedule_name(m.op)
        plans[name] = (m, art)
    return plans, report


def _schedule_name(op) -> str:
    from ..schedules import default_schedule

    fn = default_schedule(op.name)
    return f"{fn.__module__}.{fn.__qualname__}"


def kernel_func(art, name: str):
    """The artifact's scheduled PrimFunc, tagged for TVM (scheduled: dlight leaves it alone) and
    for users (which machine, which knobs)."""
    f = art.mod["main"]
    if "global_symbol" in f.attrs:
        f = f.without_attr("global_symbol")
    return f.with_attrs({"tsl.machine": art.machine.name,
                         "tsl.knobs": json.dumps(art.schedule.knob_values, sort_keys=True),
                         "tirx.is_scheduled": True})


# -- call-site rewriting ----------------------------------------------------------------------
def _pack_te(shape, padded, layout: Blocked | None, dtype: str, name: str):
    """A TE function: X (any shape with prod(shape) elements) -> reshaped to `shape`, zero
    padded to `padded`, stored in `layout`, as `dtype`."""
    def fn(X):
        from tvm import te, tirx

        out_shape = layout.shape(padded) if layout is not None else padded
        src_strides = _strides(tuple(X.shape))
        strides = _strides(shape)

        def body(*j):
            if layout is None:
                idx = list(j)
            else:
                idx = [0] * len(padded)
                for pos, (d, part) in enumerate(layout.order):
                    b = layout.blocks.get(d)
                    if b is None:
                        idx[d] = j[pos]
                    elif part == "o":
                        idx[d] = idx[d] + j[pos] * b
                    else:
                        idx[d] = idx[d] + j[pos]
            if _same_dims(X.shape, shape):  # no reshape: no index arithmetic per element
                src = idx
            else:
                flat = sum((i * s for i, s in zip(idx, strides)), tirx.const(0, "int64"))
                src = _unflatten(flat, src_strides)
            inside = tirx.all(*[i < n for i, n in zip(idx, shape)])
            return tirx.if_then_else(inside, X[tuple(src)].astype(dtype), tirx.const(0, dtype))
        return te.compute(out_shape, body, name=name)
    return fn


def _crop_te(padded, shape, out_shape, dtype):
    """A TE function: the kernel's padded output -> its `shape` corner, reshaped to `out_shape`,
    as `dtype`."""
    def fn(Y):
        from tvm import te

        strides, src = _strides(out_shape), _strides(shape)

        def body(*j):
            if _same_dims(shape, out_shape):
                return Y[j].astype(dtype)
            flat = sum(i * s for i, s in zip(j, strides))
            return Y[tuple(_unflatten(flat, src))].astype(dtype)
        return te.compute(out_shape, body, name="tsl_crop")
    return fn


def _same_dims(a, b) -> bool:
    """Whether two shapes (ints or PrimExprs) are provably the same: a reshape between them is
    the identity (with a symbolic dim TVM cannot simplify the flattened index away)."""
    from tvm import sym

    an = sym.Analyzer()
    return len(a) == len(b) and all(an.can_prove_equal(x, y) for x, y in zip(a, b))


def _strides(shape) -> list:
    """Row-major strides: ints, or PrimExprs where a dim is symbolic."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc = acc * (int(d) if hasattr(d, "value") or isinstance(d, int) else d)
    return out[::-1]


def _unflatten(flat, strides) -> list:
    from tvm import tirx

    if len(strides) == 1:
        return [flat]
    out = []
    for i, s in enumerate(strides):
        q = tirx.floordiv(flat, s) if i == 0 else tirx.floordiv(tirx.floormod(flat, strides[i - 1]), s)
        out.append(q)
    return out


def _constant(expr):
    """The NumPy value of a Relax constant argument (None when it is computed at run time)."""
    import tvm
    from tvm.ir.expr import GenericConst

    if isinstance(expr, GenericConst) and isinstance(expr.value, tvm.runtime.Tensor):
        return expr.value.numpy()
    return None


def _tail_te(m: matching.Match):
    """A TE function: (kernel result, the tail's extra arguments) -> what TVM's fused function
    computed after the absorbed epilogue, its blocks rebuilt one by one."""
    def fn(R, *extra):
        from tvm import te

        env = [(m.result_buffer, R)] + list(zip(m.tail_buffers, extra))
        for blk in m.tail:
            st = matching._store(blk)
            out = te.compute(tuple(int(d) for d in st.buffer.shape), _rebuild(st, list(env)),
                             name=blk.name_hint)
            env.append((st.buffer, out))
        return env[-1][1]
    return fn


def _rebuild(store, env):
    """fcompute of a TE stage that computes `store`'s value, its loads read from `env`'s
    tensors: (buffer, te.Tensor) pairs."""
    import tvm_ffi
    from tvm import tirx
    from tvm.ir.expr import TensorLoad

    ivs = list(store.indices)

    def body(*ax):
        def on_var(v):
            i = matching._index(ivs, v)
            return ax[i] if i >= 0 else v

        def on_load(ld):
            return next(t for buf, t in env if buf.same_as(ld.source))(*ld.indices)
        return tvm_ffi.structural_map(store.value, [(tirx.Var, on_var), (TensorLoad, on_load)])
    return body


def rewrite(mod, plans: dict):
    """`mod` with every call of a planned PrimFunc rewritten to its tsl kernel (see the module
    docstring); the original PrimFuncs that are no longer called are dropped."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    call_tir = tvm.ir.Op.get("relax.call_tir")
    mod = symbolic.add_dispatch(mod, plans, symbolic.Glue(kernel_func, _pack_te, _crop_te,
                                                          _same_dims, _constant))

    @mutator
    class Swapper(PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.kernels = {}

        def kernel(self, name, art):
            if name not in self.kernels:
                self.kernels[name] = self.builder_.add_func(kernel_func(art, name), name + "_tsl")
            return self.kernels[name]

        def visit_call_(self, call):
            call = self.visit_expr_post_order(call)
            if not (call.op.same_as(call_tir) and call.args[0].name_hint in plans):
                return call
            p = plans[call.args[0].name_hint]
            if isinstance(p, symbolic.Plan):
                return p.call(call)
            return self.swap(call, *p)

        def swap(self, call, m, art):
            bb = self.builder_
            args = list(call.args[1].fields)
            big = art.ctx.op
            fed = []
            for i, (t, tb) in enumerate(zip(m.op.inputs, big.inputs)):
                operand = m.operands[t.role]
                lay = art.ctx.layouts.get(i)
                # The dtype the kernel takes this input in (weights may be widened, like
                # packing: see LowerContext.b_dtype).
                dtype = art.ctx.b_dtype if art.ctx.b_dtype and t.role == "B" else tb.dtype
                value = _constant(args[operand.param])
                if value is not None:
                    x = value.reshape(operand.shape).astype(np_dtype(dtype))
                    fed.append(np.pad(x, [(0, b - a) for a, b in zip(x.shape, tb.shape)]))
                elif lay is None and operand.shape == tb.shape and tuple(
                        int(d) for d in args[operand.param].ty.shape) == tb.shape and str(
                        args[operand.param].ty.dtype) == dtype:
                    fed.append(args[operand.param])
                else:
                    fed.append(bb.emit_te(_pack_te(operand.shape, tb.shape, lay, dtype,
                                                   f"tsl_pack_{t.name}"), args[operand.param]))
            if art.ctx.unsigned_a:
                b = fed[art.ctx.input_index("B")]
                if not isinstance(b, np.ndarray):
                    raise matching.NoMatch("an unsigned-A machine needs constant weights")
                fed.append(big.compensation(b))
            for i, lay in art.ctx.layouts.items():
                if isinstance(fed[i], np.ndarray):
                    fed[i] = lay.apply(fed[i])
            fed = [relax.const(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
                   for x in fed]
            out = big.output
            # What the kernel writes (an epilogue of no steps keeps the accumulator dtype).
            kdtype = str(art.mod["main"].params[-1].ty.dtype)
            want = str(m.result_buffer.dtype)
            y = bb.emit(relax.call_tir(self.kernel(call.args[0].name_hint, art), fed,
                                       relax.TensorType(out.shape, kdtype)))
            if out.shape != m.result_shape or kdtype != want:
                y = bb.emit_te(_crop_te(out.shape, m.op.output.shape, m.result_shape, want), y)
            if m.tail:
                y = bb.emit_te(_tail_te(m), y, *[args[i] for i in m.tail_params])
            return y

    sw = Swapper(mod)
    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function):
            sw.builder_.update_func(gv, sw.visit_expr(f))
    out = sw.builder_.get()
    still = _callers(out)
    for gv in list(out.functions.keys()):
        if gv.name_hint in plans and gv.name_hint not in still:
            out = _without(out, gv)
    return out


def _without(mod, gv):
    import tvm

    funcs = {g: f for g, f in mod.functions.items() if not g.same_as(gv)}
    return tvm.IRModule(funcs, attrs=mod.attrs)


def swap_pass(target, database=None, reports: list | None = None, upper_bounds=None):
    """The Relax module pass: run it after TVM's operator fusion (FuseTIR). `reports`, when
    given, receives the `Report` of each run; `upper_bounds` (symbol name -> int) bounds the
    symbolic dims the model's annotations leave unbounded."""
    import tvm

    machine = machine_for(target)

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.Swap")
    def _swap(mod, _ctx):
        plans, report = plan(mod, machine, database, upper_bounds)
        if reports is not None:
            reports.append(report)
        return rewrite(mod, plans) if plans else mod

    return _swap
