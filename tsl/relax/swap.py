"""The swap pass: each recognized call gets tsl's kernel, fed and read through Relax.

A tsl kernel takes its operands padded to the schedule's tile multiples and its weights packed
in the primitive's blocked layout (see `Artifact.prepare`); it writes a padded output. The pass
keeps the model's meaning by rewriting each call site

    y = call_tir(fused_conv2d_add_relu, (x, w, b))
 -> x' = pad(x)                       (only when the schedule pads; a TE PrimFunc)
    w' = <w padded and packed>        (a constant when w is one: packed once, at compile time)
    k  = call_tir(fused_conv2d_add_relu_tsl, (x', w', b'))     # the tsl kernel, attrs tsl.*
    y  = crop / reshape (k)           (+ the element-wise tail TVM fused after the epilogue)

so every other function and every other call goes through TVM's pipeline unchanged. Each call
is rewritten on its own; `tsl.relax.layouts`, run next, plans the edges between kernels (the
pad / crop functions added here are tagged `LAYOUT_ATTR` for it).
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
_RECORDS: dict = {}


def _key(op, machine, database) -> tuple:
    # The machine by its figures, not its name: "x86-avx512" as a target name takes the host's
    # probed clock and peaks, `tsl.load_machine("x86-avx512")` the file's, and the two plan
    # other tiles (a cache keyed by the name gave one process the other's kernel: ci44).
    return (str(op), repr(op.params), op.dtype, op.acc_dtype, repr(op.epilogue), repr(machine),
            id(database) if database is not None and not isinstance(database, dict)
            else json.dumps(database, sort_keys=True, default=str))


def _recorded(op, machine, database):
    """The schedule tsl.build builds `op` with (the database's knobs, else the model's), with a
    per-process cache: the swap prices a 1x1 conv's two forms before it builds one."""
    from ..build import recorded

    key = _key(op, machine, database)
    if key not in _RECORDS:
        _RECORDS[key] = recorded(op, machine, knobs=database)
    return _RECORDS[key]


def _build(op, machine, database):
    """tsl.build with a per-process cache: a model repeats shapes (ResNet's blocks)."""
    from ..backend import get_backend

    key = _key(op, machine, database)
    if key not in _BUILDS:
        backend = get_backend(machine.backend)
        _BUILDS[key] = backend.build(_recorded(op, machine, database),
                                     **backend.relax_options(machine))
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
        m = _cheaper_form(m, machine, database)
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


def _cheaper_form(m, machine, database):
    """An NCHW 1x1 conv's variant with the pixels on the vector lanes (`match.pixels_on_lanes`)
    where the cost model prices it below the implicit GEMM of `m`, else `m`. Both are priced
    before either is built (building both added a third to MobileNetV2's compile time)."""
    from ..model import evaluate

    alt = matching.pixels_on_lanes(m)
    if alt is None:
        return m
    try:
        if (evaluate(_recorded(alt.op, machine, database)).seconds
                < evaluate(_recorded(m.op, machine, database)).seconds):
            return alt
    except TSLError:
        pass  # either does not fit (the primitive cannot read B in place): the conv as it is
    return m


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
# The PrimFuncs the rewrite adds around a kernel carry `LAYOUT_ATTR`: "pad" (zero padding, the
# elements in place), "pack" (padding into a blocked layout), "crop" or "tail"; a pad or pack
# also names the kernel operand it feeds in `OPERAND_ATTR`. `tsl.relax.layouts` plans across
# calls from these tags, and tests count them.
LAYOUT_ATTR = "tsl.layout"
OPERAND_ATTR = "tsl.operand"


def _pack_te(shape, padded, layout: Blocked | None, dtype: str, name: str):
    """A TE function: X (any shape with prod(shape) elements) -> reshaped to `shape`, zero
    padded to `padded`, stored in `layout`, as `dtype`."""
    def fn(X):
        from tvm import te, tirx

        out_shape = layout.shape(padded) if layout is not None else padded
        src_shape = tuple(X.shape)

        def body(*j):
            idx = list(j) if layout is None else _unblock(layout, len(padded), j)
            inside = tirx.all(*[i < n for i, n in zip(idx, shape)])
            # Clamped: a vectorized if_then_else may load before it selects.
            at = [tirx.min(i, n - 1) for i, n in zip(idx, shape)]
            return tirx.if_then_else(inside, X[tuple(_reindex(at, shape, src_shape))].astype(
                dtype), tirx.const(0, dtype))
        return te.compute(out_shape, body, name=name)
    return fn


def _unblock(layout: Blocked, rank: int, j) -> list:
    """The logical index of stored index `j` of `layout`."""
    idx = [0] * rank
    for pos, (d, part) in enumerate(layout.order):
        b = layout.blocks.get(d)
        idx[d] = j[pos] if b is None else idx[d] + (j[pos] * b if part == "o" else j[pos])
    return idx


def _reindex(idx, shape, src_shape) -> list:
    """Index `idx` of a tensor of `shape` as an index of the same elements stored in
    `src_shape` (row-major): itself when the shapes agree, else through the flat offset (a
    division per dimension, which TVM cannot vectorize: only reshapes pay it)."""
    from tvm import tirx

    if _same_dims(shape, src_shape):
        return list(idx)
    flat = sum((i * s for i, s in zip(idx, _strides(shape))), tirx.const(0, "int64"))
    return _unflatten(flat, _strides(src_shape))


def _crop_te(padded, shape, out_shape, dtype):
    """A TE function: the kernel's padded output -> its `shape` corner, reshaped to `out_shape`,
    as `dtype`."""
    def fn(Y):
        from tvm import te

        return te.compute(out_shape, lambda *j: Y[tuple(_reindex(j, out_shape, shape))].astype(
            dtype), name="tsl_crop")
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


def _tail_te(m: matching.Match, scalars: dict):
    """A TE function: (kernel result, the tail's run-time arguments) -> what TVM's fused
    function computed after the absorbed epilogue, its blocks rebuilt one by one. `scalars`:
    call argument index -> the value of a one-element constant (ONNX's Clip bounds), written
    into the expressions: a load of a 0-d buffer per element keeps TVM from vectorizing."""
    def fn(R, *extra):
        from tvm import te, tirx

        runtime = iter(extra)
        env = [(m.result_buffer, R)] + [
            (buf, next(runtime) if scalars.get(i) is None else tirx.const(scalars[i], buf.dtype))
            for i, buf in zip(m.tail_params, m.tail_buffers)]
        for blk in m.tail:
            st = matching._store(blk)
            out = te.compute(tuple(int(d) for d in st.buffer.shape), _rebuild(st, list(env)),
                             name=blk.name_hint)
            env.append((st.buffer, out))
        return env[-1][1]
    return fn


def _scalar(expr):
    """The value of a one-element Relax constant argument, else None."""
    value = _constant(expr)
    return value.reshape(()).item() if value is not None and value.size == 1 else None


def _rebuild(store, env):
    """fcompute of a TE stage that computes `store`'s value, its loads read from `env`'s
    tensors: (buffer, te.Tensor) pairs."""
    import tvm_ffi
    from tvm import te, tirx
    from tvm.ir.expr import TensorLoad

    ivs = list(store.indices)

    def body(*ax):
        def on_var(v):
            i = matching._index(ivs, v)
            return ax[i] if i >= 0 else v

        def on_load(ld):
            t = next(t for buf, t in env if buf.same_as(ld.source))
            return t(*ld.indices) if isinstance(t, te.Tensor) else t  # a tensor or a constant
        return tvm_ffi.structural_map(store.value, [(tirx.Var, on_var), (TensorLoad, on_load)])
    return body


def _layout_attrs(kind: str, operand: str | None = None) -> dict:
    attrs = {LAYOUT_ATTR: kind}
    if operand is not None:
        attrs[OPERAND_ATTR] = operand
    return attrs


def _feed_input(bb, m, art, i, t, tb, args):
    """Kernel input `i` (operator tensor `t`, padded `tb`): a NumPy array when the argument is
    a constant (padded here, packed by the caller), the argument itself when the kernel takes
    it as it is (reshaped, for an operator that reads it in place), else a pack call."""
    from tvm import relax

    operand = m.operands[t.role]
    lay = art.ctx.layouts.get(i)
    dtype = art.ctx.input_dtype(i)
    arg = args[operand.param]
    value = _constant(arg)
    if value is not None:
        x = value.reshape(operand.shape).astype(np_dtype(dtype))
        return np.pad(x, [(0, b - a) for a, b in zip(x.shape, tb.shape)])
    if lay is None and operand.shape == tb.shape and str(arg.ty.dtype) == dtype:
        if tuple(int(d) for d in arg.ty.shape) == tb.shape:
            return arg
        if art.op.params.get("activation_b"):
            # Read in place: the same elements in another shape (a view, no copy).
            return bb.emit(relax.op.reshape(arg, tb.shape))
    return bb.emit_te(_pack_te(operand.shape, tb.shape, lay, dtype, f"tsl_pack_{t.name}"), arg,
                      primfunc_name_hint=f"tsl_pack_{t.name}",
                      primfunc_attrs=_layout_attrs("pad" if lay is None else "pack", t.name))


def _feed(bb, m, art, args) -> list:
    """The kernel's arguments: its inputs fed (`_feed_input`), the unsigned-A compensation
    when the machine needs one, constants packed in the kernel's layouts."""
    from tvm import relax

    big = art.ctx.op
    fed = [_feed_input(bb, m, art, i, t, tb, args)
           for i, (t, tb) in enumerate(zip(m.op.inputs, big.inputs))]
    if art.ctx.unsigned_a:
        b = fed[art.ctx.input_index("B")]
        if not isinstance(b, np.ndarray):
            raise matching.NoMatch("an unsigned-A machine needs constant weights")
        fed.append(big.compensation(b))
    for i, lay in art.ctx.layouts.items():
        if isinstance(fed[i], np.ndarray):
            fed[i] = lay.apply(fed[i])
    return [relax.const(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
            for x in fed]


def _result(bb, m, art, y, args):
    """What TVM's function returned, from the kernel's output `y`: cropped / reshaped /
    cast when the kernel writes more or another dtype, then the element-wise tail."""
    from tvm import relax

    out = art.ctx.op.output
    kdtype = str(art.mod["main"].params[-1].ty.dtype)
    want = str(m.result_buffer.dtype)
    if art.op.params.get("activation_b") and out.shape != m.result_shape and kdtype == want:
        y = bb.emit(relax.op.reshape(y, m.result_shape))  # written in place: a view
    elif out.shape != m.result_shape or kdtype != want:
        y = bb.emit_te(_crop_te(out.shape, m.op.output.shape, m.result_shape, want), y,
                       primfunc_name_hint="tsl_crop", primfunc_attrs=_layout_attrs("crop"))
    if m.tail:
        scalars = {i: _scalar(args[i]) for i in m.tail_params}
        y = bb.emit_te(_tail_te(m, scalars), y,
                       *[args[i] for i in m.tail_params if scalars[i] is None],
                       primfunc_name_hint="tsl_tail", primfunc_attrs=_layout_attrs("tail"))
    return y


def _swapper(mod, plans: dict):
    """A Relax mutator over `mod` that rewrites each call of a planned PrimFunc to its kernel."""
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
            name = call.args[0].name_hint
            if isinstance(plans[name], symbolic.Plan):
                return plans[name].call(call)
            m, art = plans[name]
            # What the kernel writes (an epilogue of no steps keeps the accumulator dtype).
            args = list(call.args[1].fields)
            kdtype = str(art.mod["main"].params[-1].ty.dtype)
            y = self.builder_.emit(relax.call_tir(
                self.kernel(name, art), _feed(self.builder_, m, art, args),
                relax.TensorType(art.ctx.op.output.shape, kdtype)))
            return _result(self.builder_, m, art, y, args)

    return Swapper(mod)


def rewrite(mod, plans: dict):
    """`mod` with every call of a planned PrimFunc rewritten to its tsl kernel (see the module
    docstring); the original PrimFuncs that are no longer called are dropped."""
    from tvm import relax

    sw = _swapper(mod, plans)
    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function):
            sw.builder_.update_func(gv, sw.visit_expr(f))
    return drop_uncalled(sw.builder_.get(), set(plans))


def drop_uncalled(mod, names):
    """`mod` without the PrimFuncs of `names` that no call site reaches any more."""
    still = _callers(mod)
    for gv in list(mod.functions.keys()):
        if gv.name_hint in names and gv.name_hint not in still:
            mod = _without(mod, gv)
    return mod


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
