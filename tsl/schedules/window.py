"""Sliding-window reductions on the vector unit: depthwise and grouped conv2d, max/avg pooling.

One reduction block whose output's innermost axis slides over its input's innermost axis
(`pad[.., w * stride + rw]`), with spatial producers (the padding) before it and spatial
consumers (bias / BN scale, relu6, the average's divide) after it. These are not GEMMs: each
output channel reads one input channel (or one group), so the GEMM primitive gains nothing; they
run on the vector unit instead, as ONNX Runtime's depthwise kernels do:

    for n, c  (fused, parallel over the cores; tall outputs: n and a band of rows per core;
              small stride-2 planes: a few planes per task)
        pad the (n, c) plane (or its band) once        (the padding producer, computed here)
        for h, w.o
            acc[w.i] = 0                              (w.i: one vector of output columns)
            for r..  acc[w.i] += pad[h*s + rh, w*s + rw] * k[c, rh, rw]   (vectorized w.i)
            out[n, c, h, w] = epilogue(acc[w.i])      (the fused consumers, vectorized w.i)

Names no back end: `lanes` and `cores` come from `VectorFacts`.
"""

from __future__ import annotations

import math


UNROLL = 7
"""Window loops up to this extent are unrolled (kernels up to 7 x 7)."""

BAND_ROWS = 16
"""Output rows per core from which a window's rows are split over the cores (`_parallel_planes`):
a 3 x 3 window's band then re-reads at most 1/8 of its input rows as halo."""

STAGED_BYTES = 4096
"""At least this much of a phase-split input is staged per parallel task (`_planes_per_task`):
the kernel's first loads then come well after the phase copy's last stores (see there)."""

TASKS_PER_CORE = 4
"""Grouping planes stops before fewer than this many parallel tasks per core are left: with
four or more, the cores' shares differ by at most a quarter of a share."""


def window(func, facts):
    """Schedule a sliding-window reduction PrimFunc (see the module docstring); None when
    `func` is not one (no single reduction, or its output's innermost axis does not slide over
    the input's), or when TVM refuses a step (the next rule then gets it)."""
    from tvm.s_tir.schedule import ScheduleError

    from .tir_blocks import dtype_bits

    found = _one_reduction(func, _slides)
    if found is None:
        return None
    sch, blocks, red = found
    at = blocks.index(red)
    try:
        red_lanes = facts.lanes(dtype_bits(sch.get(red).writes[0].source.dtype))
        phased = _split_phases(sch, red, blocks[:at])
        group = _planes_per_task(sch, blocks[:at], phased, red_lanes, facts.cores)
        last = _fold_consumers(sch, red, blocks[at + 1:])
        lanes = facts.lanes(dtype_bits(sch.get(last).writes[0].source.dtype))
        plane, w_outer = _output_nest(sch, last, lanes, facts.cores, group)
        sch.compute_at(red, w_outer, preserve_unit_loops=True)
        _vectorize_accumulation(sch, red)
        for b in reversed(blocks[:at]):
            _stage_producer(sch, b, plane, phased.get(sch.get(b).name_hint, 1))
    except ScheduleError:
        return None
    return sch


def _one_reduction(func, accepts):
    """(a schedule of `func`, its root blocks, its one reduction block) where `func` has
    exactly one block that is not all spatial and `accepts(block)` holds for it; else None."""
    from tvm import s_tir

    from .tir_blocks import root_blocks, spatial_only

    sch = s_tir.Schedule(func)
    blocks = root_blocks(sch)
    reds = [b for b in blocks if not spatial_only(sch, b)]
    if len(reds) != 1 or not accepts(sch.get(reds[0])):
        return None
    return sch, blocks, reds[0]


def _slides(block) -> bool:
    """The output's innermost index is a spatial iter var (extent > 1) that, with a reduction
    var of extent > 1, makes the innermost index of a read (`w * stride + rw`): a window
    sliding along the contiguous axis (an NHWC depthwise conv's `c + rc`, its group's `rc` of
    extent 1, is not: `channels_window`'s). A matmul or 1x1 conv (`b[k, j]`, `x[.., w]`: no
    window), a mean over H, W (innermost index a reduction var alone) or a reduction to width
    1 is not one (rowwise's)."""
    from tvm import tirx

    if not block.writes[0].region:   # a scalar result
        return False
    last = block.writes[0].region[-1].min
    if not isinstance(last, tirx.Var):
        return False
    iv = next((v for v in block.iter_vars if v.var.same_as(last)), None)
    if iv is None or iv.iter_type != 0 or not _const_above(iv.dom.extent, 1):
        return False
    out = block.writes[0].source
    window = [v.var for v in block.iter_vars
              if v.iter_type != 0 and _const_above(v.dom.extent, 1)]
    return any(r.region and _uses(r.region[-1].min, last)
               and any(_uses(r.region[-1].min, rv) for rv in window)
               for r in block.reads if not r.source.same_as(out))


def _const_above(extent, n: int) -> bool:
    return hasattr(extent, "value") and extent.value > n


def _split_phases(sch, red, producers: list) -> dict:
    """A window of stride s > 1 along the columns reads input column w * s + rw for the vector
    of output columns w: s elements apart, a gather per tap. Its producer (the padding) writes
    the columns split by phase instead, w -> (w % s, w // s), so that every tap reads
    consecutive elements (phase rw % s, from column w + rw // s): the kernel pays one strided
    pass over the input where it paid a gather per tap (MobileNetV2's 96 x 112 x 112 stride-2
    depthwise: 0.46 -> 0.18 ms, 2-core Xeon). A width the stride does not divide is padded
    with zeros that no output reads. Nothing changes where the input comes in as a parameter
    (no padding). Narrow rows are split too (576 x 14 x 14 stride 2, 7 output columns: 0.047 ms
    gathering, 0.025 split), provided several planes are staged per task (`_planes_per_task`).
    Returns {producer block name: stride} of the producers split."""
    from tvm import sym, tirx

    phased = {}
    blk = sch.get(red)
    col = blk.writes[0].region[-1].min
    for read in blk.reads:
        if not read.region or read.source.same_as(blk.writes[0].source):
            continue
        coef = sym.detect_linear_equation(read.region[-1].min, [col])
        stride = int(coef[0]) if len(coef) == 2 and isinstance(coef[0], tirx.IntImm) else 1
        writer = next((b for b in producers if sch.get(b).writes[0].source.same_as(read.source)),
                      None)
        width = read.source.shape[-1]
        if stride <= 1 or writer is None or not hasattr(width, "value"):
            continue
        width = width.value
        sch.transform_layout(
            writer, ("write", 0),
            lambda *ix: (*ix[:-1], ix[-1] % stride, ix[-1] // stride),
            pad_value=None if width % stride == 0 else tirx.const(0, read.source.dtype))
        phased[sch.get(writer).name_hint] = stride
    return phased


def _planes_per_task(sch, producers: list, phased: dict, lanes: int, cores: int) -> int:
    """Planes staged per parallel task: 1, but for a phase-split input whose phase rows are
    narrower than a vector, the fewest planes (a power of two dividing their count) that make
    `STAGED_BYTES`, leaving `TASKS_PER_CORE` tasks per core. The phase copy writes such a row in pieces (a partial vector and single
    elements), and the kernel reads it in whole vectors: a load spanning several stores still
    in the store buffer cannot be forwarded from them and waits for them to retire. One small
    plane per task (576 x 16 x 2 x 8 padded, stride 2, 16 lanes: 1 KB) read its taps straight
    after copying them: 0.24 ms against 0.047 gathering; four planes per task 0.025. Rows of
    a whole vector (the same layer on 8 lanes) are copied in whole vectors: grouping them
    measured slower there (0.035 -> 0.05 ms), as it did for large planes (144 x 58 x 2 x 29:
    0.084 -> 0.10-0.13 ms, their staging no longer fitting beside the kernel's in L1)."""
    from .tir_blocks import dtype_bits

    for b in producers:
        buf = sch.get(b).writes[0].source
        if sch.get(b).name_hint not in phased or len(buf.shape) < 4:
            continue
        if not all(hasattr(d, "value") for d in buf.shape):
            return 1   # a symbolic batch: its plane count is not known here
        dims = [int(d.value) for d in buf.shape]
        if dims[-1] >= lanes:
            return 1
        plane = dims[-3] * dims[-2] * dims[-1] * dtype_bits(buf.dtype) // 8
        count, group = math.prod(dims[:-3]), 1
        while (group * plane < STAGED_BYTES and count % (2 * group) == 0
               and count // (2 * group) >= TASKS_PER_CORE * cores):
            group *= 2
        return group
    return 1


def _uses(expr, var) -> bool:
    from tvm import tirx

    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def _fold_consumers(sch, red, consumers: list):
    """Inline the element-wise chain after the reduction into its last block and return that
    block; with no consumer, a copy-out block is made (the reduction then accumulates locally)."""
    if not consumers:
        return _copy_out(sch, red)
    for b in consumers[:-1]:
        sch.compute_inline(b)
    return consumers[-1]


def _copy_out(sch, red):
    """A block writing the reduction's output from a local accumulator (`cache_write`)."""
    sch.cache_write(red, 0, "local")
    return sch.get_consumers(red)[0]


def _output_nest(sch, last, lanes: int, cores: int, group: int = 1):
    """Shape the output block's loops: the planes (all but the two innermost loops) and, for
    tall outputs, bands of rows parallel (`_parallel_planes`, `group` planes a task); the
    innermost split into vectors of output columns. Returns the loop the producers are
    computed under (one task's planes, or one plane's band) and the outer column loop."""
    loops = sch.get_loops(last)
    if len(loops) < 2:
        from tvm.s_tir.schedule import ScheduleError
        raise ScheduleError("a window output needs at least rows and columns")
    plane = _parallel_planes(sch, loops, cores, group)
    width = sch.get(loops[-1]).extent.value
    w_outer, w_inner = sch.split(loops[-1], factors=[None, vector_width(width, lanes)])
    sch.vectorize(w_inner)
    return plane, w_outer


def _parallel_planes(sch, loops, cores: int, group: int = 1):
    """One (n, c) plane per parallel task (or `group` planes, which then share the task's
    staged input: `_planes_per_task`); but where each core gets at least `BAND_ROWS` output
    rows, the rows are cut in one band per core instead, with every channel's plane inside
    each band: a core then reads the rows its neighbours' kernels wrote on that core (tsl's 1x1
    convs split output rows over the cores, and the window's consumer reads the rows this core
    wrote), not half of every plane from the other core's cache. Returns the loop under which
    a plane's (or a band's) input is staged."""
    rows = sch.get(loops[-2]).extent
    if len(loops) < 3 or cores < 2 or not _const_above(rows, BAND_ROWS * cores - 1):
        plane = sch.fuse(*loops[:-2]) if len(loops) > 2 else loops[0]
        if group > 1:
            plane, _ = sch.split(plane, factors=[None, group])
        sch.parallel(plane)
        return plane
    band, inner = sch.split(loops[-2], factors=[cores, None])
    sch.reorder(band, loops[-3], inner)
    sch.parallel(sch.fuse(*loops[:-3], band) if len(loops) > 3 else band)
    return loops[-3]


def vector_width(width: int, lanes: int) -> int:
    """Output columns per vector: the whole row when it fits in one register (7, 14 on 16
    lanes); one register and a predicated rest when it fits in two (28 on 16 lanes, 14 on 8):
    a 28-wide vector, which LLVM split itself, rebuilt its 12-lane part and the weights'
    broadcasts with inserts in every row (192 x 28 x 28 depthwise: 0.061 -> 0.049 ms on
    AVX-512; 576 x 14 x 14 on AVX2: 0.086 -> 0.066); else the largest power of two from
    `lanes` down to `lanes / 4` that divides the row (56 -> 8), else `lanes` (the last vector
    is then predicated)."""
    if width <= lanes:
        return width
    if width <= 2 * lanes:
        return lanes
    for v in (lanes, lanes // 2, lanes // 4):
        if v > 1 and width % v == 0:
            return v
    return lanes


def _vectorize_accumulation(sch, red):
    """Under the column loop the reduction's loops are (spatial.., reduction..): put the vector of
    output columns innermost, zero it in a block of its own, vectorize both."""
    kinds = [iv.iter_type for iv in sch.get(red).iter_vars]
    loops = sch.get_loops(red)[-len(kinds):]
    spatial = [lp for lp, k in zip(loops, kinds) if k == 0]
    reduce = [lp for lp, k in zip(loops, kinds) if k != 0]
    sch.reorder(*reduce, spatial[-1])
    sch.vectorize(spatial[-1])   # before the init is split off: TVM checks a complete reduction
    # The kernel window (3 x 3) unrolled, the accumulator stays in registers: every window
    # loop, wherever the group's unit channel loop lies (NCHW's comes first, NHWC's last;
    # skipping the first loop left NHWC's rows rolled: unrolled, MobileNetV2's 112x112 and
    # 56x56 depthwise layers ran 0.93-0.95x in the model on a 2-core Zen 4,
    # benchmarks/README.md "mnv44").
    for lp in reduce:
        if _const_above(sch.get(lp).extent, 1) and sch.get(lp).extent.value <= UNROLL:
            sch.unroll(lp)
    sch.decompose_reduction(red, reduce[0])


def _stage_producer(sch, block, plane, stride: int = 1):
    """The padding: computed per (n, c) plane (or its band of rows, with the window's halo)
    inside the parallel loop (once per plane, in cache), split into a fill of the border and a
    copy of the interior (`decompose_padding`, under `plane`'s loops) so that both vectorize
    (a copy with an in-bounds test per element does not). Left at the root when TVM cannot
    place it there. A producer whose columns are split by phase (`_split_phases`, `stride`
    > 1) writes s rows of phases from one input row: its column loop is split by s with the
    phases unrolled and left to LLVM's loop vectorizer, which reads the row in whole vectors and
    deinterleaves them (shuffles); vectorized by TVM, the phase writes became one scalar store
    per element."""
    from tvm.s_tir.schedule import ScheduleError

    try:
        sch.compute_at(block, plane, preserve_unit_loops=True)
    except ScheduleError:
        return
    parts = [block]
    loops, at = sch.get_loops(block), sch.get_sref(plane)
    own = loops[1 + next(i for i, lp in enumerate(loops) if sch.get_sref(lp).same_as(at))]
    if sch.can_decompose_padding(block, own):
        parts.append(sch.decompose_padding(block, own))
    for b in parts:
        if stride == 1:
            sch.vectorize(sch.get_loops(b)[-1])
            continue
        cols, phase = sch.split(sch.get_loops(b)[-1], factors=[None, stride])
        if sch.get(b).reads:
            sch.unroll(phase)
        else:
            _fill_by_phase(sch, cols, phase)


def _fill_by_phase(sch, cols, phase):
    """The border fill of a phase-split producer (`decompose_padding`'s, which writes the whole
    staged plane): phases outer, so that each phase row is one run of consecutive columns,
    vectorized. In the copy's order (phases inner, left to LLVM) the fill, which reads
    nothing to deinterleave, became 8-element scatters: ResNet-18's 64 x 112 x 112 max-pool
    spent most of its 0.3-0.5 ms in them (benchmarks/README.md, res41)."""
    sch.reorder(phase, cols)
    if _const_above(sch.get(cols).extent, 0):
        sch.vectorize(cols)


def channels_window(func, facts):
    """Schedule a sliding-window reduction over a channels-last tensor (an NHWC max / avg
    pooling, an NHWC depthwise conv with its bias and clip, a mean over H, W): the output's
    innermost axis is the channel, read at the same index, and the window slides over axes
    further out, so `window`'s column vectors would be gathers. Here the channels are the
    vector: the producers (the padding) are inlined, whose bound check then holds for a whole
    vector of channels; the output pixels run parallel over the cores, and per pixel each
    vector of channels is reduced over the window in a register and leaves through the fused
    consumers (`_fold_consumers`, as in `window`). A channel count that is not a multiple of
    the lanes ends in a predicated vector. None when `func` is not one, or TVM refuses a step."""
    from tvm.s_tir.schedule import ScheduleError

    from .tir_blocks import dtype_bits

    found = _one_reduction(func, _channels_inner)
    if found is None:
        return None
    sch, blocks, red = found
    at = blocks.index(red)
    try:
        for b in blocks[:at]:
            sch.compute_inline(b)
        last = _fold_consumers(sch, red, blocks[at + 1:])
        lanes = facts.lanes(dtype_bits(sch.get(last).writes[0].source.dtype))
        sch.compute_at(red, _pixels_parallel(sch, last, lanes, facts.cores),
                       preserve_unit_loops=True)
        _vectorize_accumulation(sch, red)
    except ScheduleError:
        return None
    return sch


def _pixels_parallel(sch, last, lanes: int, cores: int):
    """The output block's rows parallel (its columns with them where the rows are fewer than
    `TASKS_PER_CORE` per core: 7 rows split 4 / 3 over two cores, 49 pixels 25 / 24), its
    channels split into vectors of `lanes`, the inner one vectorized. Rows alone where they
    suffice: with the pixels fused, ResNet-18's NHWC max-pool (64 x 112 x 112, stride 2)
    computed each pixel's row and column by a division and ran 110-160 us, 57-70 with rows
    (2-core Xeon, benchmarks/README.md "mnv43"). Returns the outer channel loop, under which
    the reduction is computed."""
    from tvm.s_tir.schedule import ScheduleError

    loops = sch.get_loops(last)
    if len(loops) < 2:
        raise ScheduleError("a channels-last window output needs pixels and channels")
    tasks = sch.fuse(*loops[:-2]) if len(loops) > 2 else loops[0]
    if len(loops) > 2 and not _const_above(sch.get(tasks).extent, TASKS_PER_CORE * cores - 1):
        tasks = sch.fuse(tasks, loops[-2])
    sch.parallel(tasks)
    c_outer, c_inner = sch.split(loops[-1], factors=[None, lanes])
    sch.vectorize(c_inner)
    return c_outer


def _channels_inner(block) -> bool:
    """The output's innermost index is a spatial iter var (extent > 1) that is the innermost
    index of every other read too (an NHWC depthwise conv reads `c + rc` with its group's
    reduction `rc` of extent 1: taken as `c`), and the reduction vars index the reads
    elsewhere: a window over channels-last data."""
    from tvm import tirx
    from tvm.sym import Analyzer

    if not block.writes[0].region:
        return False
    last = block.writes[0].region[-1].min
    iv = next((v for v in block.iter_vars if v.var.same_as(last)), None)
    if not isinstance(last, tirx.Var) or iv is None or iv.iter_type != 0 \
            or not _const_above(iv.dom.extent, 1):
        return False
    out = block.writes[0].source
    window = [v for v in block.iter_vars if v.iter_type != 0]
    ana = Analyzer()
    for v in window:
        if not _const_above(v.dom.extent, 1):
            ana.bind(v.var, tirx.const(0, str(v.var.ty)))
    reads = [r for r in block.reads if not r.source.same_as(out) and r.region]
    return bool(reads) and all(ana.simplify(r.region[-1].min).same_as(last) for r in reads) \
        and any(_uses(e.min, v.var) for r in reads for e in r.region[:-1] for v in window)
