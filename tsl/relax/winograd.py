"""Winograd F(m x m, 3x3), m = 2 or 4, for channels-last 3x3 stride-1 convs where the cost model
prices it lower.

A 3x3 stride-1 conv computes each m x m output tile from an a x a input tile (a = m + 2).
Winograd's minimal filtering (Lavin & Gray 2016) transforms the tile and the weights so that the
9 products per output of the direct conv become a^2 per m^2 outputs: F(2x2, 3x3) 16 per 4
(2.25x fewer multiply-adds), F(4x4, 3x3) 36 per 16 (4x fewer):

    V[e, t, c] = (B^T d_t B)[e]      the input transform, per a x a tile t and channel c
    U[e, c, k] = (G g_k,c G^T)[e]     the weights' transform, once at compile time (NumPy)
    M[e]       = V[e] @ U[e]          a^2 GEMMs of (tiles x C) @ (C x K): tsl's batch GEMM
    Y          = A^T M_t A            the output transform, cropped to the conv's H x W

The matrices are data (`_MATRICES`); the transforms are built from them, each element a sum of
the tile's values with constant coefficients (zeros skipped, +-1 as an add or subtract).
F(4x4, 3x3)'s interpolation points (0, +-1, +-2, inf) make its transforms' coefficients larger
(up to 8 and 1/24): its fp32 results round more, 4-7e-6 of the largest output at ResNet-18's
conv shapes against 2-5e-7 for F(2x2, 3x3); ResNet-18 as a whole stays within 5.4e-7 of PyTorch
(benchmarks/README.md "win45").

The input and output transforms are element-wise over the channels (channels innermost, so they
run as vectors) and memory-bound. The output transform fuses like a GEMM's output: the conv's
bias, residual add and relu fuse after it, and FuseOps leaves the batch matmul alone for the
swap (it fuses only element-wise ops into a GEMM). Each conv gets the form the model prices
lowest among tsl's direct NHWC conv, F(2x2, 3x3) and F(4x4, 3x3) (`_choice`: the batch GEMM by
the model's estimate, the bytes it moves at the machine's slowest streaming path). F(4x4,
3x3) has fewer GEMM rows at large images; at small ones its tiles pad the image (14x14 -> 16x16)
and its 36 transformed weight matrices (2.25x F(2x2)'s) are streamed for few rows.

Run after the layout plan (`tsl.relax.channels_last`): it rewrites the NHWC / HWIO convs the
plan made. NCHW convs are left as they are (their transforms would read and write with a
stride of H x W).
"""

from __future__ import annotations

import numpy as np

from ..schedules.vector import ELEMENTS_TOGETHER
from .chains import KEEP_APART

# m -> (B^T, G, A^T) of F(m x m, 3x3) (Lavin & Gray, "Fast Algorithms for Convolutional Neural
# Networks", points 0, +-1 for m = 2; 0, +-1, +-2 for m = 4; and infinity).
_MATRICES = {
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]),
        np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]])),
    4: (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                  [0, 1, -1, 8, -8, 1]])),
}


def winograd_pass(machine):
    """The Relax module pass: run it after the layout plan, before legalization."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.Winograd")
    def _pass(mod, _ctx):
        return rewrite(mod, machine)[0]

    return _pass


def rewrite(mod, machine) -> tuple:
    """(`mod` with every conv `_winograd_shape` takes and `_choice` prices lower made Winograd,
    the number rewritten)."""
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    x, w = wildcard(), is_const()
    pattern = is_op("relax.nn.conv2d")(x, w)
    bb, choices, done = relax.BlockBuilder(mod), {}, [0]

    def rewriter(expr, m):
        # `expr` may be the variable bound to the conv (rewrite_call matches through
        # bindings); the match holds the call itself.
        call = m[pattern]
        shape = _winograd_shape(call, machine)
        if shape is None:
            return expr
        if shape not in choices:
            choices[shape] = _choice(shape, str(call.ty.dtype), machine)
        if choices[shape] is None:
            return expr
        done[0] += 1
        return _winograd(m[x], m[w].value.numpy(), shape, choices[shape], str(call.ty.dtype), bb)

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


def _tiles(shape, m: int) -> tuple:
    """(output h, output w, tile rows, tile columns) of a conv's `shape` in m x m output tiles."""
    _, h, w, _, _, p = shape
    oh, ow = h + 2 * p - 2, w + 2 * p - 2
    return oh, ow, -(-oh // m), -(-ow // m)


def _choice(shape, dtype: str, machine):
    """The m of the F(m x m, 3x3) the model prices lowest for the conv, None where that is tsl's
    direct NHWC conv. A Winograd form's price: its batch GEMM's estimate, plus the arrays it
    moves (x, V, M, Y and the transformed weights U) once each at `_stream_rate`. U is a^2 / 9
    times the direct conv's weights, read once a call by GEMMs of few rows (7x7x512: 4 tile
    rows for F(4x4, 3x3), 37.7 MB of U, 16.8 MB for F(2x2, 3x3)): without it the model took
    F(4x4, 3x3) there, which ran 0.49-1.03x the direct conv alone (as much of U as the L3 kept
    under other processes' traffic) and tied F(2x2, 3x3) in ResNet-18 (benchmarks/README.md
    "win45"); with it F(2x2, 3x3), the smaller stream."""
    from ..ops import defs
    from .channels_last import _seconds, _stream_rate

    n, h, w, c, k, p = shape
    item = np.dtype(dtype).itemsize
    prices = {None: _seconds(defs.conv2d(n, c, h, w, k, 3, 3, stride=1, padding=p,
                                         layout="NHWC", dtype=dtype), machine)}
    for m in _MATRICES:
        oh, ow, th, tw = _tiles(shape, m)
        tiles, products = n * th * tw, (m + 2) ** 2
        gemm = _seconds(defs.batch_matmul(products, tiles, k, c, dtype=dtype), machine)
        moved = (n * h * w * c + products * (tiles + k) * c + products * tiles * k
                 + n * oh * ow * k) * item
        prices[m] = gemm + moved / _stream_rate(machine)
    return min(prices, key=prices.get)


def _winograd(x, weights, shape, m: int, dtype: str, bb):
    """The Relax expression of the conv of `x` (NHWC) by the constant HWIO `weights` as F(m x m,
    3x3): the input transform, the batch matmul with the transformed weights, the output
    transform (their PrimFuncs added to `bb`'s module, once per shape: `add_func` returns an
    equal one's)."""
    from tvm import relax

    n, h, w, c, k, p = shape
    oh, ow, th, tw = _tiles(shape, m)
    g, a = _MATRICES[m][1], m + 2
    u = np.einsum("ar,bs,rsck->abck", g, g, weights.astype(np.float64))
    u = relax.const(np.ascontiguousarray(u.reshape(a * a, c, k).astype(dtype)))
    into = bb.add_func(_input_transform(shape, m, dtype), f"winograd_input_{h}x{w}x{c}_f{m}")
    out = bb.add_func(_output_transform(shape, m, dtype), f"winograd_output_{oh}x{ow}x{k}_f{m}")
    v = relax.call_tir(into, [x], relax.TensorType((a * a, n * th * tw, c), dtype))
    return relax.call_tir(out, [relax.op.matmul(v, u)], relax.TensorType((n, oh, ow, k), dtype))


def _input_transform(shape, m: int, dtype: str):
    """V[e = a i + j, t, c] = (B^T d B)[i, j] for the a x a input tile d of output tile t (a =
    m + 2), zero outside the image (the conv's padding, and the tiles' beyond an output size
    not a multiple of m): row i of B^T times d times column j of B, B^T's zeros skipped."""
    from tvm import te, tirx

    n, h, w, c, _, p = shape
    _, _, th, tw = _tiles(shape, m)
    bt, a = _MATRICES[m][0], m + 2
    x = te.placeholder(_int64(n, h, w, c), dtype, name="x")

    def v(e, t, ch):
        b_, rest = t // (th * tw), t % (th * tw)
        y0, x0 = m * (rest // tw) - p, m * (rest % tw) - p

        def d(i, j):
            yy, xx = y0 + i, x0 + j
            # `likely`: the same check, kept out of the simplifier's facts (as a plain
            # condition, te.create_prim_func took 8.6 s for F(4x4, 3x3) at 7x7, 0.13 s so).
            inside = tirx.likely(tirx.all(yy >= 0, yy < h, xx >= 0, xx < w))
            return tirx.if_then_else(inside, x[b_, yy, xx, ch], tirx.const(0, dtype))

        def element(i, j):
            return _combination(bt[i], [_combination(bt[j], [d(r, s) for s in range(a)], dtype)
                                        for r in range(a)], dtype)

        # e is uniform across a vector of channels: a chain of branches on it, each element
        # computed with constant offsets (indices chosen by e would be recomputed per vector).
        return _pick(e, [element(e_ // a, e_ % a) for e_ in range(a * a)])

    out = te.compute(_int64(a * a, n * th * tw, c), v, name="winograd_input",
                     attrs={ELEMENTS_TOGETHER: 1})
    # Fused with nothing (TVM's kOpaque) and merged with nothing (`chains.KEEP_APART`): the
    # previous conv's output transform and relu computed inside it would be computed for each
    # of the up to a^2 reads of an element.
    return (te.create_prim_func([x, out]).without_attr("global_symbol")
            .with_attr("op_pattern", 8).with_attr(KEEP_APART, True))


def _output_transform(shape, m: int, dtype: str):
    """Y[n, y, x, k] = (A^T M_t A)[y % m, x % m] for the tile t holding (y, x): the a x a
    values of M_t combined by row y % m of A^T down the columns, then by row x % m across."""
    from tvm import te, tirx

    n, _, _, _, k, _ = shape
    oh, ow, th, tw = _tiles(shape, m)
    at, a = _MATRICES[m][2], m + 2
    mt = te.placeholder(_int64(a * a, n * th * tw, k), dtype, name="m")

    def y(b_, yy, xx, ch):
        t = (b_ * th + yy // m) * tw + xx // m

        def value(i, j):
            columns = [_combination(at[i], [mt[a * r + col, t, ch] for r in range(a)], dtype)
                       for col in range(a)]
            return _combination(at[j], columns, dtype)

        # y % m and x % m are uniform across a vector of channels: branches, as above.
        return _pick(yy % m, [_pick(xx % m, [value(i, j) for j in range(m)]) for i in range(m)])

    out = te.compute(_int64(n, oh, ow, k), y, name="winograd_output")
    # Fusable like a GEMM's output (TVM's kOutEWiseFusable): the conv's bias, residual add and
    # relu fuse after it. Left injective, FuseOps gave the residual add to the block's other
    # conv (the downsampling 1x1), the bias add before it made a prologue, and no kernel took
    # that conv (3-6x slower).
    return te.create_prim_func([mt, out]).without_attr("global_symbol").with_attr("op_pattern", 4)


def _combination(coefficients, terms: list, dtype: str):
    """sum(c * term) over the nonzero constant `coefficients`: the positive terms added, the
    negative subtracted, +-1 with no multiply."""
    from tvm import tirx

    def scaled(c, term):
        return term if abs(c) == 1 else term * tirx.const(float(abs(c)), dtype)

    plus = [scaled(c, t) for c, t in zip(coefficients, terms) if c > 0]
    minus = [scaled(c, t) for c, t in zip(coefficients, terms) if c < 0]
    total = plus[0] if plus else -minus.pop(0)
    for t in plus[1:]:
        total = total + t
    for t in minus:
        total = total - t
    return total


def _pick(index, values: list):
    """values[index] for an `index` uniform across a vector: a chain of branches."""
    from tvm import tirx

    picked = values[-1]
    for i in range(len(values) - 2, -1, -1):
        picked = tirx.if_then_else(index == i, values[i], picked)
    return picked


def _int64(*dims) -> tuple:
    """A TE shape of int64 extents, as Relax's legalized operators have (FuseTIR maps a relax
    tensor to one buffer type across the functions it fuses)."""
    from tvm import tirx

    return tuple(tirx.IntImm("int64", d) for d in dims)
