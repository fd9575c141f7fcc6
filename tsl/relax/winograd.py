"""Winograd F(2x2, 3x3) for channels-last 3x3 stride-1 convs where the cost model prices it lower.

A 3x3 stride-1 conv computes each 2x2 output tile from a 4x4 input tile. Winograd's minimal
filtering (Lavin & Gray 2016) transforms the tile and the weights so that the 9 products per
output of the direct conv become 16 per 4 outputs, 2.25x fewer multiply-adds:

    V[e, t, c] = (B^T d_t B)[e]      the input transform, per 4x4 tile t and channel c
    U[e, c, k] = (G g_k,c G^T)[e]     the weights' transform, once at compile time (NumPy)
    M[e]       = V[e] @ U[e]          16 GEMMs of (tiles x C) @ (C x K): tsl's batch GEMM
    Y          = A^T M_t A            the output transform, cropped to the conv's H x W

The input and output transforms are element-wise over the channels (channels innermost, so they
run as vectors) and memory-bound. The output transform fuses like a GEMM's output: the conv's
bias, residual add and relu fuse after it, and FuseOps leaves the batch matmul alone for the
swap (it fuses only element-wise ops into a GEMM). A conv is rewritten where its Winograd price
(the batch GEMM by the model's estimate, the transforms' bytes at the machine's slowest
streaming path) is below the model's price of tsl's direct NHWC conv: on the Zen 4 file all 16
stride-1 3x3 convs of ResNet-18 (0.52-0.72x), few-channel convs not (a 3-channel input's GEMM
is all overhead).

Run after the layout plan (`tsl.relax.channels_last`): it rewrites the NHWC / HWIO convs the
plan made. NCHW convs are left as they are (their transforms would read and write with a
stride of H x W).
"""

from __future__ import annotations

import numpy as np

from ..schedules.vector import ELEMENTS_TOGETHER
from .chains import KEEP_APART

# F(2x2, 3x3)'s matrices (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks").
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
# Row a of B^T holds +1 at _P[a] and _SIGN[a] at _Q[a]: B^T = [[1,0,-1,0], [0,1,1,0],
# [0,-1,1,0], [0,1,0,-1]].
_P, _Q, _SIGN = (0, 1, 2, 1), (2, 2, 1, 3), (-1, 1, -1, -1)


def winograd_pass(machine):
    """The Relax module pass: run it after the layout plan, before legalization."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.Winograd")
    def _pass(mod, _ctx):
        return rewrite(mod, machine)[0]

    return _pass


def rewrite(mod, machine) -> tuple:
    """(`mod` with every conv `_winograd_shape` takes and `_cheaper` prices lower rewritten, the
    number rewritten)."""
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    x, w = wildcard(), is_const()
    pattern = is_op("relax.nn.conv2d")(x, w)
    bb, prices, done = relax.BlockBuilder(mod), {}, [0]

    def rewriter(expr, m):
        # `expr` may be the variable bound to the conv (rewrite_call matches through
        # bindings); the match holds the call itself.
        call = m[pattern]
        shape = _winograd_shape(call, machine)
        if shape is None:
            return expr
        if shape not in prices:
            prices[shape] = _cheaper(shape, str(call.ty.dtype), machine)
        if not prices[shape]:
            return expr
        done[0] += 1
        return _winograd(m[x], m[w].value.numpy(), shape, str(call.ty.dtype), bb)

    for gv, f in list(mod.functions.items()):
        if isinstance(f, relax.Function):
            bb.update_func(gv, rewrite_call(pattern, rewriter, f))
    return bb.get(), done[0]


def _winograd_shape(call, machine):
    """(n, h, w, c, k, padding) of an NHWC / HWIO 3x3 conv with stride 1, no dilation, one
    group, equal padding on every side, static shapes and one float dtype the machine has a
    peak for, else None."""
    a = call.attrs
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout) or "NHWC") != (
            "NHWC", "HWIO", "NHWC") or int(a.groups) != 1:
        return None
    dtypes = {str(e.ty.dtype) for e in (call, *call.args)}
    if len(dtypes) != 1 or not (dt := dtypes.pop()).startswith("float") or dt not in machine.peaks:
        return None
    pad = {int(v) for v in a.padding}
    if {int(v) for v in a.strides} != {1} or {int(v) for v in a.dilation} != {1} or len(pad) != 1:
        return None
    try:
        (n, h, w, c), (r, s, _, k) = (tuple(int(e) for e in x.ty.shape) for x in call.args)
    except (TypeError, ValueError):
        return None
    p = pad.pop()
    if (r, s) != (3, 3) or h + 2 * p < 4 or w + 2 * p < 4:
        return None
    return n, h, w, c, k, p


def _tiles(shape) -> tuple:
    """(output h, output w, tile rows, tile columns) of a conv's `shape`."""
    _, h, w, _, _, p = shape
    oh, ow = h + 2 * p - 2, w + 2 * p - 2
    return oh, ow, -(-oh // 2), -(-ow // 2)


def _cheaper(shape, dtype: str, machine) -> bool:
    """Whether the model prices the conv's Winograd form (the batch GEMM's estimate, plus each
    transform reading its input and writing its output once at `_stream_rate`) below tsl's
    direct NHWC conv."""
    from ..ops import defs
    from .channels_last import _seconds, _stream_rate

    n, h, w, c, k, p = shape
    oh, ow, th, tw = _tiles(shape)
    tiles = n * th * tw
    item = np.dtype(dtype).itemsize
    direct = _seconds(defs.conv2d(n, c, h, w, k, 3, 3, stride=1, padding=p, layout="NHWC",
                                  dtype=dtype), machine)
    gemm = _seconds(defs.batch_matmul(16, tiles, k, c, dtype=dtype), machine)
    moved = (n * h * w * c + 16 * tiles * c + 16 * tiles * k + n * oh * ow * k) * item
    return gemm + moved / _stream_rate(machine) < direct


def _winograd(x, weights, shape, dtype: str, bb):
    """The Relax expression of the conv of `x` (NHWC) by the constant HWIO `weights`: the input
    transform, the batch matmul with the transformed weights, the output transform (their
    PrimFuncs added to `bb`'s module, once per shape: `add_func` returns an equal one's)."""
    from tvm import relax

    n, h, w, c, k, p = shape
    oh, ow, th, tw = _tiles(shape)
    u = np.einsum("ar,bs,rsck->abck", _G, _G, weights.astype(np.float64))
    u = relax.const(np.ascontiguousarray(u.reshape(16, c, k).astype(dtype)))
    into = bb.add_func(_input_transform(shape, dtype), f"winograd_input_{h}x{w}x{c}")
    out = bb.add_func(_output_transform(shape, dtype), f"winograd_output_{oh}x{ow}x{k}")
    v = relax.call_tir(into, [x], relax.TensorType((16, n * th * tw, c), dtype))
    return relax.call_tir(out, [relax.op.matmul(v, u)], relax.TensorType((n, oh, ow, k), dtype))


def _input_transform(shape, dtype: str):
    """V[e = 4a + b, t, c] = (B^T d B)[a, b] for the 4x4 input tile d of output tile t, zero
    outside the image (the conv's padding, and the tiles' beyond an odd output size). Each row
    of B^T has two nonzeros, so V[a, b] is four of d's elements added or subtracted."""
    from tvm import te, tirx

    n, h, w, c, _, p = shape
    _, _, th, tw = _tiles(shape)
    x = te.placeholder(_int64(n, h, w, c), dtype, name="x")

    def v(e, t, ch):
        b_, rest = t // (th * tw), t % (th * tw)
        y0, x0 = 2 * (rest // tw) - p, 2 * (rest % tw) - p

        def d(i, j):
            yy, xx = y0 + i, x0 + j
            inside = tirx.all(yy >= 0, yy < h, xx >= 0, xx < w)
            return tirx.if_then_else(inside, x[b_, yy, xx, ch], tirx.const(0, dtype))

        def element(a, b):  # B^T's rows a and b: four loads, each added or subtracted
            def rows(i):
                sb = _SIGN[b]
                return d(i, _P[b]) + d(i, _Q[b]) if sb > 0 else d(i, _P[b]) - d(i, _Q[b])
            return rows(_P[a]) + rows(_Q[a]) if _SIGN[a] > 0 else rows(_P[a]) - rows(_Q[a])

        # e is uniform across a vector of channels: a chain of branches on it, each element
        # computed with constant offsets (indices chosen by e would be recomputed per vector).
        value = element(3, 3)
        for e_ in range(14, -1, -1):
            value = tirx.if_then_else(e == e_, element(e_ // 4, e_ % 4), value)
        return value

    out = te.compute(_int64(16, n * th * tw, c), v, name="winograd_input",
                     attrs={ELEMENTS_TOGETHER: 1})
    # Fused with nothing (TVM's kOpaque) and merged with nothing (`chains.KEEP_APART`): the
    # previous conv's output transform and relu computed inside it would be computed for each
    # of the up to 16 reads of an element.
    return (te.create_prim_func([x, out]).without_attr("global_symbol")
            .with_attr("op_pattern", 8).with_attr(KEEP_APART, True))


def _output_transform(shape, dtype: str):
    """Y[n, y, x, k] = (A^T M_t A)[y % 2, x % 2] for the tile t holding (y, x): A^T's rows are
    [1, 1, 1, 0] and [0, 1, -1, -1]."""
    from tvm import te, tirx

    n, _, _, _, k, _ = shape
    oh, ow, th, tw = _tiles(shape)
    m = te.placeholder(_int64(16, n * th * tw, k), dtype, name="m")

    def y(b_, yy, xx, ch):
        t = (b_ * th + yy // 2) * tw + xx // 2

        def along(i, v):  # row i of A^T times v[0..3]
            return tirx.Select(i == 0, v[0] + v[1] + v[2], v[1] - v[2] - v[3])

        rows = [along(yy % 2, [m[4 * a + col, t, ch] for a in range(4)]) for col in range(4)]
        return along(xx % 2, rows)

    out = te.compute(_int64(n, oh, ow, k), y, name="winograd_output")
    # Fusable like a GEMM's output (TVM's kOutEWiseFusable): the conv's bias, residual add and
    # relu fuse after it. Left injective, FuseOps gave the residual add to the block's other
    # conv (the downsampling 1x1), the bias add before it made a prologue, and no kernel took
    # that conv (3-6x slower).
    return te.create_prim_func([m, out]).without_attr("global_symbol").with_attr("op_pattern", 4)


def _int64(*dims) -> tuple:
    """A TE shape of int64 extents, as Relax's legalized operators have (FuseTIR maps a relax
    tensor to one buffer type across the functions it fuses)."""
    from tvm import tirx

    return tuple(tirx.IntImm("int64", d) for d in dims)
