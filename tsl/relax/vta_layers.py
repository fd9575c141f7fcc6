"""The int8 layers of a quantized Relax model (`tsl.relax.quantize`) that VTA runs, as tsl
operators with their constant weights: conv2d / matmul of an int8 input and int8 constant
weights into int32, then the element-wise chain VTA's ALU runs in place in the accumulator
(the constant int32 bias, relu, right shifts, the residual add of an int8 tensor, the clip)
and the cast to int8 that VTA's STORE does. What does not have that form stays on the CPU, and
`scan` says why for every conv2d / matmul it leaves there."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops import conv2d, dense
from ..ops.epilogue import Epilogue, Step


@dataclass(eq=False)
class VTALayer:
    op: object  # the tsl operator (int8, requantize epilogue)
    weights: tuple  # its constant inputs after A (B, bias), as VTA's operator takes them
    x: object  # the Relax var of the int8 input
    y: object  # the Relax var of the int8 output
    residual: object = None  # the Relax var of the int8 residual (an input per call)
    vars: tuple = ()  # the vars of the calls the layer replaces, the conv2d / matmul first

    def args(self, x, residual=None) -> list:
        """The operator's inputs in its order: `x` as A, the weights, `residual`."""
        given = dict(zip(("B", "bias"), self.weights), A=x, residual=residual)
        return [given[t.name] for t in self.op.inputs]


def _const(e):
    from .quantize import _is_const

    return e.value.numpy() if _is_const(e) else None


def _int8_of(e, calls):
    """The int8 var that `e` is the int32 cast of (None when it is not one)."""
    c = calls.get(e)
    if c is None or c.op.name != "relax.astype" or str(c.attrs.dtype) != "int32":
        return None
    src = c.args[0]
    return src if str(src.ty.dtype) == "int8" else None


def _step(c, cur, calls, steps):
    """The epilogue step that call `c` (reading `cur`) is, and its operand: (Step, operand)
    with operand a bias array, the residual's int8 var or None; None when it is no step."""
    name, a = c.op.name, c.args
    if name == "relax.nn.relu":
        return Step("relu"), None
    if name == "relax.right_shift" and a[0].same_as(cur):
        amount = _const(a[1])
        return (Step("shift", (int(amount),)), None) if amount is not None \
            and amount.size == 1 else None
    if name == "relax.clip":
        return Step("clip", (int(a[1].value), int(a[2].value))), None
    if name != "relax.add":
        return None
    b = _const(a[1]) if a[0].same_as(cur) else None
    if b is None:
        return _residual(a, cur, calls, steps)
    if b.dtype != np.int32 or any(s.kind == "bias" for s in steps):
        return None
    return Step("bias"), b


def _residual(a, cur, calls, steps):
    if len(a) != 2 or any(s.kind == "residual" for s in steps):
        return None
    other = a[1] if a[0].same_as(cur) else a[0]
    r = _int8_of(other, calls)
    return (Step("residual"), r) if r is not None else None


def _chain(var, calls, users):
    """(the epilogue steps after the call bound to `var`, the bias, the residual var, the
    int8 output var), or a reason string when the chain does not end in a cast to int8."""
    steps, bias, res, cur, seen = [], None, None, var, [var]
    while True:
        u = users.get(cur, [])
        if len(u) != 1:
            return "its int32 result is used twice or is an output (VTA stores int8 only)"
        c = calls[u[0]]
        if c.op.name == "relax.astype":
            if str(c.attrs.dtype) != "int8" or not steps:
                return "no shift + clip to int8 after it (VTA stores int8)"
            return steps, bias, res, seen + [u[0]]
        got = _step(c, cur, calls, steps)
        if got is None:
            return f"{c.op.name} after it is not one of VTA's ALU steps"
        step, operand = got
        steps.append(step)
        if step.kind == "bias":
            bias = operand
        elif step.kind == "residual":
            res = operand
            seen.append(next(a for a in c.args if not a.same_as(cur)))  # its int32 cast
        cur = u[0]
        seen.append(cur)


def _users(fn):
    """var -> op call and var -> the vars of the calls that use it, of a non-dataflow fn."""
    from .quantize import _graph

    return _graph(fn)


def _operator(c, w, ep):
    """The tsl operator of conv2d / matmul call `c` (weights `w`), or why it cannot be one."""
    if c.op.name == "relax.matmul":
        m, kk = (int(d) for d in c.args[0].ty.shape)
        return dense(m, kk, w.shape[1], dtype="int8", epilogue=ep), np.ascontiguousarray(w.T)
    a = c.attrs
    n, ci, h, wd = (int(d) for d in c.args[0].ty.shape)
    k, _, r, s = w.shape
    if int(a.groups) != 1 or len({int(p) for p in a.padding}) != 1 \
            or len({int(v) for v in a.strides}) != 1 or int(a.dilation[0]) != 1 \
            or str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "OIHW":
        return f"conv2d {w.shape}: grouped, dilated, not NCHW or uneven padding/stride"
    return conv2d(n, ci, h, wd, k, r, s, stride=int(a.strides[0]), padding=int(a.padding[0]),
                  dtype="int8", epilogue=ep), w


def scan(fn) -> tuple[list[VTALayer], list[str]]:
    """(the VTA layers of the non-dataflow function `fn`, why each other conv2d / matmul stays
    on the CPU)."""
    calls, users = _users(fn)
    layers, why = [], []
    for var, c in calls.items():
        if c.op.name not in ("relax.nn.conv2d", "relax.matmul"):
            continue
        w = _const(c.args[1])
        if w is None or w.dtype != np.int8 or str(c.args[0].ty.dtype) != "int8":
            why.append(f"{c.op.name}: float or non-constant weights (quantize the model first)")
            continue
        chain = _chain(var, calls, users)
        if isinstance(chain, str):
            why.append(f"{c.op.name} {tuple(w.shape)}: {chain}")
            continue
        steps, b, res, seen = chain
        got = _operator(c, w, Epilogue(tuple(steps), "int8"))
        if isinstance(got, str):
            why.append(got)
            continue
        op, wt = got
        if b is not None and b.size != op.output.shape[op.channel_axis]:
            why.append(f"{c.op.name} {tuple(w.shape)}: the constant added is not a bias of "
                       "its output channels")
            continue
        bias = () if b is None else (b.reshape(-1).astype(np.int32),)
        layers.append(VTALayer(op, (wt,) + bias, c.args[0], seen[-1], res, tuple(seen)))
    return layers, why
