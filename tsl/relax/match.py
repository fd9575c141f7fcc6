"""Recognize a tsl operator in a (fused) PrimFunc from its blocks' computation, not its name.

A PrimFunc that TVM's legalization and fusion made from matmul / linear / batch matmul / conv2d
and the element-wise ops after them is a short chain of blocks::

    [pad_temp]   pad of the conv input          (optional)  X_pad[...] = if_then_else(inside, X[..-p], 0)
    reduction    C[s] = C[s] + cast(A[...]) * cast(B[...])    (one block with reduce iterators)
    epilogue     bias add, relu, right shift, clip, cast      (absorbed by the tsl operator)
    tail         anything else element-wise (a residual add, ...)  (left to TVM, after the kernel)

`match` reads the reduction's index expressions to tell the family (which iterators index A,
B and C: batch, m, n, k; or a conv window `p*stride + r*dilation`), the shapes, strides and
padding, and walks the element-wise blocks after it for the epilogue. Whatever does not fit is a
`NoMatch` whose message says why (it appears in `tsl.relax.report`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import TSLError
from ..ops import defs
from ..ops.epilogue import Epilogue, Step
from ..ops.operator import Operator


class NoMatch(Exception):
    """The function is not (entirely) a tsl operator; the message says why."""


class NotGemm(NoMatch):
    """The function's reduction is not a sum of products (pooling, softmax, norms): not a
    candidate at all."""


@dataclass(frozen=True)
class Operand:
    """A tsl input fed from call argument `param`, reshaped to `shape` (same element count)."""

    param: int
    shape: tuple[int, ...] | None


@dataclass
class Match:
    op: Operator  # the tsl operator (unpadded)
    operands: dict  # tsl input name ("A", "B", "bias", "scale", "residual", ...) -> Operand
    result_shape: tuple[int, ...]  # the shape TVM's last absorbed block writes
    result_buffer: object  # that block's buffer (a tail reads it)
    tail: list = field(default_factory=list)  # SBlocks left to TVM, in order
    tail_params: list = field(default_factory=list)  # call argument indices the tail reads
    tail_buffers: list = field(default_factory=list)  # and their buffers in the PrimFunc

    @property
    def pattern(self) -> str:
        steps = "+".join(s.kind for s in self.op.epilogue.steps)
        cast = f"->{self.op.epilogue.out_dtype}" if self.op.epilogue.out_dtype else ""
        # A 1x1 conv taken as the GEMM that reads its activation in place (`pixels_on_lanes`).
        name = "conv2d 1x1 as matmul" if self.op.params.get("activation_b") else self.op.name
        return f"{name}{'+' + steps if steps else ''}{cast}" + (
            f" (+{len(self.tail)} element-wise block(s) left to TVM)" if self.tail else "")


# -- TIR helpers -----------------------------------------------------------------------------
def _types():
    import tvm
    from tvm import tirx

    return tvm, tirx


def blocks(func) -> list:
    """The function's blocks (the root excluded), in program order."""
    import tvm_ffi
    from tvm import s_tir

    out = []
    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, out.append)], order="pre")
    return [b for b in out if b.name_hint != "root"]


def _is_load(e) -> bool:
    from tvm.ir.expr import TensorLoad

    return isinstance(e, TensorLoad)


def _strip_cast(e):
    _, tirx = _types()
    while isinstance(e, tirx.Cast):
        e = e.value
    return e


def _same(a, b) -> bool:
    return a.same_as(b)


def _index(seq, v) -> int:
    for i, x in enumerate(seq):
        if x.same_as(v):
            return i
    return -1


def _int(e) -> int | None:
    _, tirx = _types()
    return int(e.value) if isinstance(e, tirx.IntImm) else None


def _const(e):
    _, tirx = _types()
    if isinstance(e, (tirx.IntImm, tirx.FloatImm)):
        return e.value
    return None


def _shape(buf) -> tuple[int, ...]:
    dims = tuple(_int(d) for d in buf.shape)
    if any(d is None for d in dims):
        raise NoMatch(f"buffer {buf.name} has a symbolic shape {list(buf.shape)}")
    return dims


def _store(block):
    _, tirx = _types()
    if not isinstance(block.body, tirx.BufferStore):
        raise NoMatch(f"block {block.name_hint} is not a single store")
    return block.body


def _vars_of(indices, what: str) -> list:
    _, tirx = _types()
    out = []
    for e in indices:
        if not isinstance(e, tirx.Var):
            raise NoMatch(f"{what} is indexed by {e}, not by a loop iterator")
        out.append(e)
    return out


# -- the reduction -----------------------------------------------------------------------------
def _product(value, out_buf):
    """A and B loads of `out[s] + cast(A[...]) * cast(B[...])`."""
    _, tirx = _types()
    if not isinstance(value, tirx.Add):
        raise NotGemm("the reduction is not a sum")
    acc, prod = value.a, value.b
    if not (_is_load(acc) and _same(acc.source, out_buf)):
        acc, prod = prod, acc
    if not (_is_load(acc) and _same(acc.source, out_buf)):
        raise NotGemm("the reduction does not accumulate into its output")
    prod = _strip_cast(prod)
    if not isinstance(prod, tirx.Mul):
        raise NotGemm("the reduction does not sum products")
    a, b = _strip_cast(prod.a), _strip_cast(prod.b)
    if not (_is_load(a) and _is_load(b)):
        raise NoMatch("the reduction multiplies expressions, not two tensors")
    return a, b


def _gemm(red, store, a, b, params, acc_dtype):
    """matmul / linear / batch matmul: C[batch.., m.., n] = sum_k A[batch.., m.., k] B[batch.., k, n]
    (or B[batch.., n, k])."""
    spatial = [iv.var for iv in red.iter_vars if iv.iter_type == 0]
    reduce = [iv.var for iv in red.iter_vars if iv.iter_type != 0]
    cv = _vars_of(store.indices, "the output")
    av, bv = _vars_of(a.indices, "operand A"), _vars_of(b.indices, "operand B")
    if len(reduce) != 1:
        raise NoMatch(f"a GEMM reduces over one axis; this block reduces over {len(reduce)}")
    k = reduce[0]
    if _index(av, k) < 0 or _index(bv, k) < 0:
        raise NoMatch("the reduced axis does not index both operands")
    in_a = [_index(av, v) >= 0 for v in cv]
    in_b = [_index(bv, v) >= 0 for v in cv]
    if in_a[-1] and not in_b[-1]:  # the product is written B * A
        a, b, av, bv, in_a, in_b = b, a, bv, av, in_b, in_a
    elif not (in_b[-1] and not in_a[-1]):
        raise NoMatch("the output's last axis is not a column of one operand only")
    if len(cv) != len(spatial) or any(_index(spatial, v) < 0 for v in cv):
        raise NoMatch("the output is not indexed by the block's iterators")
    batch = [v for v, x, y in zip(cv, in_a, in_b) if x and y]
    m = [v for v, x, y in zip(cv, in_a, in_b) if x and not y]
    n = [v for v, x, y in zip(cv, in_a, in_b) if y and not x]
    if len(n) != 1 or not m or len(batch) + len(m) + 1 != len(cv):
        raise NoMatch("the axes are not (batch.., rows.., column) of a GEMM")
    if [v.same_as(w) for v, w in zip(cv, batch + m + n)] != [True] * len(cv):
        raise NoMatch("the output's axes are not ordered batch, rows, column")
    if [str(v) for v in av] != [str(v) for v in batch + m + [k]]:
        raise NoMatch("operand A is not laid out [batch.., rows.., k]")
    if [str(v) for v in bv] == [str(v) for v in batch + [k] + n]:
        transpose_b = False
    elif [str(v) for v in bv] == [str(v) for v in batch + n + [k]]:
        transpose_b = True
    else:
        raise NoMatch("operand B is not laid out [batch.., k, n] or [batch.., n, k]")
    ext = {str(iv.var): _int(iv.dom.extent) for iv in red.iter_vars}
    nb = math.prod(ext[str(v)] for v in batch)
    M, N, K = math.prod(ext[str(v)] for v in m), ext[str(n[0])], ext[str(k)]
    pa, pb = _param(params, a.source, "A"), _param(params, b.source, "B")
    dtype = _operand_dtype(a, b)

    def make(epilogue):
        kw = dict(dtype=dtype, acc_dtype=acc_dtype, transpose_b=transpose_b, epilogue=epilogue)
        if batch:
            return defs.batch_matmul(nb, M, N, K, **kw)
        return defs.matmul(M, N, K, **kw)

    bshape = (nb,) if batch else ()
    ops = {"A": Operand(pa, bshape + (M, K)),
           "B": Operand(pb, bshape + ((N, K) if transpose_b else (K, N)))}
    return make, ops, n[0], N


def _conv(red, store, a, b, params, pad_block, acc_dtype):
    """conv2d NCHW/OIHW (or NHWC/HWIO) with one stride, dilation and padding for both sides."""
    from tvm import sym

    cv = _vars_of(store.indices, "the output")
    bv = _vars_of(b.indices, "the weights")
    reduce = [iv.var for iv in red.iter_vars if iv.iter_type != 0]
    if len(cv) != 4 or len(bv) != 4 or len(reduce) != 3 or len(a.indices) != 4:
        raise NoMatch("not a 2-D convolution (4-D output, data and weights, 3 reduced axes)")
    ext = {str(iv.var): _int(iv.dom.extent) for iv in red.iter_vars}
    # Which output axis is the channel: the one only the weights read.
    chan = [i for i, v in enumerate(cv) if _index(bv, v) >= 0]
    if chan == [1]:
        layout, (n, co, oh, ow) = "NCHW", cv
        ci, r, s = bv[1], bv[2], bv[3]
        if not bv[0].same_as(co):
            raise NoMatch("the weights are not laid out [out channels, in channels, kh, kw]")
        a_n, a_c, a_h, a_w = a.indices
    elif chan == [3]:
        layout, (n, oh, ow, co) = "NHWC", cv
        r, s, ci = bv[0], bv[1], bv[2]
        if not bv[3].same_as(co):
            raise NoMatch("the weights are not laid out [kh, kw, in channels, out channels]")
        a_n, a_h, a_w, a_c = a.indices
    else:
        raise NoMatch("no single output channel axis indexes the weights")
    if not (a_n.same_as(n) and a_c.same_as(ci)):
        raise NoMatch("the data is not indexed by batch and input channel (grouped conv?)")
    hs = sym.detect_linear_equation(a_h, [oh, r])
    ws = sym.detect_linear_equation(a_w, [ow, s])
    if len(hs) != 3 or len(ws) != 3:
        raise NoMatch("the input window is not linear in the output position and kernel")
    (sh, dh, h0), (sw, dw, w0) = [[_int(c) for c in x] for x in (hs, ws)]
    if (sh, dh) != (sw, dw) or h0 != 0 or w0 != 0:
        raise NoMatch(f"strides ({sh}, {sw}) / dilations ({dh}, {dw}) differ between height "
                      f"and width")
    src, padding = a.source, 0
    if pad_block is not None:
        src, padding = _padding(pad_block, layout)
    x_shape = _shape(src)
    N_, C = x_shape[0], x_shape[1 if layout == "NCHW" else 3]
    H, W = x_shape[2:4] if layout == "NCHW" else x_shape[1:3]
    K, R, S = ext[str(co)], ext[str(r)], ext[str(s)]
    pa, pb = _param(params, src, "data"), _param(params, b.source, "weights")
    dtype = _operand_dtype(a, b)

    def make(epilogue):
        return defs.conv2d(N_, C, H, W, K, R, S, stride=sh, padding=padding, dilation=dh,
                           layout=layout, dtype=dtype, acc_dtype=acc_dtype, epilogue=epilogue)

    ops = {"A": Operand(pa, x_shape), "B": Operand(pb, _shape(b.source))}
    return make, ops, co, K


def _padding(block, layout) -> tuple:
    """(source buffer, padding) of a zero-padding block `P[i] = if_then_else(inside, X[i - p], 0)`."""
    from tvm import sym

    st = _store(block)
    v = st.value
    if _is_load(v):  # padding 0: legalization still copies the input
        load = v
    elif (isinstance(v, tvm_call()) and v.op.name.endswith("if_then_else")
          and _is_load(v.args[1]) and _const(v.args[2]) == 0):
        load = v.args[1]
    else:
        raise NoMatch(f"block {block.name_hint} before the reduction is not a zero padding")
    pv = _vars_of(st.indices, "the padded input")
    offs = []
    for e, var in zip(load.indices, pv):
        c = sym.detect_linear_equation(e, [var])
        if len(c) != 2 or _int(c[0]) != 1:
            raise NoMatch(f"block {block.name_hint} is not a padding (index {e})")
        offs.append(-_int(c[1]))
    spatial = (2, 3) if layout == "NCHW" else (1, 2)
    pads = {offs[d] for d in spatial}
    big, small = _shape(st.buffer), _shape(load.source)
    if any(offs[d] for d in range(4) if d not in spatial) or len(pads) != 1 or any(
            big[d] - small[d] != 2 * offs[d] for d in spatial):
        raise NoMatch(f"the padding is not the same on every side (offsets {offs}, "
                      f"{small} -> {big})")
    return load.source, pads.pop()


def tvm_call():
    import tvm

    return tvm.ir.Call


def _param(params, buf, what: str) -> int:
    i = _index(params, buf)
    if i < 0:
        raise NoMatch(f"the {what} operand is computed inside the function, not passed in")
    return i


def _operand_dtype(a, b) -> str:
    da, db = str(a.source.dtype), str(b.source.dtype)
    if da != db:
        raise NoMatch(f"operands of different dtypes ({da}, {db})")
    return da


# -- the epilogue ------------------------------------------------------------------------------
def _elementwise_step(block, cur, params, chan_var_pos, n_chan, acc_dtype):
    """The epilogue step `block` applies to buffer `cur` (None when it is not one), and the
    Operand it reads (a channel vector of bias / scale; a residual's shape is filled in by the
    caller: the operator's output shape)."""
    _, tirx = _types()
    st = _store(block)
    out_vars = _vars_of(st.indices, f"block {block.name_hint}")

    def is_cur(e):
        return _is_load(e) and _same(e.source, cur) and all(
            x.same_as(y) for x, y in zip(e.indices, out_vars))

    v = st.value
    if str(st.buffer.dtype) != acc_dtype:
        if isinstance(v, tirx.Cast) and is_cur(v.value):
            return ("cast", str(st.buffer.dtype)), None
        return None, None
    if isinstance(v, (tirx.Add, tirx.Mul)):
        for x, y in ((v.a, v.b), (v.b, v.a)):
            if not (is_cur(x) and _is_load(y) and _index(params, y.source) >= 0
                    and str(y.source.dtype) == acc_dtype):
                continue
            idx, bshape = list(y.indices), _shape(y.source)
            chan = out_vars[chan_var_pos]
            # One value per channel: the channel iterator indexes it, every other index is
            # 0 or runs over a dimension of extent 1.
            if (math.prod(bshape) == n_chan and _index(idx, chan) >= 0
                    and all(e.same_as(chan) or _int(e) == 0 or d == 1
                            for e, d in zip(idx, bshape))):
                kind = "scale" if isinstance(v, tirx.Mul) else "bias"
                return Step(kind), Operand(_index(params, y.source), (n_chan,))
            # A tensor of the output's shape read at the output element: a residual.
            if (isinstance(v, tirx.Add) and bshape == _shape(st.buffer)
                    and len(idx) == len(out_vars)
                    and all(e.same_as(o) for e, o in zip(idx, out_vars))):
                return Step("residual"), Operand(_index(params, y.source), None)
        return None, None
    if isinstance(v, tirx.Max) and is_cur(v.a) and _const(v.b) == 0:
        return Step("relu"), None
    if isinstance(v, tirx.RShift) and is_cur(v.a) and _int(v.b) is not None:
        return Step("shift", (_int(v.b),)), None
    bounds = _clip_bounds(v, is_cur, _int if acc_dtype.startswith("int") else _const)
    if bounds is not None:
        return Step("clip", bounds), None
    return None, None


def _clip_bounds(v, is_cur, bound):
    """(lo, hi) when `v` is max(min(cur, hi), lo) or min(max(cur, lo), hi) with constant
    bounds (`bound` reads one: integers on an integer accumulator, where a fractional bound
    would change the meaning; any number on a float one: relu6 is clip(0.0, 6.0)), else None."""
    _, tirx = _types()
    for outer, inner in ((tirx.Max, tirx.Min), (tirx.Min, tirx.Max)):
        if isinstance(v, outer) and isinstance(v.a, inner) and is_cur(v.a.a):
            lo, hi = (bound(v.b), bound(v.a.b)) if outer is tirx.Max else (bound(v.a.b),
                                                                          bound(v.b))
            if lo is not None and hi is not None and lo <= hi:
                return lo, hi
    return None


def match(func) -> Match:
    """The tsl operator that `func` computes (or a NoMatch saying why not): the one reduction
    (`_reduction`), its family (`_family`: GEMM or conv), the element-wise blocks it absorbs
    (`_epilogue`), and the tail left to TVM after it (`_check_tail`)."""
    params = list(func.params)
    bl = blocks(func)
    ri, store, a, b, acc_dtype = _reduction(bl)
    # float16 accumulation in TVM: tsl accumulates in float32 and rounds the result once, at
    # the end of the epilogue (bias added in float32: more accurate than TVM's float16 sum).
    tsl_acc = "float32" if acc_dtype == "float16" else acc_dtype
    make, operands, chan_var, n_chan = _family(bl[ri], store, a, b, params, bl[:ri], tsl_acc)
    post = bl[ri + 1:]
    chan_pos = _index(list(store.indices), chan_var)
    steps, out_dtype, cur, n = _epilogue(post, store, params, chan_pos, n_chan, acc_dtype,
                                         operands)
    try:
        op = make(Epilogue(tuple(steps), out_dtype))
    except TSLError as e:
        raise NoMatch(f"tsl does not take it: {e}") from e
    for name, operand in operands.items():
        if operand.shape is None:  # a residual: the output's elements, in its order
            operands[name] = Operand(operand.param, op.input(name).shape)
    if tsl_acc != op.acc_dtype:
        raise NoMatch(f"accumulator {acc_dtype}, tsl accumulates {op.dtype} in {op.acc_dtype}")
    tail = post[n:]
    tail_params = _check_tail(tail, cur, params, bl[:ri + 1 + n])
    return Match(op, operands, _shape(cur), cur, tail, tail_params,
                 [params[i] for i in tail_params])


def _reduction(bl):
    """(index, store, A load, B load, accumulator dtype) of the one sum-of-products block of
    `bl`, checked: at most one block before it, and that one feeding an operand."""
    red_i = [i for i, b in enumerate(bl) if any(iv.iter_type != 0 for iv in b.iter_vars)]
    if len(red_i) != 1:
        raise NotGemm(f"{len(red_i)} reduction blocks (tsl takes exactly one)")
    ri = red_i[0]
    red, pre = bl[ri], bl[:ri]
    if len(pre) > 1:
        raise NoMatch(f"{len(pre)} blocks before the reduction")
    if red.init is None:
        raise NoMatch("the reduction has no initial value")
    store = _store(red)
    a, b = _product(store.value, store.buffer)
    acc_dtype = str(store.buffer.dtype)
    if acc_dtype not in ("float32", "int32", "float16"):
        raise NoMatch(f"accumulator dtype {acc_dtype}")
    if pre and not _same(_store(pre[0]).buffer, a.source) and not _same(_store(pre[0]).buffer,
                                                                         b.source):
        raise NoMatch(f"block {pre[0].name_hint} before the reduction feeds neither operand")
    return ri, store, a, b, acc_dtype


def _family(red, store, a, b, params, pre, tsl_acc):
    """`_conv`'s or `_gemm`'s (make, operands, channel iterator, channels) by how many axes the
    reduction sums over (a conv's three: input channel and the window)."""
    n_reduce = sum(iv.iter_type != 0 for iv in red.iter_vars)
    if n_reduce == 3:
        return _conv(red, store, a, b, params, pre[0] if pre else None, tsl_acc)
    if pre:
        raise NoMatch(f"block {pre[0].name_hint} computes a GEMM operand")
    return _gemm(red, store, a, b, params, tsl_acc)


def _epilogue(post, store, params, chan_pos, n_chan, acc_dtype, operands):
    """(steps, output dtype, last absorbed buffer, blocks absorbed) for the element-wise blocks
    `post` after the reduction, up to the first that is no epilogue step (or a cast, which ends
    it); the operands the steps read are added to `operands` (a second bias is "bias2")."""
    steps, out_dtype = [], "float16" if acc_dtype == "float16" else None
    cur, seen, n = store.buffer, {}, 0
    while n < len(post):
        if acc_dtype.startswith("float") and _is_gelu(post[n:n + 5], cur):
            steps.append(Step("gelu"))
            cur, n = _store(post[n + 4]).buffer, n + 5
            continue
        step, operand = _elementwise_step(post[n], cur, params, chan_pos, n_chan, acc_dtype)
        if step is None:
            return steps, out_dtype, cur, n
        cur = _store(post[n]).buffer
        if isinstance(step, tuple):  # a cast: the kernel's output dtype, the last step
            return steps, step[1], cur, n + 1
        if operand is not None:
            seen[step.kind] = seen.get(step.kind, 0) + 1
            name = step.kind if seen[step.kind] == 1 else f"{step.kind}{seen[step.kind]}"
            operands[name] = operand
        steps.append(step)
        n += 1
    return steps, out_dtype, cur, n


def _is_gelu(bl, cur) -> bool:
    """Whether the five blocks `bl` are TVM's legalized (erf) gelu of buffer `cur`:
    t = cur * 1/sqrt(2); e = erf(t); h = e * 0.5; g = 0.5 + h; out = cur * g, each read at
    its output element (both frontends give `relax.op.nn.gelu` this form)."""
    _, tirx = _types()
    if len(bl) != 5 or any(not isinstance(b.body, tirx.BufferStore) for b in bl):
        return False
    st = [b.body for b in bl]

    def at(e, buf, i) -> bool:  # buf read at block i's output element
        return _is_load(e) and _same(e.source, buf) and len(e.indices) == len(st[i].indices) \
            and all(x.same_as(y) for x, y in zip(e.indices, st[i].indices))

    def times(i, buf, c) -> bool:  # block i: buf * c (either order), c a constant or a buffer
        v = st[i].value
        return isinstance(v, tirx.Mul) and any(
            at(x, buf, i) and (at(y, c, i) if not isinstance(c, float) else
                               _const(y) is not None and abs(_const(y) - c) < 1e-6)
            for x, y in ((v.a, v.b), (v.b, v.a)))

    erf = st[1].value
    half = st[3].value
    return (times(0, cur, 0.5 ** 0.5) and isinstance(erf, tvm_call())
            and erf.op.name.endswith("erf") and at(erf.args[0], st[0].buffer, 1)
            and times(2, st[1].buffer, 0.5) and isinstance(half, tirx.Add)
            and any(_const(x) == 0.5 and at(y, st[2].buffer, 3)
                    for x, y in ((half.a, half.b), (half.b, half.a)))
            and times(4, cur, st[3].buffer))


def _check_tail(tail, cur, params, absorbed) -> list[int]:
    """Call argument indices the tail reads; the tail may read the kernel's result, function
    arguments and its own blocks' buffers, nothing the kernel computed inside."""
    mine = {str(_store(b).buffer.name) for b in tail}
    inner = [_store(b).buffer for b in absorbed if not _same(_store(b).buffer, cur)]
    used = []
    for blk in tail:
        st = _store(blk)
        out_vars = _vars_of(st.indices, f"block {blk.name_hint}")
        if len(out_vars) != len(st.buffer.shape):
            raise NoMatch(f"block {blk.name_hint} after the kernel is not element-wise")
        for r in blk.reads:
            src = r.buffer if hasattr(r, "buffer") else r.source
            if any(_same(src, x) for x in inner):
                raise NoMatch(f"block {blk.name_hint} reads {src.name}, an intermediate result "
                              f"inside the operator")
            i = _index(params, src)
            if i >= 0 and i not in used:
                used.append(i)
            elif i < 0 and not _same(src, cur) and str(src.name) not in mine:
                raise NoMatch(f"block {blk.name_hint} reads {src.name}, unknown")
    return used


def pixels_on_lanes(m: Match) -> Match | None:
    """An NCHW 1x1 conv of one image (stride 1, no padding, one group) as the GEMM
    out[co, pixels] = W[co, ci] @ X[ci, pixels] with X read in place (`matmul(activation_b=
    True)`: the pixels on the vector lanes, stored straight into NCHW); the weights become A,
    the data B, both reshaped, not copied. None when `m` is no such conv."""
    op = m.op
    if op.name != "conv2d" or op.params["layout"] != "NCHW":
        return None
    N, C, H, W, K, R, S = op.params["shape"]
    if (N, R, S, op.params["stride"], op.params["padding"]) != (1, 1, 1, 1, 0):
        return None
    try:
        gemm = defs.matmul(K, H * W, C, dtype=op.dtype, acc_dtype=op.acc_dtype,
                           epilogue=op.epilogue, activation_b=True)
    except TSLError:
        return None
    ops = {"A": Operand(m.operands["B"].param, (K, C)),
           "B": Operand(m.operands["A"].param, (C, H * W))}
    for name, operand in m.operands.items():
        if name not in ("A", "B"):
            ops[name] = Operand(operand.param, gemm.input(name).shape)
    return Match(gemm, ops, m.result_shape, m.result_buffer, m.tail, m.tail_params,
                 m.tail_buffers)
