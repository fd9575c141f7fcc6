"""Channels-last activations where the cost model says so: the graph's layout plan before fusion.

An imported CNN is NCHW throughout. tsl's NCHW conv keeps output channels on the vector lanes
and transposes each output tile at the store; its NHWC conv stores the tile as it is, and a
channels-last window (max-pool, depthwise conv) or 1x1 conv reads channels contiguously. Which
one is faster depends on the layer (2-core Xeon, NHWC's time over NCHW's, benchmarks/README.md:
ResNet-18's 3->64 7x7 stem 0.81x, its 64x56x56 3x3 convs 0.93-0.96x ("nhwc42"), its 28x28-7x7
3x3 convs 0.96-1.03x ("res43"), its 1x1 stride-2 convs 0.56-0.69x; MobileNetV2's 1x1 and
depthwise convs 0.6-0.9x ("mnv43")), so the layout is a decision for the graph: a prefix of its
convs (in binding order) runs channels-last, the rest NCHW, chosen by the prices of each conv in
both layouts plus the conversions the prefix needs. A conv is priced by the model's estimates of
tsl's conv2d, a depthwise conv by a roofline of its window rules (`_depthwise_seconds`). The
prefix grows while each conv it takes is priced no dearer channels-last (the first that is not
ends it: the model then prices no further conv, a second search per conv being most of the
plan's time); of those prefixes, the cheapest with its conversions is taken, or none
(`_cheapest_prefix`). `relax.transform.ConvertLayout` makes each candidate (one `permute_dims`
at the entry, one where the prefix ends; every op between must have a layout rule, else it is
wrapped in conversions, which the price then counts: TVM 0.27 has none for `clip`, so ReLU6
crosses as the maximum and minimum it is, `_clips_as_bounds`). A back end offers the layouts
(`Backend.relax_layouts`); with NCHW alone nothing changes.
"""

from __future__ import annotations

import numpy as np

MARGIN = 0.04
"""How much dearer than NCHW a 1x1 conv may be priced channels-last and not end the prefix (its
loss is still counted): the model prices MobileNetV2's 1x1 convs at 14x14 and 7x7 0.91-1.01x in
NHWC and they ran 0.53-0.91x (benchmarks/README.md "mnv43"). Convs with a window are priced as
the model says: their NHWC tiles ran 1.04-1.2x NCHW's time at 28x28-7x7 while the model priced
0.97-1.00x ("nhwc42") only while they split their rows over the cores, each core streaming all
the weights; with their channel blocks split (`schedules._pointwise_split`) they run 0.96-1.03x,
as the model says ("res43")."""

EFFORT = 0.125
"""The plan prices a conv with an eighth of the swap's search (its random sample and the
descents from it): 4-8x faster, and both layouts' estimates 0-5% above the full search's
on MobileNetV2's and ResNet-18's convs, the two alike (benchmarks/README.md "mnv43"). The
plan compares the layouts; the swap then searches the convs it builds in full."""


def channels_last_pass(machine):
    """The Relax module pass: run it after the import passes, before legalization. The convs
    are priced with the model's own knobs (a tuning database's records are of the fused
    functions the swap meets later, epilogues included, not of these)."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.ChannelsLast")
    def _pass(mod, _ctx):
        return plan(mod, machine)[0]

    return _pass


def plan(mod, machine) -> tuple:
    """(`mod` with its first k convs channels-last, k) for the k priced lowest (see the module
    docstring); (`mod`, 0) where none gains, the back end offers no NHWC or the graph has no
    conv to plan."""
    from ..backend import get_backend

    entry = _entry(mod)
    if "NHWC" not in get_backend(machine.backend).relax_layouts(machine) or entry is None:
        return mod, 0
    weights, gains, gain = [], [], 0.0
    for w, call in _plannable(mod[entry], machine):
        nchw, nhwc = _prices(call, machine)
        if nhwc > nchw * (1 + _tolerance(call)):  # the prefix ends at the first conv it loses
            break
        gain += nhwc - nchw
        weights.append(w)
        gains.append(gain)
    best, k = _cheapest_prefix(mod, entry, weights, gains, machine)
    if not k:
        return mod, 0
    from tvm import relax

    return relax.transform.EliminateCommonSubexpr()(_permuted_constants(best)), k


def _entry(mod):
    """The name of the graph the plan converts: "main" (what TVM's torch and ONNX frontends
    name it), else the module's one public Relax function ("forward" of a
    `relax.frontend.nn` export), else None: with several, which one feeds which is not the
    plan's to guess."""
    from tvm import relax

    public = [gv.name_hint for gv, f in mod.functions.items()
              if isinstance(f, relax.Function) and f.attrs is not None
              and "global_symbol" in f.attrs]
    return "main" if "main" in public else public[0] if len(public) == 1 else None


def _cheapest_prefix(mod, entry: str, weights: list, gains: list, machine) -> tuple:
    """(module, k) of the prefix of `weights` whose conv gain (`gains[k - 1]`, seconds over
    the NCHW graph's) plus its conversions is lowest and below zero, else (`mod`, 0). Every
    conv in the prefix gains, so a shorter prefix gains less: the longest is converted first,
    and a shorter one only while its gain plus the entry's conversion, which every prefix
    pays, still beats the best found (ConvertLayout of MobileNetV2 takes 0.2-0.5 s)."""
    best, paid = (0.0, 0, mod), 0.0
    for k in range(len(weights), 0, -1):
        if gains[k - 1] + paid >= best[0]:
            break
        cand = _converted(mod, weights[:k])
        cost = gains[k - 1] + _conversion_seconds(cand[entry], machine)
        paid = _conversion_seconds(cand[entry], machine, entry_only=True)
        if cost < best[0]:
            best = (cost, k, cand)
    return best[2], best[1]


def _plannable(func, machine) -> list:
    """[(weights constant, call)] of the convs of `func` in binding order, up to the first one
    neither tsl's conv2d (`_operators`) nor the depthwise window rules (`_depthwise`) take in
    both layouts (the prefix ends there)."""
    import tvm
    import tvm_ffi
    from tvm import relax

    conv = tvm.ir.Op.get("relax.nn.conv2d")
    calls = []
    tvm_ffi.structural_walk(func.body, [(relax.Call, lambda c: calls.append(c)
                                         if c.op.same_as(conv) else None)], order="post")
    out = []
    for c in calls:
        if _operators(c) is None and _depthwise(c, machine) is None:
            break
        out.append((c.args[1], c))
    return out


def _prices(call, machine) -> tuple:
    """(NCHW, NHWC) seconds of a plannable conv: the model's estimates of tsl's conv2d, or a
    depthwise conv's roofline."""
    ops = _operators(call)
    if ops is None:
        return _depthwise_seconds(call, machine)
    return tuple(_seconds(op, machine) for op in ops)


def _tolerance(call) -> float:
    """How much dearer than NCHW a conv may be priced channels-last and not end the prefix:
    `MARGIN` for a 1x1 conv (its layouts lean NHWC beyond the model's resolution), else 0."""
    _, _, r, s = (int(d) for d in call.args[1].ty.shape)
    return MARGIN if (r, s) == (1, 1) and int(call.attrs.groups) == 1 else 0.0


def _depthwise(call, machine):
    """(n, c, h, w, r, s, stride, out h, out w) of an NCHW depthwise conv (one input and one
    output channel per group, constant weights, even strides, no dilation, static shapes) in
    a float dtype the machine has a peak for, else None: the convs `window.window` (NCHW)
    and `window.channels_window` (NHWC) schedule."""
    a = call.attrs
    if not _nchw_of_constant_weights(call) or not str(call.ty.dtype).startswith("float") \
            or str(call.ty.dtype) not in machine.peaks:
        return None
    st, dil = ({int(v) for v in x} for x in (a.strides, a.dilation))
    try:
        (n, c, h, w), (k, i, r, s), (_, _, oh, ow) = (
            tuple(int(e) for e in x.ty.shape) for x in (*call.args, call))
    except (TypeError, ValueError):
        return None
    if len(st) != 1 or dil != {1} or int(a.groups) != c or (k, i) != (c, 1):
        return None
    return n, c, h, w, r, s, st.pop(), oh, ow


def _depthwise_seconds(call, machine) -> tuple:
    """(NCHW, NHWC) roofline seconds of a depthwise conv: the larger of its vector FMAs at
    the machine's peak and its bytes at the slowest streaming path (`_stream_rate`). Both
    rules read the input, weights and output once; they differ in what fills the vectors:
    NCHW's hold output columns (`window.vector_width` of them: a 7-wide row fills 7 of 16
    lanes), NHWC's channels (all lanes but a last partial vector), and NCHW's stride-2 input
    is copied split by phase first (`window._split_phases`: one more pass over it)."""
    from ..backend import get_backend
    from ..schedules.window import vector_width

    n, c, h, w, r, s, stride, oh, ow = _depthwise(call, machine)
    dtype = str(call.ty.dtype)
    item = np.dtype(dtype).itemsize
    lanes = get_backend(machine.backend).vector_facts(machine).lanes(8 * item)
    vec = vector_width(ow, lanes)
    slots = {"NCHW": n * c * oh * -(-ow // vec) * vec, "NHWC": n * oh * ow * -(-c // lanes) * lanes}
    moved = (n * c * (h * w + oh * ow) + c * r * s) * item
    extra = {"NCHW": 2 * n * c * h * w * item if stride > 1 else 0, "NHWC": 0}
    macs_per_s = machine.peaks[dtype] / 2
    return tuple(max(slots[lay] * r * s / macs_per_s, (moved + extra[lay]) / _stream_rate(machine))
                 for lay in ("NCHW", "NHWC"))


def _operators(call):
    """The tsl conv2d of `call` as (NCHW, NHWC) operators, None when it is not one tsl's
    conv2d takes (grouped, computed weights, uneven padding or strides, symbolic shapes) or
    not a float conv of one dtype throughout (a quantized graph keeps the layout its
    requantize chains are matched in)."""
    from ..errors import TSLError
    from ..ops import defs

    a = call.attrs
    if not _nchw_of_constant_weights(call) or int(a.groups) != 1:
        return None
    dtypes = {str(e.ty.dtype) for e in (call, *call.args)}
    if len(dtypes) != 1 or not dtypes.pop().startswith("float"):
        return None
    pad, st, dil = ({int(v) for v in x} for x in (a.padding, a.strides, a.dilation))
    if len(pad) != 1 or len(st) != 1 or len(dil) != 1:
        return None
    (p,), (t,), (d,) = pad, st, dil
    try:
        (n, c, h, w), (k, _, r, s) = (tuple(int(e) for e in x.ty.shape) for x in call.args)
        return tuple(defs.conv2d(n, c, h, w, k, r, s, stride=t, padding=p, dilation=d,
                                 layout=lay, dtype=str(call.ty.dtype))
                     for lay in ("NCHW", "NHWC"))
    except (TypeError, ValueError, TSLError):
        return None


def _nchw_of_constant_weights(call) -> bool:
    """`call` is an NCHW / OIHW conv (the layouts the plan converts from) whose weights are a
    constant (permuted once, in NumPy, `_permuted_constants`)."""
    from tvm.ir.expr import Constant

    a = call.attrs
    return isinstance(call.args[1], Constant) and (
        str(a.data_layout), str(a.kernel_layout), str(a.out_layout) or "NCHW") == (
            "NCHW", "OIHW", "NCHW")


_PRICES: dict = {}


def _seconds(op, machine) -> float:
    """The model's estimate of `op` with the knobs of a search at `EFFORT` (the back end's
    limits checked, as the swap's search does), once per process for each operator and
    machine: a model repeats its shapes (ResNet-18's 20 convs are 11), and the Winograd pass
    prices the NHWC convs the plan priced."""
    from ..backend import get_backend
    from ..model.search import search
    from ..schedules import default_schedule
    from .swap import _key

    key = (_key(op, machine, None), EFFORT)
    if key not in _PRICES:
        check = get_backend(machine.backend).check
        _PRICES[key] = search(op, machine, default_schedule(op.name), check=check,
                              effort=EFFORT).best.estimate.seconds
    return _PRICES[key]


def _converted(mod, weights: list):
    """`mod` with the convs whose weights are in `weights` NHWC (HWIO) and the rest NCHW,
    ConvertLayout's conversions in between (the weights' own: `_permuted_constants`)."""
    from tvm import relax

    def wanted(call):
        if call.op.name != "relax.nn.conv2d":
            return {}
        mine = any(call.args[1].same_as(w) for w in weights)
        return {"relax.nn.conv2d": ["NHWC", "HWIO"] if mine else ["NCHW", "OIHW"]}

    out = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NCHW", "OIHW"]}, wanted)(
        _clips_as_bounds(mod, True))
    return _clips_as_bounds(out, False)


def _clips_as_bounds(mod, split: bool):
    """`mod` with every `clip(x, lo, hi)` of constant bounds written `minimum(maximum(x, lo),
    hi)` (`split`), or every such pair of scalar constants back as the clip (not `split`).
    ConvertLayout of TVM 0.27 has no layout rule for `clip` and wraps it in two transposes;
    maximum and minimum have one (element-wise), and the clip is what the swap's epilogues and
    `tsl.relax`'s fusion expect."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    x, lo, hi = wildcard(), wildcard(), wildcard()
    if split:
        pattern = is_op("relax.clip")(x, lo, hi)
    else:
        lo, hi = is_const(), is_const()
        pattern = is_op("relax.minimum")(is_op("relax.maximum")(x, lo), hi)

    def rewriter(expr, m):
        bounds = [_scalar(m[b]) for b in (lo, hi)]
        if None in bounds:
            return expr
        if not split:
            return relax.op.clip(m[x], *bounds)
        low, high = (relax.const(v, str(expr.ty.dtype)) for v in bounds)
        return relax.op.minimum(relax.op.maximum(m[x], low), high)

    # A new module: the caller's (the graph as imported, kept where no prefix gains) unchanged.
    return tvm.IRModule({gv: rewrite_call(pattern, rewriter, f) if isinstance(f, relax.Function)
                         else f for gv, f in mod.functions.items()},
                        attrs=mod.attrs, global_infos=mod.global_infos)


def _scalar(expr):
    """The float value of a clip bound (a FloatImm or IntImm) or of a 0-d constant tensor,
    else None."""
    value = getattr(expr, "value", None)
    if isinstance(value, (int, float)):
        return float(value)
    if hasattr(value, "numpy") and value.numpy().ndim == 0:
        return float(value.numpy())
    return None


def _permuted_constants(mod):
    """`mod` with every `permute_dims` of a constant (the converted weights and biases) made
    the permuted constant, in NumPy (FoldConstant compiles and runs a TVM kernel for each:
    3 s of ResNet-18's build)."""
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call

    const = is_const()
    pattern = is_op("relax.permute_dims")(const)

    def rewriter(_expr, m):
        # the matched call: rewrite_call may hand the variable bound to it (`winograd.rewrite`)
        axes = m[pattern].attrs.axes
        axes = [int(a) for a in axes] if axes is not None else None
        return relax.const(np.ascontiguousarray(np.transpose(m[const].value.numpy(), axes)))

    for gv, f in list(mod.functions.items()):
        if isinstance(f, relax.Function):
            mod[gv] = rewrite_call(pattern, rewriter, f)
    return mod


def _conversion_seconds(func, machine, entry_only: bool = False) -> float:
    """The model's time of `func`'s layout conversions (`entry_only`: of its parameters
    alone): each distinct `permute_dims` of an activation (not of a constant) reads and writes
    its tensor once, at the machine's slowest streaming path (`_stream_rate`)."""
    import tvm
    import tvm_ffi
    from tvm import relax

    from tvm.ir.expr import Constant

    perm, seen = tvm.ir.Op.get("relax.permute_dims"), []
    params = list(func.params) if entry_only else None

    def on_call(c):
        if c.op.same_as(perm) and not isinstance(c.args[0], Constant) and not any(
                c.args[0].same_as(s) for s in seen) and (
                    params is None or any(c.args[0].same_as(p) for p in params)):
            seen.append(c.args[0])

    tvm_ffi.structural_walk(func.body, [(relax.Call, on_call)], order="pre")
    moved = sum(2 * int(np.prod([int(d) for d in v.ty.shape]))
                * np.dtype(str(v.ty.dtype)).itemsize for v in seen)
    return moved / _stream_rate(machine)


def _stream_rate(machine) -> float:
    """Bytes per second along the machine's slowest streaming path: the smallest bandwidth
    times instances of a memory level, at the clock."""
    return min(lv.bandwidth * lv.instances for lv in machine.memory
               if lv.bandwidth > 0) * machine.clock_hz
