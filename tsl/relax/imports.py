"""Graphs as TVM's torch and ONNX frontends produce them, made ready for the swap.

`torch.export` + `from_exported_program` and `from_onnx` keep inference batch norms as
`relax.nn.batch_norm` after each convolution. `fold_batch_norm` folds every batch norm whose
input is a conv2d with constant weights (optionally with a constant bias added, as ONNX convs
have) into that conv: W' = W * s per output channel, b' = (b - mean) * s + beta with
s = gamma / sqrt(var + eps), at compile time. The conv's epilogue is then a bias add that the
swap fuses; no per-call batch-norm pass remains. A batch norm that cannot be folded (its input
is not such a conv) is decomposed into element-wise scale and shift by TVM's
`DecomposeOpsForInference`, which the swap fuses as `scale() + bias()` when it follows a GEMM.

`from_onnx` lowers an ONNX Clip (opset >= 11: bounds as inputs) to TE at import time: a
`call_tir` of `topi.maximum(x, lo)` then one of `topi.minimum(., hi)`, the bounds 0-d tensors
computed from the inputs (`where(isnan(b), -inf, b)`). `restore_clip` turns those calls back into
Relax operators once the bounds are folded to constants: `relax.op.clip(x, lo, hi)` for the pair,
`maximum` / `minimum` for one alone. Legalized, they are the same `tir_clip` / scalar max that the
torch frontend's relu6 / hardtanh give, which the swap fuses as the conv's epilogue (left as TE
calls, the conv could not take them and they ran as separate passes over its output).
"""

from __future__ import annotations

import numpy as np


def _folded(conv, bias, bn):
    """conv2d(x, W * s) + b' for the matched conv (+ bias) -> batch_norm, or None when the
    batch norm does not normalize the conv's output channels."""
    from tvm import relax

    attrs = conv.attrs
    if str(attrs.kernel_layout) != "OIHW" or str(attrs.data_layout) != "NCHW" \
            or int(bn.attrs.axis) != 1:
        return None
    w = conv.args[1].value.numpy()
    gamma, beta, mean, var = (a.value.numpy().astype(np.float64) for a in bn.args[1:5])
    s = gamma / np.sqrt(var + float(bn.attrs.epsilon))
    if s.shape != (w.shape[0],):
        return None
    b0 = np.zeros_like(s) if bias is None else bias.astype(np.float64).reshape(-1)
    if b0.shape != s.shape:
        return None
    w2 = (w.astype(np.float64) * s.reshape(-1, 1, 1, 1)).astype(w.dtype)
    b2 = ((b0 - mean) * s + beta).astype(w.dtype).reshape(1, -1, 1, 1)
    y = relax.op.nn.conv2d(conv.args[0], relax.const(w2), strides=attrs.strides,
                           padding=attrs.padding, dilation=attrs.dilation, groups=attrs.groups,
                           data_layout="NCHW", kernel_layout="OIHW",
                           out_layout=attrs.out_layout, out_dtype=attrs.out_dtype)
    return relax.op.add(y, relax.const(b2))


def fold_batch_norm():
    """A module pass folding inference batch norms into the convs before them (see above)."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, is_tuple_get_item, rewrite_call, wildcard

    conv = is_op("relax.nn.conv2d")(wildcard(), is_const())
    biased = is_op("relax.add")(conv, is_const())
    bn = is_op("relax.nn.batch_norm")(conv | biased, is_const(), is_const(), is_const(),
                                      is_const())
    pattern = is_tuple_get_item(bn, 0)

    def rewriter(expr, matches):
        c, b = matches[conv], matches.get(biased)
        bias = None
        if b is not None:
            bias = b.args[1].value.numpy()
            if bias.size != c.args[1].value.shape[0]:
                return expr
        y = _folded(c, bias, matches[bn])
        return expr if y is None else y

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.fold_batch_norm")
    def _pass(mod, _ctx):
        for gv, f in list(mod.functions.items()):
            if isinstance(f, relax.Function):
                mod[gv] = rewrite_call(pattern, rewriter, f)
        return mod

    return _pass


def _scalar_minmax(func):
    """`relax.op.maximum` / `minimum` when PrimFunc `func` is one element-wise block writing
    max / min of its first argument (read at the output element) and a 0-d second one, as TE's
    `topi.maximum(x, bound)` is; else None."""
    from tvm import tirx

    from .match import NoMatch, _is_load, _store, blocks

    bl = blocks(func)
    if len(func.params) != 3 or len(bl) != 1:
        return None
    try:
        st = _store(bl[0])
    except NoMatch:
        return None
    v = st.value
    op = {tirx.Max: "maximum", tirx.Min: "minimum"}.get(type(v))
    if op is None or not (_is_load(v.a) and _is_load(v.b)) or len(v.b.indices) or len(
            v.a.indices) != len(st.indices) or not all(
                i.same_as(o) for i, o in zip(v.a.indices, st.indices)):
        return None
    from tvm import relax

    return getattr(relax.op, op)


def _scalar(expr):
    """The Python number of a 0-d Relax constant, else None."""
    from tvm.ir.expr import Constant

    if isinstance(expr, Constant) and expr.value.numpy().ndim == 0:
        return expr.value.numpy().item()
    return None


def restore_clip():
    """A module pass turning `from_onnx`'s TE max / min calls with constant bounds back into
    Relax `clip` / `maximum` / `minimum` (see above). Unused PrimFuncs are dropped after."""
    import tvm
    from tvm import relax, tirx
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    te_call = is_op("relax.call_tir")(wildcard(), wildcard())
    lo, hi, x = is_const(), is_const(), wildcard()
    clip = is_op("relax.minimum")(is_op("relax.maximum")(x, lo), hi)

    def _clip(expr, m):
        a, b = _scalar(m[lo]), _scalar(m[hi])
        if a is None or b is None or a > b:
            return expr
        return relax.op.clip(m[x], a, b)

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.restore_clip")
    def _pass(mod, _ctx):
        ops = {gv: op for gv, f in mod.functions.items()
               if isinstance(f, tirx.PrimFunc) and (op := _scalar_minmax(f)) is not None}

        def _relax_op(expr, m):
            gv, args = m[te_call].args  # (`expr` may be the variable bound to the call)
            op = ops.get(gv) if isinstance(gv, tvm.ir.GlobalVar) else None
            if op is None or len(args.fields) != 2 or _scalar(args.fields[1]) is None:
                return expr
            return op(args.fields[0], args.fields[1])

        if not ops:
            return mod
        for gv, f in list(mod.functions.items()):
            if isinstance(f, relax.Function):
                mod[gv] = rewrite_call(clip, _clip, rewrite_call(te_call, _relax_op, f))
        return relax.transform.DeadCodeElimination()(mod)

    return _pass


def activations_before_reshapes():
    """A module pass writing `act(reshape(y))` as `reshape(act(y))` for the activations a tsl
    epilogue takes (relu, gelu, silu, clip): element-wise, they commute with any reshape. The
    torch frontend writes a linear on (batch, rows, k) as reshape, matmul, add, reshape, so the
    activation after it came after the reshape, outside the GEMM's fused function (a separate
    copy pass, the activation not in the kernel); moved before, FuseOps fuses it with the add.
    The two reshapes that then meet (back to 2-D for the next linear) become one, a view."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    make = {"relax.nn.relu": lambda y, _a: relax.op.nn.relu(y),
            "relax.nn.gelu": lambda y, _a: relax.op.nn.gelu(y),
            "relax.nn.silu": lambda y, _a: relax.op.nn.silu(y),
            "relax.clip": lambda y, a: relax.op.clip(y, a[1], a[2])}
    y = wildcard()
    reshape = is_op("relax.reshape")(y, wildcard())
    act = None
    for name in make:
        p = is_op(name)(reshape, wildcard(), wildcard()) if name == "relax.clip" \
            else is_op(name)(reshape)
        act = p if act is None else act | p

    def rewriter(_expr, m):
        call = m[act]
        return relax.op.reshape(make[call.op.name](m[y], call.args), m[reshape].args[1])

    twice = is_op("relax.reshape")(reshape, wildcard())

    def once(_expr, m):
        return relax.op.reshape(m[y], m[twice].args[1])

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.activations_before_reshapes")
    def _pass(mod, _ctx):
        for gv, f in list(mod.functions.items()):
            if isinstance(f, relax.Function):
                mod[gv] = rewrite_call(twice, once, rewrite_call(act, rewriter, f))
        return mod

    return _pass


def splat_constants():
    """A module pass writing a constant whose elements are all one value, when a branch of a
    `where` whose result keeps its shape without it, as that value (a 0-d constant). Torch's
    safe softmax selects `where(row all -inf, full_like(x, 0), softmax)`; folded, the zeros
    are a constant as large as the attention scores (786 KB at 12 heads x 128 x 128), read in
    full by every call of the softmax for one number. (Not the operands of adds and products:
    a linear layer's all-zero bias stays the vector the swap takes as the GEMM's bias.)"""
    import tvm
    import tvm_ffi
    from tvm import relax
    from tvm.ir.expr import Constant

    def splat(arg):
        if not (isinstance(arg, Constant) and hasattr(arg.value, "numpy")
                and arg.value.numpy().size > 1):
            return arg
        v = arg.value.numpy()
        return relax.const(v.flat[0], str(v.dtype)) if (v == v.flat[0]).all() else arg

    @relax.expr_functor.mutator
    class _Splat(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.where"):
                return call
            new = self.builder_.normalize(relax.Call(call.op, [splat(a) for a in call.args],
                                                     call.attrs, call.ty_args))
            same = tvm_ffi.structural_equal(new.ty, call.ty)
            return new if same else call

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.splat_constants")
    def _pass(mod, _ctx):
        for gv, f in list(mod.functions.items()):
            if isinstance(f, relax.Function):
                mod[gv] = _Splat(mod).visit_expr(f)
        return mod

    return _pass


def import_passes() -> list:
    """What runs before TVM's legalization: batch norms folded or decomposed, constants
    folded (weights reached through permute/reshape of constants become constants), ONNX clips
    made Relax clips again, activations moved before the reshapes after a GEMM, constants of
    one repeated value made scalars."""
    from tvm import relax

    return [fold_batch_norm(), relax.transform.DecomposeOpsForInference(),
            relax.transform.FoldConstant(), restore_clip(), activations_before_reshapes(),
            splat_constants()]
