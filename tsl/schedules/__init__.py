"""The default TSL schedules: one function per operator family, written against TAM roles
and knobs only. Every back end accepts these functions unchanged.

The nest they build, outer to inner (the same on every machine; what each loop becomes is the
back end's business)::

    b, i.0, j.0     blocks of the output     -> parallel over the "core" compute level, with
                                                 the parts of a split reduction (split_k)
    i.1, j.1        accumulator tiles         -> parallel over "subcore" (warps) if present;
                                                 C is staged in the "accumulator" level here
    k.0             reduction blocks          -> A and B staged in "scratchpad" levels, pipelined
    k.1             reduction steps           -> A and B staged in "operand" levels if present
    i.2, j.2        primitive tiles of the accumulator tile
    i.3, j.3, k.2   one tensor primitive      -> tensorize
"""

from __future__ import annotations

import functools
import math

from ..errors import ScheduleError
from ..primitives.schedule import Schedule


SPLIT_RATIO = 3
"""An operand this many times the other's size is the one split over the cores, where the
split is a 1x1 conv's (`_in_place_outer`, `_pointwise_split`)."""


def _primitive(s: Schedule):
    p = s.primitive
    if p is None:
        raise ScheduleError(f"machine {s.machine.name} has no tensor primitive for operands of "
                            f"{s.op.dtype}; its primitives take "
                            f"{sorted({(q.a_dtype, q.b_dtype) for q in s.machine.primitives})}")
    return p


@functools.lru_cache(maxsize=4096)
def _round_choices(extent: int, unit: int, choices: tuple):
    """Outer tile multipliers that do not exceed the padded extent needlessly; for each one
    that does not divide the extent's units, also the largest that does, and the whole
    extent where a choice reaches it (a 768-long contraction in units of 128 gets 3 beside 4
    and 6 for 8), so a tile can cover the extent without padding it."""
    top = max(1, -(-extent // unit))
    kept = {min(c, top) for c in choices}
    kept |= {max(d for d in range(1, c + 1) if top % d == 0) for c in kept}
    return tuple(sorted(kept)) or (1,)


def _stage_choices(s: Schedule):
    """Pipeline depths: double buffering first, deeper up to the machine's
    `params.pipeline_stages` (asynchronous copies with several groups in flight), or none;
    only none where the levels tiles are staged in are hardware caches (a CPU's): nothing is
    copied there for a pipeline to overlap, the caches' prefetchers do it."""
    if not any(lv.managed for role in ("scratchpad", "operand") for lv in s.machine.levels(role)):
        return (1,)
    deepest = int(s.machine.params.pipeline_stages)
    return (2, *range(3, deepest + 1), 1)


def _stage_and_map(s: Schedule, tiles, k_block, k_step, prim_loop, stages: int,
                   packed=("A", "B")) -> None:
    """The part every operator shares: accumulator tiles over the subcore level (when there is
    one) with C staged there, operands packed (`packed`), staged per reduction block and step,
    the block loop pipelined, the primitive mapped and the epilogue fused."""
    tile = s.parallel(tiles, "subcore") or tiles[-1]
    s.cache("C", "accumulator", at=tile)
    for operand in packed:
        s.pack(operand)
    for operand in ("A", "B"):
        s.cache(operand, "scratchpad", at=k_block)
        s.cache(operand, "operand", at=k_step)
    s.pipeline(k_block, stages)
    s.tensorize(prim_loop)
    s.fuse_epilogue()


def _activation_b(s: Schedule, p, i, j) -> bool:
    """A GEMM whose B is an activation read in place (`matmul(activation_b=True)`): its columns
    (pixels) and rows (output channels: a residual is read in place too) are not padded but
    predicated, and neither operand is packed; the primitive must
    broadcast one element of A over a vector of B's row (m = k = 1), since B is read as it lies."""
    if not s.op.params.get("activation_b"):
        return False
    if p.m != 1 or p.k != 1:
        raise ScheduleError(f"{s.op}: B read in place (activation_b) needs a primitive of one "
                            f"row and one reduction step (a vector FMA); {p.name} on "
                            f"{s.machine.name} is {p.m}x{p.n}x{p.k}: build it without "
                            f"activation_b (packed B)")
    s.predicate(i)
    s.predicate(j)
    return True


def _in_place_outer(M, N) -> tuple:
    """The in-place GEMM's parallel block loop (its `outer`) where one operand is several
    times the other: the split of the larger one. Split by rows (`m`), every core reads all
    of B (the activation, which the previous kernel has just written, half of it on the other
    core), split by columns (`n`) all of A (the weights). MobileNetV2's projections (24-32
    output channels from 96-192 x 784-3136, B 24-130 times A) ran 1.8-2.4x slower in the
    model split by rows, which the model had priced level with columns (benchmarks/README.md,
    mnv40). Nearer (384x14x14->96: B twice A) both are offered: there the columns make 4-5
    blocks for the cores, and the model's pick among their tiles measured 9% slower than its
    pick split by rows. Both when a dimension is symbolic."""
    if not (isinstance(M, int) and isinstance(N, int)):
        return ("n", "m")
    if N >= SPLIT_RATIO * M:
        return ("n",)
    if M >= SPLIT_RATIO * N:
        return ("m",)
    return ("n", "m")


def schedule_gemm(s: Schedule) -> None:
    """matmul, batch_matmul and dense: a multi-level tiled GEMM feeding the tensor primitive."""
    p = _primitive(s)
    (i,), (j,), (k,) = s.axes("m"), s.axes("n"), s.axes("k")
    b = s.axes("b")
    in_place = _activation_b(s, p, i, j)
    M, N, K = i.extent, j.extent, k.extent
    stages = s.knob("stages", _stage_choices(s))
    # The accumulator tile, in primitives; then accumulator tiles per block (per core).
    m_inner = s.knob("m_inner", _round_choices(M, p.m, (1, 2, 4, 6, 8, 12, 16)))
    n_inner = s.knob("n_inner", _round_choices(N, p.n, (1, 2, 3, 4, 6, 8)))
    mr, nr = m_inner * p.m, n_inner * p.n
    # B in place: one accumulator tile per block. Larger blocks (a panel of B kept for
    # several row tiles) measured no gain on MobileNetV2's 1x1 convs (320x7x7->1280: 6x4
    # tiles 16 to a block 0.23-0.33 ms, one to a block 0.25-0.26), and they made the space
    # too large to search whole: the sampled search missed the best register tile (mnv39p).
    outer_choices = (1,) if in_place else (1, 2, 4, 8, 16, 32)
    m_outer = s.knob("m_outer", _round_choices(M, mr, outer_choices))
    n_outer = s.knob("n_outer", _round_choices(N, nr, outer_choices))
    # B in place: the whole reduction per accumulator tile (nothing is staged per block of
    # it, so its split only multiplied the model's search: 9.6 -> 3.7 s over MobileNetV2's 1x1s).
    k_inner = s.knob("k_inner", (K,) if in_place else
                     _round_choices(K, p.k, (1, 2, 4, 8, 16, 32, 64, 128, 256)))
    kt = k_inner * p.k
    # split_k: the reduction's steps cut in that many parts, which run on their own cores
    # too, each summing its part (split_reduction), for operators with too few output tiles
    # to give every core work (fewer than 4 x 4 primitive tiles per core); on machines that
    # list the splits they reduce (params.split_k), the splits that make parts of equal
    # whole steps.
    steps = -(-K // kt)
    tiles = math.prod(a.extent for a in b) * -(-M // p.m) * -(-N // p.n)
    split = s.knob("split_k", [c for c in s.machine.params.split_k
                               if c == -(-steps // -(-steps // c))],
                   refines=True) if (s.machine.params.split_k and not in_place
                                     and tiles < 16 * s.machine.cores()) else 1
    i0, i1, i2, i3 = s.tile(i, mr * m_outer, mr, p.m)
    j0, j1, j2, j3 = s.tile(j, nr * n_outer, nr, p.n)
    if split > 1:
        ks, k0, k1, k2 = s.tile(k, -(-steps // split) * kt, kt, p.k)
        s.split_reduction(ks)
        splits = [ks]
    else:
        k0, k1, k2 = s.tile(k, kt, p.k)
        splits = []
    # Which operand's panel stays resident across the inner block loop: its loop goes outer.
    outer = s.knob("outer", _in_place_outer(M, N) if in_place else ("n", "m"))
    blocks = [j0, i0] if outer == "n" else [i0, j0]
    s.reorder(*b, *splits, *blocks, i1, j1, k0, k1, i2, j2, i3, j3, k2)
    # B in place: only the outer block loop is parallel, so that the loops over its columns
    # stay loops of their own, which the back end can split at the predicated edge.
    s.parallel(b + splits + (blocks[:1] if in_place else blocks), "core")
    _stage_and_map(s, [i1, j1], k0, k1, i3, stages, () if in_place else ("A", "B"))


def schedule_conv2d(s: Schedule) -> None:
    """conv2d (NCHW or NHWC) as an implicit GEMM: output pixels are rows (m), output channels
    columns (n), input channels the reduction (k) fed to the primitive; the kernel window
    loops run around the primitive."""
    p = _primitive(s)
    n, = [a for a in s.axes("m") if a.name == "n"]
    oh, ow = s.loop("oh"), s.loop("ow")
    co, ci = s.loop("co"), s.loop("ci")
    r, w = s.loop("r"), s.loop("s")
    stages = s.knob("stages", _stage_choices(s))
    P, Q, K, C = oh.extent, ow.extent, co.extent, ci.extent
    # The accumulator tile: rows from ow (times p.m), h_inner rows of oh stacked, co_inner
    # primitives of output channels; co_outer such tiles per block.
    w_inner = s.knob("w_inner", _round_choices(Q, p.m, (1, 2, 4, 7, 8, 14, 16, 28, 56)))
    co_inner = s.knob("co_inner", _round_choices(K, p.n, (1, 2, 4, 8, 16)))
    rows = (1, 2, 4, 7, 8, 14)
    if p.m > Q:
        # One output row is narrower than the primitive's rows: the tile's rows come from
        # stacking output rows, up to all of them (every divisor of OH).
        rows += tuple(d for d in range(1, P + 1) if P % d == 0)
    h_inner = s.knob("h_inner", _round_choices(P, 1, tuple(sorted(set(rows)))))
    co_outer = s.knob("co_outer", _round_choices(K, co_inner * p.n, (1, 2, 4, 8)))
    wr, cr = w_inner * p.m, co_inner * p.n
    ci_inner = s.knob("ci_inner", _round_choices(C, p.k, (1, 2, 4, 8, 16, 32, 64)))
    oh0, oh1 = s.tile(oh, h_inner)
    ow0, ow1, ow2 = s.tile(ow, wr, p.m)
    co0, co1, co2, co3 = s.tile(co, cr * co_outer, cr, p.n)
    ci0, ci1, ci2 = s.tile(ci, ci_inner * p.k, p.k)
    # reduce_rows: the h_inner rows of the accumulator tile share one pass over the reduction
    # (one load of each weight tile for all rows, as VTA's classic schedule does) instead of
    # one pass per row.
    # outer: which block loop goes outermost -- row blocks ("oh": each row block passes over
    # every channel block's weights) or channel blocks ("co": a block's weights stay cached
    # while every row block uses them, for layers whose weights outgrow the caches).
    outer_choices, axes_choices = _pointwise_split(s.op)
    blocks = [oh0, co0] if s.knob("outer", outer_choices) == "oh" else [co0, oh0]
    if s.knob("reduce_rows", (False, True)):
        s.reorder(n, *blocks, ow0, co1, ci0, r, w, ci1, oh1, ow1, co2, ow2, co3, ci2)
    else:
        s.reorder(n, *blocks, ow0, co1, oh1, ci0, r, w, ci1, ow1, co2, ow2, co3, ci2)
    # parallel_axes: which output-block loops are spread over the "core" level: all of them
    # fused, or only the channel or only the row blocks (VTA's classic oc_nthread / h_nthread
    # virtual threads).
    axes = s.knob("parallel_axes", axes_choices)
    s.parallel({"n_oh_co": [n, *blocks], "co": [co0], "oh": [oh0]}[axes], "core")
    _stage_and_map(s, [ow0, co1], ci0, ci1, ow2, stages)


def _pointwise_split(op) -> tuple:
    """The conv's (`outer`, `parallel_axes`) choices for one image: where one operand is
    `SPLIT_RATIO` times the other, only the splits over the cores that cut the larger one, as
    the in-place GEMM's (`_in_place_outer`, the 1x1 convs' other form).
    Input larger (1x1 NCHW convs): only the row blocks ("oh"), so that each core reads its
    rows of the input (which the previous kernel has just written across the cores) and not
    all of it (MobileNetV2's 384->64 @14 + residual: 0.415 -> 0.325 ms over its three calls in
    the model, benchmarks/README.md, mnv40; stride 2 too: ResNet-18's downsample 64x56x56->128
    0.155 -> 0.106 ms, 128x28x28->256 0.121 -> 0.093, res41). Weights larger (1x1 convs; NHWC
    convs with a window as soon as the weights are the larger, the split that moves less per
    core): the channel blocks outermost and split (alone or fused with the rows after
    them), so that each core streams half the weights, not all of them (320->1280 @7 + clip,
    weights 26 times the input: the model had picked the row blocks outermost, fused, so both
    cores read all 1.6 MB; mnv41). The model prices the two splits of ResNet-18's NHWC 3x3
    convs level, and the rows' ran slower inside the model: 256x14x14 (weights 12x the input)
    1.05-1.08x NCHW's time per call site, 0.99-1.03x split by channels; 128x28x28 (weights
    1.5x) 1.05x, 0.96-0.97x by channels (res43). The input is counted whole, strided or not. A
    batch keeps every split (a GPU grid needs `n` in it), and so do NCHW convs with a window
    (not measured)."""
    every = (("oh", "co"), ("n_oh_co", "co", "oh"))
    n, c, h, w, k, r, s = op.params["shape"]
    dims = (c, h, w, k)
    pointwise = (r, s, op.params.get("layout")) == (1, 1, "NCHW")
    if n != 1 or not all(isinstance(d, int) for d in dims) or not (
            pointwise or op.params.get("layout") == "NHWC"):
        return every
    # An NHWC window's weights are split once they are the larger operand (measured there).
    if k * r * s >= (1 if r * s > 1 and not pointwise else SPLIT_RATIO) * h * w:
        return ("co",), ("n_oh_co", "co")
    if pointwise and h * w >= SPLIT_RATIO * k:
        return every[0], ("oh",)
    return every


DEFAULT = {"matmul": schedule_gemm, "batch_matmul": schedule_gemm, "dense": schedule_gemm,
           "conv2d": schedule_conv2d}


def default_schedule(op_name: str):
    try:
        return DEFAULT[op_name]
    except KeyError:
        raise ScheduleError(f"no default schedule for operator {op_name!r}; pass schedule=") from None
