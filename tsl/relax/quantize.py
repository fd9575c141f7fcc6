"""Post-training quantization of a float Relax model for VTA (`quantize`).

VTA requantizes by an arithmetic shift and a clip, so every scale is a power of two: a tensor t
is held as t_q = clip(round(t * 2^s), -128, 127) in int8 with one exponent s per tensor. The
exponents come from calibration, as the classic VTA flow's global-scale quantizer: the float
model runs on the CPU over the sample inputs and s is the largest exponent that keeps the
tensor's largest magnitude seen within int8. Batch norms are folded into the convs first
(`fold_batch_norm`). Every conv2d and matmul with constant weights becomes one int8 layer
together with the element-wise chain after it that VTA's ALU runs: the constant bias add, a
residual add (a ResNet skip connection) and a relu,

    acc = op(x_q, W_q, out_dtype=int32) + int32(round(b * 2^(sx+sw)))
    y_q = int8(clip(acc >> (sx + sw - sy), lo, 127))            (no residual)
    y_q = int8(clip(((acc >> (sx + sw - sr)) + r_q) >> (sr - sy), lo, 127))   (residual r)

with lo = 0 where a relu ends the chain (-128 otherwise). A layer's int8 output is the next
layer's int8 input as it is (one exponent per tensor), so consecutive layers are int8 from end
to end, as VTA runs them; int8 meets float only at the edges: x_q = int8(clip(round(x * 2^sx)))
where a float tensor (the image, a pooling's output) enters a layer, y = float(y_q) * 2^-sy
where a float op (pooling, the classifier's output) reads a layer's result.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError

QMAX = 127
_CORES = ("relax.nn.conv2d", "relax.matmul")


@dataclass(eq=False)
class _Layer:
    call: object  # the conv2d / matmul call
    x: object  # the layer's input var
    root: object  # the var the layer's output is (the end of its chain)
    chain: list = field(default_factory=list)  # the vars the layer replaces, call to root
    bias: np.ndarray | None = None
    residual: object = None  # the var of the skip connection added before the relu
    relu: bool = False


def _exponent(amax: float) -> int:
    """The largest s with amax * 2^s <= QMAX (0 for an all-zero tensor)."""
    return 0 if amax <= 0 else int(np.floor(np.log2(QMAX / amax)))


def _is_const(expr) -> bool:
    import tvm
    from tvm.ir.expr import GenericConst

    return isinstance(expr, GenericConst) and isinstance(expr.value, tvm.runtime.Tensor)


def _graph(fn):
    """(var -> its op call, var -> the vars of the calls that use it) of a non-dataflow
    function's op calls."""
    import tvm
    from tvm import relax

    calls, users = {}, {}
    for block in fn.body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op):
                calls[b.var] = b.value
                for a in b.value.args:
                    users.setdefault(a, []).append(b.var)
    return calls, users


def _is_core(c) -> bool:
    return c.op.name in _CORES and _is_const(c.args[1]) and (
        c.op.name == "relax.matmul" or int(c.attrs.groups) == 1)


def _only_user(var, calls, users, outputs):
    """The one call using `var` (None when it has several, or is a function output)."""
    u = users.get(var, [])
    return calls[u[0]] if len(u) == 1 and var not in outputs else None, (u[0] if u else None)


def _walk(layer, calls, users, outputs, heads) -> None:
    """Extend `layer` over the bias add, residual add and relu that follow its call, each the
    only user of the one before."""
    cur = layer.root
    for kind in ("bias", "residual", "relu"):
        c, var = _only_user(cur, calls, users, outputs)
        if c is None:
            return
        a = c.args
        if kind == "bias" and c.op.name == "relax.add" and any(map(_is_const, a)):
            layer.bias = next(x for x in a if _is_const(x)).value.numpy()
        elif kind == "residual" and c.op.name == "relax.add" and not any(map(_is_const, a)):
            other = a[1] if a[0].same_as(cur) else a[0]
            # Two layers meeting in an add (a downsampling block): the add goes with the first
            # operand's layer, the main path of torch's `out += identity`.
            if not a[0].same_as(cur) and a[0] in heads:
                continue
            layer.residual = other
        elif kind == "relu" and c.op.name == "relax.nn.relu":
            layer.relu = True
        else:
            continue
        layer.root = var
        layer.chain.append(var)
        cur = var


def _layers(fn) -> list[_Layer]:
    """The int8 layers of a non-dataflow function, in the order their results are defined."""
    from tvm import relax

    calls, users = _graph(fn)
    body = fn.body.body
    outputs = set(body.fields) if isinstance(body, relax.Tuple) else {body}
    order = {v: i for i, v in enumerate(calls)}
    layers = [_Layer(c, c.args[0], v, [v]) for v, c in calls.items() if _is_core(c)]
    heads = {l.root for l in layers}
    for l in layers:
        u = users.get(l.root, [])
        if len(u) == 1 and calls[u[0]].op.name == "relax.add" and \
                any(map(_is_const, calls[u[0]].args)):
            heads.add(u[0])
    for l in layers:
        _walk(l, calls, users, outputs, heads)
    return sorted(layers, key=lambda l: order[l.root])


def probe(fn, exprs, samples, target: str = "llvm"):
    """The values of `exprs` (vars of the non-dataflow function `fn`) for each sample input,
    from `fn` compiled on the CPU with them as its outputs: a list (per sample) of lists of
    arrays."""
    import tvm
    from tvm import relax

    f = relax.Function(fn.params, relax.SeqExpr(fn.body.blocks, relax.Tuple(exprs)),
                       relax.TupleType([e.ty for e in exprs]))
    vm = relax.VirtualMachine(tvm.compile(tvm.IRModule({"main": f}), target=target), tvm.cpu())
    out = []
    for sample in samples:
        args = sample if isinstance(sample, (list, tuple)) else (sample,)
        vals = vm["main"](*[tvm.runtime.tensor(np.asarray(a)) for a in args])
        out.append([v.numpy() for v in vals])
    return out


def _calibrate(fn, layers, calibration, target) -> dict:
    """var -> exponent of every tensor a layer reads or writes, from the float function run
    over the calibration inputs on the CPU. A residual layer's output takes the residual's
    exponent where calibration gives it a larger one (the sum is then shifted by >= 0)."""
    exprs = list(dict.fromkeys(e for l in layers for e in (l.x, l.root, l.residual)
                               if e is not None))
    amax = np.max([[np.abs(v).max() for v in vals]
                   for vals in probe(fn, exprs, calibration, target)], axis=0)
    s = {e: _exponent(a) for e, a in zip(exprs, amax)}
    for l in layers:  # in definition order: a residual's exponent is final when it is read
        if l.residual is not None:
            s[l.root] = min(s[l.root], s[l.residual])
    return s


class _Rewriter:
    """Emits the quantized function: bindings outside the layers copied with their vars
    substituted, each layer's int8 chain where its root was defined."""

    def __init__(self, bb, layers, s):
        self.bb, self.s = bb, s
        self.at_root = {l.root: l for l in layers}
        self.inside = {v for l in layers for v in l.chain}
        self.env, self.int8 = {}, {}

    def sub(self, e):
        from tvm import relax

        if isinstance(e, relax.Var):
            return self.env.get(e, e)
        if isinstance(e, relax.Call):
            return relax.Call(e.op, [self.sub(a) for a in e.args], e.attrs, e.ty_args)
        if isinstance(e, relax.Tuple):
            return relax.Tuple([self.sub(f) for f in e.fields])
        if isinstance(e, relax.TupleGetItem):
            return relax.TupleGetItem(self.sub(e.tuple_value), e.index)
        return e

    def quantized(self, var):
        """The int8 tensor of `var`: a layer's output as it is, else quantized here."""
        from tvm import relax

        if var not in self.int8:
            op = relax.op
            scaled = op.multiply(self.sub(var), relax.const(2.0 ** self.s[var], "float32"))
            self.int8[var] = self.bb.emit(op.astype(op.clip(op.round(scaled), -QMAX - 1, QMAX),
                                                    "int8"))
        return self.int8[var]

    def binding(self, b) -> None:
        from tvm import relax

        if b.var in self.at_root:
            yq = self.layer(self.at_root[b.var])
            self.int8[b.var] = yq
            deq = relax.op.multiply(relax.op.astype(yq, "float32"),
                                    relax.const(2.0 ** -self.s[b.var], "float32"))
            self.env[b.var] = self.bb.emit(deq)
        elif b.var not in self.inside:
            self.env[b.var] = self.bb.emit(self.sub(b.value))

    def _shift(self, acc, amount: int, what: str):
        from tvm import relax

        if amount < 0:
            raise InputError(f"{what}: the calibrated output needs a left shift ({amount}); "
                             "give calibration inputs that cover the model's range")
        return acc if amount == 0 else self.bb.emit(
            relax.op.right_shift(acc, relax.const(amount, "int32")))

    def layer(self, l: _Layer):
        """The int8 chain of one layer (see the module docstring)."""
        from tvm import relax

        op, bb, s = relax.op, self.bb, self.s
        w = l.call.args[1].value.numpy()
        sw = _exponent(float(np.abs(w).max()))
        wq = relax.const(np.clip(np.round(w * 2.0 ** sw), -QMAX - 1, QMAX).astype("int8"))
        xq = self.quantized(l.x)
        if l.call.op.name == "relax.nn.conv2d":
            a = l.call.attrs
            acc = op.nn.conv2d(xq, wq, strides=a.strides, padding=a.padding, dilation=a.dilation,
                               data_layout="NCHW", kernel_layout="OIHW", out_dtype="int32")
        else:
            acc = op.matmul(xq, wq, out_dtype="int32")
        acc = bb.emit(acc)
        sacc = s[l.x] + sw
        if l.bias is not None:
            bq = np.round(l.bias.astype(np.float64) * 2.0 ** sacc).astype("int32")
            acc = bb.emit(op.add(acc, relax.const(bq)))
        if l.residual is not None:
            acc = self._shift(acc, sacc - s[l.residual], l.call.op.name)
            acc = bb.emit(op.add(acc, op.astype(self.quantized(l.residual), "int32")))
            sacc = s[l.residual]
        acc = self._shift(acc, sacc - s[l.root], l.call.op.name)
        return bb.emit(op.astype(op.clip(acc, 0 if l.relu else -QMAX - 1, QMAX), "int8"))


def quantize(mod, calibration, scheme: str = "power_of_two", skip_first: bool = False,
             target: str = "llvm"):
    """`mod` (float, NCHW convs) with every conv2d / matmul of constant weights, and the bias,
    residual add and relu after it, in int8 with power-of-two scales calibrated on
    `calibration` (a list of inputs, or of argument tuples); `skip_first` leaves the first
    layer in float, as the classic VTA flow does."""
    import tvm
    from tvm import relax

    from .imports import import_passes

    if scheme != "power_of_two":
        raise InputError(f"quantize(scheme={scheme!r}): VTA requantizes by shifts; the only "
                         "scheme is 'power_of_two'")
    if not calibration:
        raise InputError("quantize: give at least one calibration input")
    # Constants first: a torch conv's bias reaches the batch norm through a reshape.
    mod = tvm.transform.Sequential([relax.transform.FoldConstant()] + import_passes()
                                   + [relax.transform.ToNonDataflow()])(mod)
    fn = mod["main"]
    layers = _layers(fn)
    if skip_first and layers:
        first = min(layers, key=lambda l: list(_graph(fn)[0]).index(l.chain[0]))
        layers.remove(first)
    s = _calibrate(fn, layers, calibration, target)
    bb = relax.BlockBuilder()
    attrs = {k: fn.attrs[k] for k in fn.attrs.keys()} if fn.attrs else None
    with bb.function("main", list(fn.params), attrs=attrs):
        rw = _Rewriter(bb, layers, s)
        for block in fn.body.blocks:
            for b in block.bindings:
                rw.binding(b)
        bb.emit_func_output(rw.sub(fn.body.body))
    return tvm.transform.Sequential([relax.transform.DeadCodeElimination(),
                                     relax.transform.ConvertToDataflow()])(bb.get())
