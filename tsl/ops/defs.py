"""The operators: matmul, batch_matmul, dense, conv2d.

Each function validates its arguments, then returns an `Operator` with its TE definition (built
lazily: TVM is imported only when a PrimFunc is asked for) and its NumPy reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ScheduleError
from .epilogue import as_epilogue, bias as bias_step
from .sym import symbolic
from .operator import Axis, Operator, Tensor, acc_numpy, check_dims, check_dtypes, finish


def _with_operands(inputs, epilogue, n: int, out_shape: tuple, acc: str):
    """The operator's inputs: A, B, then one per epilogue operand (`Epilogue.operands`)."""
    return inputs + tuple(Tensor(name, shape, dtype, name) for name, shape, dtype
                          in epilogue.operand_tensors(n, out_shape, acc))


def _operand_placeholders(epilogue, n: int, out_shape: tuple, acc: str) -> list:
    from tvm import te

    return [te.placeholder(shape, dtype, name=name)
            for name, shape, dtype in epilogue.operand_tensors(n, out_shape, acc)]


def _te_tail(C, epilogue, acc, out_shape, chan, operands, comp):
    """Everything after the reduction block "C" as one element-wise block named "out": the
    unsigned-A compensation (`comp`, see `Operator.compensation`) and the epilogue, reading
    the operand placeholders `operands` (channel vectors at the channel index, residuals at
    the output element)."""
    from tvm import te

    if not epilogue.steps and comp is None:
        return C

    def body(*idx):
        v = C[idx] if comp is None else C[idx] + comp[idx[chan]]
        vals = {name: (t[idx[chan]] if step.operand == "channel" else t[idx])
                for (name, step), t in zip(epilogue.operands, operands)}
        return epilogue.te(v, vals, acc)

    return te.compute(out_shape, body, name="out")


def _operand_arrays(epilogue, rest) -> dict:
    """The operand arrays of a reference call, by name, from the arrays after A and B."""
    return {name: x for (name, _), x in zip(epilogue.operands, rest)}


def _a_stage(A, a_dtype, op_dtype):
    """A in the dtype the primitive reads, staged inside the kernel as block "A_cast": int8 ->
    uint8 is the shift A + 128 of an unsigned-A primitive (the result is compensated, see
    `Operator.compensation`); int8 -> int16 sign-extends, bfloat16 -> float32 widens (both
    exact). (Aq, shifted)."""
    from tvm import te

    if a_dtype in (None, op_dtype):
        return A, False
    if (op_dtype, a_dtype) == ("int8", "uint8"):
        return te.compute(A.shape, lambda *i: (A[i].astype("int32") + 128).astype("uint8"),
                          name="A_cast"), True
    if (op_dtype, a_dtype) in (("int8", "int16"), ("bfloat16", "float32")):
        return te.compute(A.shape, lambda *i: A[i].astype(a_dtype), name="A_cast"), False
    raise ScheduleError(f"operand A of dtype {op_dtype} cannot be fed to a primitive that "
                        f"takes {a_dtype}")


def _gemm_te(name, dtype, acc, epilogue, batch, M, N, K, transpose_b, chan_axis):
    def build(a_dtype, b_dtype):
        from tvm import te

        bshape = (batch,) if batch else ()
        A = te.placeholder(bshape + (M, K), dtype, name="A")
        B = te.placeholder(bshape + ((N, K) if transpose_b else (K, N)), b_dtype or dtype,
                           name="B")
        operands = _operand_placeholders(epilogue, (bshape + (M, N))[chan_axis],
                                         bshape + (M, N), acc)
        Aq, shifted = _a_stage(A, a_dtype, dtype)
        k = te.reduce_axis((0, K), name="k")

        def b_at(bidx, kk, j):
            return B[bidx + ((j, kk) if transpose_b else (kk, j))]

        comp = None
        if shifted:
            if batch:
                raise ScheduleError(f"{name}: int8 batch_matmul on an unsigned-A primitive "
                                    f"is not supported; use float32/bfloat16")
            comp = te.placeholder((N,), acc, name="comp")
        def c(*idx):
            bidx, i, j = idx[:-2], idx[-2], idx[-1]
            return te.sum(Aq[bidx + (i, k)].astype(acc) * b_at(bidx, k, j).astype(acc), axis=k)

        C = te.compute(bshape + (M, N), c, name="C")
        out = _te_tail(C, epilogue, acc, bshape + (M, N), chan_axis, operands, comp)
        args = [A, B] + operands + ([comp] if shifted else [])
        args.append(out)
        return args
    return build


def _gemm_ref(dtype, acc, epilogue, transpose_b, chan_axis=-1):
    def ref(a, b, *rest):
        a64, b64 = acc_numpy(dtype, acc, a, b)
        if transpose_b:
            b64 = np.swapaxes(b64, -1, -2)
        c = finish(np.matmul(a64, b64), acc)
        return epilogue.numpy(c, _operand_arrays(epilogue, rest), chan_axis)
    return ref


def _gemm(name, M, N, K, dtype, acc_dtype, transpose_b, epilogue, batch=0, activation_b=False):
    dims = dict(M=M, N=N, K=K) | ({"batch": batch} if batch else {})
    check_dims(name, **dims)
    acc = check_dtypes(name, dtype, acc_dtype)
    ep = as_epilogue(epilogue)
    bshape = (batch,) if batch else ()
    inputs = (Tensor("A", bshape + (M, K), dtype, "A"),
              Tensor("B", bshape + ((N, K) if transpose_b else (K, N)), dtype, "B"))
    if activation_b and (transpose_b or batch):
        raise ScheduleError(f"{name}(activation_b=True): B is read as an activation [K, N] "
                            f"in place; it cannot be transposed or batched")
    # activation_b: the output channels are A's rows (a 1x1 conv's weights), not B's columns.
    chans, chan_axis = (M, len(bshape)) if activation_b else (N, len(bshape) + 1)
    inputs = _with_operands(inputs, ep, chans, bshape + (M, N), acc)
    axes = ((Axis("b", batch, "b"),) if batch else ()) + (
        Axis("i", M, "m"), Axis("j", N, "n"), Axis("k", K, "k"))
    shape = bshape + (M, N, K)

    def tile(operand, e, rows_used=False):
        b = (("b", e["b"], batch),) if batch else ()
        i, j, k = ("i", e["i"], M), ("j", e["j"], N), ("k", e["k"], K)
        return b + {"A": (i, k), "B": (j, k) if transpose_b else (k, j), "C": (i, j)}[operand]

    def pad(e):
        return _gemm(name, e["i"], e["j"], e["k"], dtype, acc_dtype, transpose_b, epilogue,
                     batch=batch, activation_b=activation_b)

    params = {"shape": shape, "transpose_b": transpose_b} | (
        {"activation_b": True} if activation_b else {})
    return Operator(name=name, params=params,
                    dtype=dtype, acc_dtype=acc, epilogue=ep, inputs=inputs,
                    output=Tensor("out", bshape + (M, N), ep.out_dtype or acc, "out"),
                    axes=axes, macs=(batch or 1) * M * N * K,
                    _te=_gemm_te(name, dtype, acc, ep, batch, M, N, K, transpose_b, chan_axis),
                    _ref=_gemm_ref(dtype, acc, ep, transpose_b, chan_axis - len(bshape) - 2),
                    _tile=tile, _pad=pad, channel_axis=chan_axis - len(bshape) - 2)


@symbolic
def matmul(M: int, N: int, K: int, dtype: str = "float32", acc_dtype: str | None = None,
           transpose_b: bool = False, epilogue=None, activation_b: bool = False) -> Operator:
    """C[M,N] = A[M,K] @ B[K,N] (B given as [N,K] when `transpose_b`), then `epilogue`.

    `activation_b`: B is an activation read where it lies, not packed and not padded (the
    schedule predicates its last columns), and A holds the weights: an NCHW 1x1 conv as
    out[co, pixels] = W[co, ci] @ X[ci, pixels], the pixels on the vector lanes. The
    epilogue's channel vectors (bias) then run along the rows (M)."""
    return _gemm("matmul", M, N, K, dtype, acc_dtype, transpose_b, epilogue,
                 activation_b=activation_b)


@symbolic
def batch_matmul(batch: int, M: int, N: int, K: int, dtype: str = "float32",
                 acc_dtype: str | None = None, transpose_b: bool = False,
                 epilogue=None) -> Operator:
    """C[b,M,N] = A[b,M,K] @ B[b,K,N] for each of `batch` independent products."""
    return _gemm("batch_matmul", M, N, K, dtype, acc_dtype, transpose_b, epilogue, batch=batch)


@symbolic
def dense(batch: int, in_features: int, out_features: int, dtype: str = "float32",
          acc_dtype: str | None = None, epilogue=None) -> Operator:
    """A fully connected layer: out[b, o] = sum_i x[b, i] * W[o, i] (+ bias[o], relu, ...).

    Weights are [out_features, in_features] as in every framework; the bias is added when the
    epilogue asks for it (default: bias + relu is `tsl.ops.bias() + tsl.ops.relu()`)."""
    return _gemm("dense", batch, out_features, in_features, dtype, acc_dtype, True,
                 bias_step() if epilogue is None else epilogue)


@dataclass(frozen=True)
class _ConvShape:
    """The sizes of a conv2d and the shapes of its tensors in its layout."""

    N: int
    C: int
    H: int
    W: int
    K: int
    R: int
    S: int
    stride: int
    padding: int
    dilation: int
    nchw: bool

    @property
    def P(self) -> int:
        return (self.H + 2 * self.padding - self.dilation * (self.R - 1) - 1) // self.stride + 1

    @property
    def Q(self) -> int:
        return (self.W + 2 * self.padding - self.dilation * (self.S - 1) - 1) // self.stride + 1

    def data(self, h: int, w: int, c: int) -> tuple:
        return (self.N, c, h, w) if self.nchw else (self.N, h, w, c)

    @property
    def wshape(self) -> tuple:
        return ((self.K, self.C, self.R, self.S) if self.nchw
                else (self.R, self.S, self.C, self.K))

    @property
    def oshape(self) -> tuple:
        return self.data(self.P, self.Q, self.K)


def _conv_te(g: _ConvShape, dtype, acc, ep):
    def build(a_dtype, b_dtype):
        from tvm import te, tirx

        dshape = g.data(g.H, g.W, g.C)
        A = te.placeholder(dshape, dtype, name="A")
        Wt = te.placeholder(g.wshape, b_dtype or dtype, name="B")
        operands = _operand_placeholders(ep, g.K, g.oshape, acc)
        Aq, shifted = _a_stage(A, a_dtype, dtype)
        pad_val, p0 = 128 if shifted else 0, g.padding

        def pad(*i):
            h, w = (i[2], i[3]) if g.nchw else (i[1], i[2])
            inside = tirx.all(h >= p0, h < g.H + p0, w >= p0, w < g.W + p0)
            src = ((i[0], i[1], h - p0, w - p0) if g.nchw else (i[0], h - p0, w - p0, i[3]))
            return tirx.if_then_else(inside, Aq[src], tirx.const(pad_val, Aq.dtype))

        Ap = te.compute(g.data(g.H + 2 * p0, g.W + 2 * p0, g.C), pad, name="A_pad") \
            if p0 else Aq
        comp = te.placeholder((g.K,), acc, name="comp") if shifted else None
        ci = te.reduce_axis((0, g.C), name="ci")
        r = te.reduce_axis((0, g.R), name="r")
        s = te.reduce_axis((0, g.S), name="s")
        st, dl = g.stride, g.dilation
        if g.nchw:
            Cc = te.compute(g.oshape, lambda n, k, p, q: te.sum(
                Ap[n, ci, p * st + r * dl, q * st + s * dl].astype(acc)
                * Wt[k, ci, r, s].astype(acc), axis=[ci, r, s]), name="C")
        else:
            Cc = te.compute(g.oshape, lambda n, p, q, k: te.sum(
                Ap[n, p * st + r * dl, q * st + s * dl, ci].astype(acc)
                * Wt[r, s, ci, k].astype(acc), axis=[r, s, ci]), name="C")
        out = _te_tail(Cc, ep, acc, g.oshape, 1 if g.nchw else 3, operands, comp)
        return [A, Wt] + operands + ([comp] if shifted else []) + [out]
    return build


def _conv_ref(g: _ConvShape, dtype, acc, ep):
    def ref(x, w, *rest):
        x64, w64 = acc_numpy(dtype, acc, x, w)
        if not g.nchw:
            x64, w64 = x64.transpose(0, 3, 1, 2), w64.transpose(3, 2, 0, 1)
        p0, st, dl, P, Q = g.padding, g.stride, g.dilation, g.P, g.Q
        xp = np.pad(x64, ((0, 0), (0, 0), (p0, p0), (p0, p0)))
        out = np.zeros((g.N, g.K, P, Q), x64.dtype)
        for rr in range(g.R):
            for ss in range(g.S):
                win = xp[:, :, rr * dl: rr * dl + st * (P - 1) + 1: st,
                         ss * dl: ss * dl + st * (Q - 1) + 1: st]
                out += np.einsum("ncpq,kc->nkpq", win, w64[:, :, rr, ss], optimize=True)
        out = finish(out, acc)
        if not g.nchw:
            out = out.transpose(0, 2, 3, 1)
        return ep.numpy(out, _operand_arrays(ep, rest), 1 if g.nchw else 3)
    return ref


def _conv_tile(g: _ConvShape):
    def tile(operand, e, rows_used=False):
        n, ci, co = ("n", e["n"], g.N), ("ci", e["ci"], g.C), ("co", e["co"], g.K)
        if operand == "A":
            # The input window of the output tile, clipped to the zero-padded input.
            h = (e["oh"] - 1) * g.stride + (e["r"] - 1) * g.dilation + 1
            w = (e["ow"] - 1) * g.stride + (e["s"] - 1) * g.dilation + 1
            h, w = min(h, g.H + 2 * g.padding), min(w, g.W + 2 * g.padding)
            if rows_used:
                # Rows oh * stride + r * dilation: all offsets are multiples of gc.
                gc = g.stride if e["r"] == 1 else math.gcd(g.stride, g.dilation)
                h = (h - 1) // gc + 1
            h, w = ("oh", h, g.H), ("ow", w, g.W)
            return (n, ci, h, w) if g.nchw else (n, h, w, ci)
        if operand == "B":
            r, s = ("r", e["r"], g.R), ("s", e["s"], g.S)
            return (co, ci, r, s) if g.nchw else (r, s, ci, co)
        oh, ow = ("oh", e["oh"], g.P), ("ow", e["ow"], g.Q)
        return (n, co, oh, ow) if g.nchw else (n, oh, ow, co)
    return tile


@symbolic
def conv2d(N: int, C: int, H: int, W: int, K: int, R: int, S: int, stride: int = 1,
           padding: int = 0, dilation: int = 1, layout: str = "NCHW", dtype: str = "float32",
           acc_dtype: str | None = None, epilogue=None) -> Operator:
    """2-D convolution. layout "NCHW": data NCHW, weights KCRS, output NKPQ; layout "NHWC":
    data NHWC, weights RSCK, output NPQK. `stride`, `padding` and `dilation` apply to both
    spatial dimensions."""
    check_dims("conv2d", N=N, C=C, H=H, W=W, K=K, R=R, S=S, stride=stride, dilation=dilation)
    if not isinstance(padding, int) or padding < 0:
        raise ScheduleError(f"conv2d(padding={padding!r}): must be a non-negative integer")
    if layout not in ("NCHW", "NHWC"):
        raise ScheduleError(f"conv2d(layout={layout!r}): layout must be 'NCHW' or 'NHWC'")
    acc = check_dtypes("conv2d", dtype, acc_dtype)
    ep = as_epilogue(epilogue)
    g = _ConvShape(N, C, H, W, K, R, S, stride, padding, dilation, layout == "NCHW")
    P, Q = g.P, g.Q
    if P <= 0 or Q <= 0:
        raise ScheduleError(f"conv2d: a {R}x{S} kernel with dilation {dilation} does not fit a "
                            f"{H}x{W} input padded by {padding}")
    inputs = _with_operands((Tensor("A", g.data(H, W, C), dtype, "A"),
                             Tensor("B", g.wshape, dtype, "B")), ep, K, g.oshape, acc)
    if g.nchw:
        axes = (Axis("n", N, "m"), Axis("co", K, "n"), Axis("oh", P, "m"), Axis("ow", Q, "m"),
                Axis("ci", C, "k"), Axis("r", R, "k"), Axis("s", S, "k"))
    else:
        axes = (Axis("n", N, "m"), Axis("oh", P, "m"), Axis("ow", Q, "m"), Axis("co", K, "n"),
                Axis("r", R, "k"), Axis("s", S, "k"), Axis("ci", C, "k"))

    def pad(e):
        if (e["r"], e["s"], e["n"]) != (R, S, N):
            raise ScheduleError("conv2d: the kernel axes r, s and the batch n cannot be padded; "
                                f"tile them by divisors of {R}, {S} and {N}")
        # More output rows/columns need that many more (zero) input rows/columns.
        return conv2d(N, e["ci"], H + (e["oh"] - P) * stride, W + (e["ow"] - Q) * stride,
                      e["co"], R, S, stride, padding, dilation, layout, dtype, acc_dtype, epilogue)

    return Operator(name="conv2d", params={"shape": (N, C, H, W, K, R, S), "stride": stride,
                                           "padding": padding, "dilation": dilation,
                                           "layout": layout},
                    dtype=dtype, acc_dtype=acc, epilogue=ep, inputs=inputs,
                    output=Tensor("out", g.oshape, ep.out_dtype or acc, "out"), axes=axes,
                    macs=N * K * P * Q * C * R * S, _te=_conv_te(g, dtype, acc, ep),
                    _ref=_conv_ref(g, dtype, acc, ep), _tile=_conv_tile(g), _pad=pad,
                    channel_axis=1 if g.nchw else 3)
