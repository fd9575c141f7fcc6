"""VTA back end end to end: programs run in the simulator, bit-exact with NumPy."""

import dataclasses

import numpy as np
import pytest

import tsl
from tsl.backends.vta import backend, classic
from tsl.backends.vta.isa import Alu, Gemm, Load, Mem, Store

EP = tsl.ops.requantize(shift=8, bias=True, clip=(0, 127))


def check(art, seed=3):
    xs = art.op.random_inputs(seed)
    assert all(np.any(x) for x in xs)
    got = art.run(*xs)
    want = art.op.reference(*xs)
    assert got.dtype == want.dtype == np.int8
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", [
    tsl.ops.matmul(33, 40, 50, dtype="int8", epilogue=EP),          # nothing a multiple of 16
    tsl.ops.dense(4, 64, 100, dtype="int8", epilogue=tsl.ops.requantize(6)),
    tsl.ops.matmul(16, 128, 96, dtype="int8", transpose_b=True,
                   epilogue=tsl.ops.bias() + tsl.ops.relu() + tsl.ops.requantize(5)),
], ids=str)
def test_gemm(op):
    check(tsl.build(op, "vta"))


@pytest.mark.parametrize("args", [
    (1, 32, 10, 10, 48, 3, 3, 1, 1), (1, 32, 11, 11, 32, 3, 3, 2, 1),
    (1, 24, 8, 8, 40, 1, 1, 2, 0), (2, 16, 6, 6, 16, 3, 3, 1, 0)], ids=str)
def test_conv2d(args):
    *shape, stride, pad = args
    check(tsl.build(tsl.ops.conv2d(*shape, stride=stride, padding=pad, dtype="int8",
                                   epilogue=EP), "vta"))


def test_resnet_layer_default_and_classic():
    op = classic.layer("C11")
    art = tsl.build(op, "vta")
    check(art)
    m = art.machine
    check(classic.build(op, m))
    row = art.benchmark()
    assert row["baseline_cycles"] > 0 and row["speedup"] == row["baseline_cycles"] / row["cycles"]
    assert row["speedup"] > 1, "the model's default knobs beat the classic tiles on C11"
    est = art.estimate()
    assert est.kind == "simulated" and est.cycles == row["cycles"]
    assert 0 < est.pct_peak < 100 and est.stats.gemm_uops == art.ctx.op.macs // 256  # padded work
    text = str(est)
    for word in ("cycles", "GEMM", "ALU", "INP", "WGT", "busy", "dma_latency"):
        assert word in text


def test_second_machine_file():
    for op in (tsl.ops.conv2d(1, 64, 9, 9, 64, 3, 3, padding=1, dtype="int8", epilogue=EP),
               tsl.ops.matmul(20, 70, 100, dtype="int8", epilogue=EP)):
        art = tsl.build(op, "vta-1x32x32")
        assert art.schedule.primitive.name == "gemm_1x32x32"
        check(art)
        assert art.benchmark()["speedup"] is None


def _without(monkeypatch, *flags):
    """The VTA back end with capabilities `flags` off (none: as it is), as its codegen and
    the cost model (through the schedule) both read it; returns its capabilities."""
    cap = dataclasses.replace(type(backend).capabilities, **{f: False for f in flags})
    monkeypatch.setattr(backend, "capabilities", cap)
    return cap


@pytest.mark.parametrize("args, knobs, step", [
    # 1x1 stride 2, 7x7 outputs in tiles of 4 rows x 4 columns: neither divides
    ((1, 24, 13, 13, 40, 1, 1, 2, 0, 1), {"h_inner": 4, "w_inner": 4}, 2),
    # stride 3 with zero padding, 5x5 outputs in tiles of 2 rows: the first strided row and
    # the padded tiles' rows fall in the padding
    ((1, 20, 11, 11, 24, 1, 1, 3, 1, 1), {"h_inner": 2, "w_inner": 4}, 3),
    # 3x3 stride 2: consecutive output rows' windows overlap, every row is read
    ((1, 32, 11, 11, 32, 3, 3, 2, 1, 1), {"h_inner": 4, "w_inner": 4}, 1),
    # 3x3 stride 2 dilation 2: taps and rows are all even
    ((1, 16, 13, 13, 16, 3, 3, 2, 2, 2), {"h_inner": 2, "w_inner": 4, "ci_inner": 1}, 2),
], ids=str)
def test_strided_conv_loads_only_the_rows_it_reads(args, knobs, step, monkeypatch):
    """The input tile of a strided window holds only the rows the GEMMs read, loaded at
    `step` times the row pitch; the result is exact, and the model's input traffic and DMA
    rows are the program's, with and without the skipping."""
    from tsl.backends.vta.isa import Alu, Gemm, Load, Mem

    *shape, stride, pad, dil = args
    op = tsl.ops.conv2d(*shape, stride=stride, padding=pad, dilation=dil, dtype="int8",
                        epilogue=EP)
    m = tsl.load_machine("vta-1x16x16")
    knobs = {"ci_inner": 2, "co_inner": 1, "co_outer": 1, "reduce_rows": True,
             "parallel_axes": "oh", "stages": 2} | knobs
    moved = {}
    for off in ((), ("row_pitch",)):
        cap = _without(monkeypatch, *off)
        s = tsl.schedule(op, m, knobs=knobs)
        art = backend.build(s)
        check(art)
        loads = [i for i in art.program().insns if isinstance(i, Load) and i.mem == Mem.INP]
        a = next(t for t in tsl.model.transfers(s) if t.what.startswith("A"))
        if not pad:  # (zero padding is written on chip: the model counts it as moved)
            assert a.total_bytes == art.estimate().traffic["INP"]
            assert a.rows * a.fills == sum(i.y_size for i in loads)
        moved[cap.row_pitch] = (art.estimate().traffic["INP"],
                                {i.x_stride for i in loads if i.y_size > 1})
    (skip, pitch_skip), (full, pitch_full) = moved[True], moved[False]
    assert {p // step for p in pitch_skip} == pitch_full
    assert skip < full if step > 1 else skip == full


def test_a_tile_that_does_not_change_is_loaded_once(monkeypatch):
    """All input and output channels in one tile: the weights do not depend on the output
    row blocks they are staged under, so the 2 virtual threads load them once (the model's
    fills too); once per thread where the threads do not share tiles, and once per block
    for each without keeps_tiles."""
    op = tsl.ops.conv2d(1, 32, 12, 12, 48, 1, 1, stride=2, dtype="int8", epilogue=EP)
    knobs = {"ci_inner": 2, "co_inner": 3, "co_outer": 1, "h_inner": 1, "w_inner": 6,
             "parallel_axes": "oh", "reduce_rows": True, "stages": 2}
    m = tsl.load_machine("vta-1x16x16")
    wgt = []
    for off in ((), ("shares_tiles",), ("keeps_tiles",), ("keeps_tiles", "shares_tiles")):
        _without(monkeypatch, *off)
        s = tsl.schedule(op, m, knobs=knobs)
        art = backend.build(s)
        check(art)
        b = next(t for t in tsl.model.transfers(s) if t.what.startswith("B"))
        wgt.append(art.estimate().traffic["WGT"])
        assert b.total_bytes == wgt[-1]
    assert wgt == [n * 32 * 48 for n in (1, 2, 3, 6)]


SHARE_OP = tsl.ops.conv2d(1, 40, 10, 10, 24, 3, 3, padding=1, dtype="int8", epilogue=EP)


@pytest.mark.parametrize("axes, shared, stages", [
    ("oh", "WGT", 1), ("oh", "WGT", 2),  # threads split the output rows: same weights
    ("co", "INP", 1),                     # threads split the output channels: same input
], ids=str)
def test_threads_share_the_tile_they_both_read(axes, shared, stages, monkeypatch):
    """Two virtual threads that need the same region of a buffer at once load it once (the
    channels, 40 in and 24 out, are not multiples of 16); the result is exact, the traffic
    of that buffer is half of what the threads move loading a copy each, the model's
    transfers are the program's, and the other buffer is unchanged."""
    knobs = {"parallel_axes": axes, "h_inner": 1, "w_inner": 10, "ci_inner": 1,
             "co_inner": 1, "co_outer": 1, "reduce_rows": True, "stages": stages}
    m = tsl.load_machine("vta-1x16x16")
    moved = {}
    for off in ((), ("shares_tiles",)):
        cap = _without(monkeypatch, *off)
        s = tsl.schedule(SHARE_OP, m, knobs=knobs)
        art = backend.build(s)
        check(art)
        traffic = art.estimate().traffic
        model = {t.what[0]: t.total_bytes for t in tsl.model.transfers(s)}
        assert model["B"] == traffic["WGT"]
        moved[cap.shares_tiles] = traffic
    other = "INP" if shared == "WGT" else "WGT"
    assert 2 * moved[True][shared] == moved[False][shared]
    assert moved[True][other] == moved[False][other]


def test_a_shared_tile_is_read_only_after_its_load():
    """Threads over the output rows share each weight tile, the threads taking turns to hold
    it: thread 0's GEMM reads a tile that thread 1's slot holds, and waits for its LOAD.
    Drop that token (the LOAD's push and the GEMM's pop) and the simulator reports a race
    of that GEMM (nothing orders it after the LOAD, or before the loads that follow it)
    instead of running the program."""
    from tsl.backends.vta.isa import Alu, Gemm, Load, Mem
    from tsl.backends.vta.timing import module_of
    from tsl.errors import LoweringError

    knobs = {"parallel_axes": "oh", "h_inner": 1, "w_inner": 10, "ci_inner": 1,
             "co_inner": 1, "co_outer": 1, "reduce_rows": True, "stages": 1}
    art = backend.build(tsl.schedule(SHARE_OP, "vta", knobs=knobs))
    check(art)  # the tokens as built
    insns = list(art.program().insns)
    half = art.program().config.wgt_depth // 2
    pushes = [k for k, i in enumerate(insns) if module_of(i) == "load" and i.deps.push_next]
    pops = [k for k, i in enumerate(insns) if module_of(i) == "compute" and i.deps.pop_prev]
    # (the last such LOAD: its slot held an earlier tile, which the GEMM would read)
    load, gemm = [(p, q) for p, q in zip(pushes, pops)
                  if insns[p].mem == Mem.WGT and insns[p].sram_base >= half][-1]
    assert isinstance(insns[load], Load)
    for k, flag in ((load, "push_next"), (gemm, "pop_prev")):
        insns[k] = dataclasses.replace(insns[k], deps=dataclasses.replace(insns[k].deps,
                                                                          **{flag: False}))
    art.program().insns = insns
    with pytest.raises(LoweringError, match=rf"#{gemm} .*race: |race: .* by #{gemm} "):
        art.run(*art.op.random_inputs(3))


def test_uop_kernels_load_once_per_fill_of_the_uop_buffer():
    """The micro-op kernels that fill the UOP buffer between two refills from its start are
    loaded by one LOAD UOP, where the fill's first kernel was loaded (one DMA latency per
    fill, not per kernel); the classic program loads each kernel on its own, as TVM's
    runtime does. A 64-byte UOP buffer (16 uops) forces many fills of several kernels each:
    merging kernels across a refill would overflow the buffer or overwrite kernels still in
    use, and a kernel loaded after its GEMM would be read unloaded, which the simulator
    refuses."""
    op = tsl.ops.conv2d(1, 24, 9, 9, 40, 3, 3, padding=1, dtype="int8", epilogue=EP)
    m = tsl.load_machine("vta-1x16x16")
    small = dataclasses.replace(m, params=dataclasses.replace(m.params, log_uop_buff_size=6))
    s = tsl.schedule(op, small, knobs={"parallel_axes": "co", "h_inner": 2, "w_inner": 9,
                                       "ci_inner": 1, "co_inner": 1, "co_outer": 1,
                                       "reduce_rows": True, "stages": 2})
    depth = 16
    art, classic_art = backend.build(s), backend.build(s, cthreads=True)
    for a in (art, classic_art):
        check(a)
    prog = art.program()
    loads = [i for i in prog.insns if isinstance(i, Load) and i.mem == Mem.UOP]
    assert len(loads) > 2 and all(i.sram_base == 0 and i.x_size <= depth for i in loads)
    assert any(i.uop_bgn > 0 for i in prog.insns if isinstance(i, (Gemm, Alu)))
    assert sum(i.x_size for i in loads) == len(prog.uops)
    classic_loads = [i for i in classic_art.program().insns
                     if isinstance(i, Load) and i.mem == Mem.UOP]
    assert any(i.sram_base > 0 for i in classic_loads)


@pytest.mark.parametrize("op, split", [
    (tsl.ops.conv2d(1, 24, 9, 9, 40, 3, 3, padding=1, dtype="int8", epilogue=EP), True),
    # 11 pieces of 3 entries: the 10 more ALU instructions of each of the 4 epilogue ops
    # would cost more than the 60 cycles of STORE they would leave unexposed
    (tsl.ops.matmul(33, 40, 50, dtype="int8", epilogue=EP), False),
], ids=str)
def test_the_last_tile_is_stored_in_pieces(op, split):
    """The program's last accumulator tile runs its epilogue and STORE in pieces along its
    outermost dim, where that pays (as the model's `drain_pieces` says), so that only the
    last piece's STORE is left after the compute; the classic program stores it whole.
    Exact either way; drop the token from the last piece's ALU to its STORE and the
    simulator reports that STORE racing the ALU."""
    from tsl.backends.vta.timing import module_of
    from tsl.errors import LoweringError

    s = tsl.schedule(op, "vta")
    art, classic_art = backend.build(s), backend.build(s, cthreads=True)
    for a in (art, classic_art):
        check(a)
    tail = {}
    for a in (art, classic_art):
        insns = a.program().insns
        last = max(k for k, i in enumerate(insns) if isinstance(i, Gemm))
        tail[a] = [k for k in range(last, len(insns)) if isinstance(insns[k], Store)]
    assert len(tail[classic_art]) == 1
    wb = next(t for t in tsl.model.transfers(s) if t.what.startswith("C write-back"))
    assert len(tail[art]) == tsl.model.cost.drain_pieces(s, wb)
    assert (len(tail[art]) > 1) == split
    if not split:
        return
    insns = list(art.program().insns)
    store = tail[art][-1]
    alu = max(k for k in range(store) if module_of(insns[k]) == "compute"
              and insns[k].deps.push_next)
    assert isinstance(insns[alu], Alu) and insns[store].deps.pop_prev
    for k, flag in ((alu, "push_next"), (store, "pop_prev")):
        insns[k] = dataclasses.replace(insns[k], deps=dataclasses.replace(insns[k].deps,
                                                                          **{flag: False}))
    art.program().insns = insns
    with pytest.raises(LoweringError, match=rf"race: .*#{store}|#{store} .*race: "):
        art.run(*art.op.random_inputs(3))
