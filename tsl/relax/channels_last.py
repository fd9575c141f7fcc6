"""Channels-last activations where the cost model says so: the graph's layout plan before fusion.

An imported CNN is NCHW throughout. tsl's NCHW conv keeps output channels on the vector lanes
and transposes each output tile at the store; its NHWC conv stores the tile as it is, and a
channels-last window (max-pool) or 1x1 conv reads channels contiguously. Which one is faster
depends on the layer (ResNet-18, 2-core Xeon, benchmarks/README.md "nhwc42": the 3->64 7x7 stem
0.81x, the 64x56x56 3x3 convs 0.93-0.96x, the 28x28 and smaller 3x3 convs 1.04-1.2x NHWC's
time over NCHW's), so the layout is a decision for the graph: a prefix of its convs (in
binding order) runs channels-last, the rest NCHW, chosen by the model's estimates of each conv
in both layouts plus the conversions the prefix needs. The prefix grows while each conv it
takes is priced cheaper channels-last (the first that is not ends it: the model then prices
no further conv, a second search per conv being most of the plan's time); of those prefixes,
the cheapest with its conversions is taken, or none. `relax.transform.ConvertLayout` makes
each candidate (one `permute_dims` at the entry, one where the prefix ends; every op between
must have a layout rule, else it is wrapped in conversions, which the price then counts: a
MobileNetV2 `clip` keeps it NCHW). A back end offers the layouts (`Backend.relax_layouts`);
with NCHW alone nothing changes.
"""

from __future__ import annotations

import numpy as np

MARGIN = 0.0
"""A channels-last conv is priced at (1 + MARGIN) times the model's estimate of it. It was 0.04
while the model picked NHWC tiles for ResNet-18's 28x28-7x7 3x3 convs that split their row
blocks over the cores (each core streaming all the weights) and ran 1.04-1.2x NCHW's time
(benchmarks/README.md "nhwc42"); with their channel blocks split (`schedules._pointwise_split`)
they run 0.96-1.03x NCHW's time, as the model's 0.97-1.00x says, and the whole graph
channels-last ran 0.985x main's call sites (benchmarks/README.md "res43")."""


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
    """(`mod` with its first k convs channels-last, k) for the k the model prices lowest (see
    the module docstring); (`mod`, 0) where none gains, the back end offers no NHWC or the
    graph has no conv to plan."""
    from ..backend import get_backend

    if "NHWC" not in get_backend(machine.backend).relax_layouts(machine) \
            or not any(gv.name_hint == "main" for gv in mod.functions):
        return mod, 0
    convs, gain = _plannable(mod["main"]), 0.0
    best = (0.0, 0, mod)  # (seconds over the NCHW graph's, k, module)
    for k, (_, ops) in enumerate(convs, 1):
        nchw, nhwc = (_seconds(op, machine) for op in ops)
        if nhwc * (1 + MARGIN) >= nchw:  # the prefix ends at the first conv it would not gain
            break
        gain += nhwc * (1 + MARGIN) - nchw
        cand = _converted(mod, [w for w, _ in convs[:k]])
        cost = gain + _conversion_seconds(cand["main"], machine)
        if cost < best[0]:
            best = (cost, k, cand)
    if not best[1]:
        return mod, 0
    from tvm import relax

    return relax.transform.EliminateCommonSubexpr()(_permuted_constants(best[2])), best[1]


def _plannable(func) -> list:
    """[(weights constant, (NCHW op, NHWC op))] of the convs of `func` in binding order, up to
    the first one tsl's conv2d cannot take in both layouts (the prefix ends there)."""
    import tvm
    import tvm_ffi
    from tvm import relax

    conv = tvm.ir.Op.get("relax.nn.conv2d")
    calls = []
    tvm_ffi.structural_walk(func.body, [(relax.Call, lambda c: calls.append(c)
                                         if c.op.same_as(conv) else None)], order="post")
    out = []
    for c in calls:
        ops = _operators(c)
        if ops is None:
            break
        out.append((c.args[1], ops))
    return out


def _operators(call):
    """The tsl conv2d of `call` as (NCHW, NHWC) operators, None when it is not one tsl's
    conv2d takes (grouped, computed weights, uneven padding or strides, symbolic shapes) or
    not a float conv of one dtype throughout (a quantized graph keeps the layout its
    requantize chains are matched in)."""
    from tvm.ir.expr import Constant

    from ..errors import TSLError
    from ..ops import defs

    a = call.attrs
    if not isinstance(call.args[1], Constant) or int(a.groups) != 1 or (
            str(a.data_layout), str(a.kernel_layout), str(a.out_layout) or "NCHW") != (
                "NCHW", "OIHW", "NCHW"):
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


def _seconds(op, machine) -> float:
    from ..model import evaluate
    from .swap import _recorded

    return evaluate(_recorded(op, machine, None)).seconds


def _converted(mod, weights: list):
    """`mod` with the convs whose weights are in `weights` NHWC (HWIO) and the rest NCHW,
    ConvertLayout's conversions in between (the weights' own: `_permuted_constants`)."""
    from tvm import relax

    def wanted(call):
        if call.op.name != "relax.nn.conv2d":
            return {}
        mine = any(call.args[1].same_as(w) for w in weights)
        return {"relax.nn.conv2d": ["NHWC", "HWIO"] if mine else ["NCHW", "OIHW"]}

    return relax.transform.ConvertLayout({"relax.nn.conv2d": ["NCHW", "OIHW"]}, wanted)(mod)


def _permuted_constants(mod):
    """`mod` with every `permute_dims` of a constant (the converted weights and biases) made
    the permuted constant, in NumPy (FoldConstant compiles and runs a TVM kernel for each:
    3 s of ResNet-18's build)."""
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call

    const = is_const()
    pattern = is_op("relax.permute_dims")(const)

    def rewriter(expr, m):
        axes = [int(a) for a in expr.attrs.axes] if expr.attrs.axes is not None else None
        return relax.const(np.ascontiguousarray(np.transpose(m[const].value.numpy(), axes)))

    for gv, f in list(mod.functions.items()):
        if isinstance(f, relax.Function):
            mod[gv] = rewrite_call(pattern, rewriter, f)
    return mod


def _conversion_seconds(func, machine) -> float:
    """The model's time of `func`'s layout conversions: each distinct `permute_dims` of an
    activation (not of a constant) reads and writes its tensor once, at the machine's slowest
    streaming path (a memory level's bandwidth times its instances at the clock)."""
    import tvm
    import tvm_ffi
    from tvm import relax

    from tvm.ir.expr import Constant

    perm, seen = tvm.ir.Op.get("relax.permute_dims"), []

    def on_call(c):
        if c.op.same_as(perm) and not isinstance(c.args[0], Constant) and not any(
                c.args[0].same_as(s) for s in seen):
            seen.append(c.args[0])

    tvm_ffi.structural_walk(func.body, [(relax.Call, on_call)], order="pre")
    moved = sum(2 * int(np.prod([int(d) for d in v.ty.shape]))
                * np.dtype(str(v.ty.dtype)).itemsize for v in seen)
    rate = min(lv.bandwidth * lv.instances for lv in machine.memory if lv.bandwidth > 0)
    return moved / (rate * machine.clock_hz)
