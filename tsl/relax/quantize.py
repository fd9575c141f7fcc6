"""Post-training quantization of a float Relax model for VTA (`quantize`).

VTA requantizes by an arithmetic shift and a clip, so every scale is a power of two: a tensor t
is held as t_q = clip(round(t * 2^s), -128, 127) in int8 with one exponent s per tensor. The
exponents come from calibration, as the classic VTA flow's global-scale quantizer: the float
model runs on the CPU over the sample inputs and s is the largest exponent that keeps the
tensor's largest magnitude seen within int8. Batch norms are folded into the convs first
(`fold_batch_norm`). Every conv2d and matmul with constant weights (and the constant bias added
after it) then becomes

    x_q = int8(clip(round(x * 2^sx)))                     (the layer's input)
    acc = op(x_q, W_q, out_dtype=int32) + int32(round(b * 2^(sx+sw)))
    y_q = int8(clip(acc >> (sx + sw - sy)))               (the requantize epilogue)
    y   = float(y_q) * 2^-sy                              (for the float parts in between)

so the int8 core of each layer is the int8 x int8 -> int32 + bias -> shift -> clip that tsl's
kernels (VTA's ALU, the CPU's int8 path) run bit-exact; the float parts (pooling, the residual
adds, the activations) stay as they were on the dequantized values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError

QMAX = 127


@dataclass(eq=False)
class _Layer:
    call: object  # the conv2d / matmul call
    root: object  # the expr the layer's output is (the bias add, or the call)
    x: object  # the layer's input expr
    sx: int = 0
    sy: int = 0


def _exponent(amax: float) -> int:
    """The largest s with amax * 2^s <= QMAX (0 for an all-zero tensor)."""
    return 0 if amax <= 0 else int(np.floor(np.log2(QMAX / amax)))


def _is_const(expr) -> bool:
    import tvm
    from tvm.ir.expr import GenericConst

    return isinstance(expr, GenericConst) and isinstance(expr.value, tvm.runtime.Tensor)


def _layers(fn) -> list[_Layer]:
    """The conv2d / matmul calls with a constant weight of a non-dataflow function, each with
    the constant bias add that directly follows it, in program order."""
    import tvm
    from tvm import relax

    out, by_var = [], {}
    for block in fn.body.blocks:
        for b in block.bindings:
            v = b.value
            if not isinstance(v, relax.Call) or not isinstance(v.op, tvm.ir.Op):
                continue
            name = v.op.name
            if name in ("relax.nn.conv2d", "relax.matmul") and \
                    _is_const(v.args[1]) and (
                    name == "relax.matmul" or int(v.attrs.groups) == 1):
                layer = _Layer(v, b.var, v.args[0])
                by_var[b.var] = layer
                out.append(layer)
            elif name == "relax.add" and _is_const(v.args[1]) \
                    and v.args[0] in by_var:
                by_var[v.args[0]].root = b.var
    return out


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


def _calibrate(fn, layers, calibration, target) -> None:
    """Exponents of each layer's input and output from the float function run over the
    calibration inputs on the CPU."""
    exprs = [e for l in layers for e in (l.x, l.root)]
    amax = np.max([[np.abs(v).max() for v in vals]
                   for vals in probe(fn, exprs, calibration, target)], axis=0)
    for i, layer in enumerate(layers):
        layer.sx, layer.sy = _exponent(amax[2 * i]), _exponent(amax[2 * i + 1])


def _quantized(layer, bias):
    """The int8 expression of one layer (see the module docstring)."""
    from tvm import relax

    op = relax.op
    w = layer.call.args[1].value.numpy()
    sw = _exponent(float(np.abs(w).max()))
    wq = np.clip(np.round(w * 2.0 ** sw), -QMAX - 1, QMAX).astype("int8")
    xq = op.astype(op.clip(op.round(op.multiply(layer.x, relax.const(2.0 ** layer.sx, "float32"))),
                           -QMAX - 1, QMAX), "int8")
    if layer.call.op.name == "relax.nn.conv2d":
        a = layer.call.attrs
        acc = op.nn.conv2d(xq, relax.const(wq), strides=a.strides, padding=a.padding,
                           dilation=a.dilation, data_layout="NCHW", kernel_layout="OIHW",
                           out_dtype="int32")
    else:
        acc = op.matmul(xq, relax.const(wq), out_dtype="int32")
    if bias is not None:
        bq = np.round(bias.astype(np.float64) * 2.0 ** (layer.sx + sw)).astype("int32")
        acc = op.add(acc, relax.const(bq))
    shift = layer.sx + sw - layer.sy
    if shift < 0:
        raise InputError(f"{layer.call.op.name}: the calibrated output needs a left shift "
                         f"({shift}); give calibration inputs that cover the model's range")
    yq = op.astype(op.clip(op.right_shift(acc, relax.const(shift, "int32")), -QMAX - 1, QMAX),
                   "int8")
    return op.multiply(op.astype(yq, "float32"), relax.const(2.0 ** -layer.sy, "float32"))


def quantize(mod, calibration, scheme: str = "power_of_two", skip_first: bool = False,
             target: str = "llvm"):
    """`mod` (float, NCHW convs) with every conv2d / matmul of constant weights in int8 with
    power-of-two scales calibrated on `calibration` (a list of inputs, or of argument tuples);
    `skip_first` leaves the first layer in float, as the classic VTA flow does."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

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
    if skip_first:
        layers = layers[1:]
    _calibrate(fn, layers, calibration, target)

    core = is_op("relax.nn.conv2d")(wildcard(), is_const()) | \
        is_op("relax.matmul")(wildcard(), is_const())
    bconst = is_const()
    biased = is_op("relax.add")(core, bconst)

    def rewriter(expr, matches):
        layer = next((l for l in layers if l.call.same_as(matches[core])), None)
        if layer is None:
            return expr
        b = matches.get(bconst)
        bias = b.value.numpy() if b is not None else None
        return _quantized(layer, bias)

    out = rewrite_call(biased | core, rewriter, fn)
    mod = tvm.IRModule({"main": out})
    return tvm.transform.Sequential([relax.transform.DeadCodeElimination(),
                                     relax.transform.ConvertToDataflow()])(mod)
