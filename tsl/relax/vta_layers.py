"""The int8 layers of a quantized Relax model (`tsl.relax.quantize`) that VTA runs, as tsl
operators with their constant weights: conv2d / matmul of an int8 input and int8 constant
weights into int32, the constant int32 bias, the right shift and the clip to int8 (VTA's
requantize epilogue on its ALU). What does not have that form stays on the CPU, and `scan`
says why for every conv2d / matmul it leaves there."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops import conv2d, dense, requantize


@dataclass(eq=False)
class VTALayer:
    op: object  # the tsl operator (int8, requantize epilogue)
    weights: tuple  # its constant inputs after A (B, bias), as VTA's operator takes them
    x: object  # the Relax var of the int8 input
    y: object  # the Relax var of the int8 output


def _chain(fn):
    """var -> (op name, call) for the calls of a non-dataflow function; var -> its users."""
    import tvm
    from tvm import relax

    calls, users = {}, {}
    for block in fn.body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op):
                calls[b.var] = v
                for a in v.args:
                    users.setdefault(a, []).append(b.var)
    return calls, users


def _const(e):
    from .quantize import _is_const

    return e.value.numpy() if _is_const(e) else None


def _next(var, calls, users, name):
    """The one user of `var` when it is a call of `name`, else None."""
    u = users.get(var, [])
    return u[0] if len(u) == 1 and calls[u[0]].op.name == name else None


def scan(fn) -> tuple[list[VTALayer], list[str]]:
    """(the VTA layers of the non-dataflow function `fn`, why each other conv2d / matmul stays
    on the CPU)."""
    calls, users = _chain(fn)
    layers, why = [], []
    for var, c in calls.items():
        if c.op.name not in ("relax.nn.conv2d", "relax.matmul"):
            continue
        w = _const(c.args[1])
        x_dt = str(c.args[0].ty.dtype)
        if w is None or w.dtype != np.int8 or x_dt != "int8":
            why.append(f"{c.op.name}: float or non-constant weights (quantize the model first)")
            continue
        add = _next(var, calls, users, "relax.add")
        b = _const(calls[add].args[1]) if add is not None else None
        sh = _next(add if add is not None else var, calls, users, "relax.right_shift")
        cl = _next(sh, calls, users, "relax.clip") if sh is not None else None
        cast = _next(cl, calls, users, "relax.astype") if cl is not None else None
        if cast is None or str(calls[cast].attrs.dtype) != "int8":
            why.append(f"{c.op.name}: no shift + clip to int8 after it (VTA stores int8)")
            continue
        ep = requantize(int(_const(calls[sh].args[1])), bias=b is not None,
                        clip=tuple(int(a.value) for a in calls[cl].args[1:3]))
        bias = () if b is None else (b.reshape(-1).astype(np.int32),)
        if c.op.name == "relax.nn.conv2d":
            a = c.attrs
            n, ci, h, wd = (int(d) for d in c.args[0].ty.shape)
            k, _, r, s = w.shape
            if int(a.groups) != 1 or len({int(p) for p in a.padding}) != 1 \
                    or len({int(v) for v in a.strides}) != 1 or int(a.dilation[0]) != 1:
                why.append(f"conv2d {w.shape}: grouped, dilated or uneven padding/stride")
                continue
            op = conv2d(n, ci, h, wd, k, r, s, stride=int(a.strides[0]),
                        padding=int(a.padding[0]), dtype="int8", epilogue=ep)
            layers.append(VTALayer(op, (w,) + bias, c.args[0], cast))
        else:
            m, kk = (int(d) for d in c.args[0].ty.shape)
            op = dense(m, kk, w.shape[1], dtype="int8", epilogue=ep)
            layers.append(VTALayer(op, (np.ascontiguousarray(w.T),) + bias, c.args[0], cast))
    return layers, why
