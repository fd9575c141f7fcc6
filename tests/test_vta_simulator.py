"""VTA functional simulator and cycle model, checked against plain-Python references of
docs/vta.md §3-§5 on small hand-built programs."""
import dataclasses
import math

import numpy as np
import pytest

from tsl.backends.vta.config import DEFAULT, VTAConfig
from tsl.backends.vta.isa import (Alu, AluOp, Deps, Finish, Gemm, Load, Mem, Store, Uop,
                                  encode_uops)
from tsl.backends.vta.simulator import DRAM, Simulator
from tsl.backends.vta.timing import insn_cycles, run_pipeline
from tsl.errors import LoweringError

I32 = 1 << 31


def wrap32(x):
    return ((np.asarray(x, dtype=np.int64) + I32) % (1 << 32)) - I32


def rand_i8(rng, shape):
    """Random int8 without zeros, so a dropped term or a zero-filled entry always shows."""
    x = rng.integers(-128, 128, shape).astype(np.int8)
    x[x == 0] = 1
    return x


def rand_i32(rng, shape, lim=I32):
    x = rng.integers(-lim, lim, shape).astype(np.int32)
    x[x == 0] = 7
    return x


def with_deps(insn, **flags):
    return dataclasses.replace(insn, deps=dataclasses.replace(insn.deps, **flags))


def program(loads=(), compute=(), stores=()):
    """load -> compute -> store, one token on each forward edge and FINISH popping the store's
    token, so every push has its pop."""
    loads, compute, stores = list(loads), list(compute) + [Finish()], list(stores)
    if loads:
        loads[-1] = with_deps(loads[-1], push_next=True)
        compute[0] = with_deps(compute[0], pop_prev=True)
    if stores:
        compute[-2] = with_deps(compute[-2], push_next=True)
        compute[-1] = with_deps(compute[-1], pop_next=True)
        stores[0] = with_deps(stores[0], pop_prev=True)
        stores[-1] = with_deps(stores[-1], push_prev=True)
    return loads + compute[:-1] + stores + compute[-1:]


def simulate(prog, uops, dram, config=DEFAULT, **kw):
    sim = Simulator(config)
    return sim, sim.run(prog, uops, dram, **kw)


def loop_nest(insn, uops):
    """(dst, src, wgt) of every uop execution, in order, by the literal vta.md loop."""
    for y in range(insn.iter_out):
        for x in range(insn.iter_in):
            for u in uops[insn.uop_bgn:insn.uop_end]:
                yield (u.dst + y * insn.dst_factor_out + x * insn.dst_factor_in,
                       u.src + y * insn.src_factor_out + x * insn.src_factor_in,
                       u.wgt + y * getattr(insn, "wgt_factor_out", 0)
                       + x * getattr(insn, "wgt_factor_in", 0))


# -- LOAD -------------------------------------------------------------------------------------
def test_load_pads_every_side_and_reads_strided_rows():
    rng = np.random.default_rng(10)
    src = rand_i8(rng, (3 * 6, 1, 16))  # 3 rows of 6 elements, 4 used per row
    old = rand_i8(rng, (64, 1, 16))  # the padding must overwrite this
    dram = DRAM()
    base = dram.alloc(src) // 16
    ld = Load(Mem.INP, 5, base + 1, y_size=3, x_size=4, x_stride=6,
              y_pad0=1, y_pad1=2, x_pad0=3, x_pad1=1)
    before = Load(Mem.INP, 0, dram.alloc(old) // 16, 1, 64, 64)
    sim, _ = simulate(program(loads=[before, ld], compute=[]), [], dram)
    rows = src.reshape(3, 6, 1, 16)[:, 1:5]
    expect = np.pad(rows, ((1, 2), (3, 1), (0, 0), (0, 0)))
    assert (sim.inp[5:5 + 6 * 8].reshape(6, 8, 1, 16) == expect).all()


def test_load_acc_bias_padding_and_8bit_sign_extension():
    rng = np.random.default_rng(11)
    bias = rand_i32(rng, (2, 3, 1, 16))
    small = rand_i8(rng, (4, 1, 16))
    dram = DRAM()
    b = dram.alloc(bias) // 64
    s = dram.alloc(small) // 16
    prog = program(compute=[
        Load(Mem.ACC, 0, b, 2, 3, 3, y_pad0=1, x_pad1=2),
        Load(Mem.ACC_8BIT, 100, s, 1, 4, 4)])
    sim, stats = simulate(prog, [], dram)
    assert (sim.acc[:15].reshape(3, 5, 1, 16)
            == np.pad(bias, ((1, 0), (0, 2), (0, 0), (0, 0)))).all()
    assert (sim.acc[100:104] == small.astype(np.int32)).all()
    assert stats.bytes_read["ACC"] == bias.nbytes and stats.bytes_read["ACC_8BIT"] == 64


def test_wgt_load_with_padding_is_refused():
    dram = DRAM()
    w = dram.alloc(np.ones((2, 16, 16), np.int8)) // 256
    with pytest.raises(LoweringError, match=r"#0 \(LOAD  WGT.*cannot pad"):
        simulate(program(loads=[Load(Mem.WGT, 0, w, 1, 2, 2, x_pad0=1)], compute=[]),
                 [], dram)


# -- GEMM -------------------------------------------------------------------------------------
@pytest.mark.parametrize("spread", [False, True], ids=["product-table", "per-uop-gather"])
def test_gemm_two_level_loop_accumulates_like_numpy(spread):
    """Bias near the int32 limits, a dst that repeats across the inner loop (a reduction), and
    both product strategies: compact operand ranges use a product table, operands spread over
    the whole buffers use per-uop gathers."""
    rng = np.random.default_rng(12 + spread)
    c = DEFAULT
    n_inp, n_wgt = (c.inp_depth, c.wgt_depth) if spread else (40, 12)
    inp = rand_i8(rng, (n_inp, 1, 16))
    wgt = rand_i8(rng, (n_wgt, 16, 16))
    bias = rand_i32(rng, (64, 1, 16))
    bias[:4, 0, 0] = [I32 - 1, -I32, I32 - 5, -I32 + 3]
    hi_src = n_inp - 1 - 2 * 5 - 3 * 2
    hi_wgt = n_wgt - 1 - 2 * 1 - 3 * 2
    uops = [Uop(0, 0, 0), Uop(3, hi_src, hi_wgt),
            Uop(int(rng.integers(0, 40)), int(rng.integers(0, hi_src)),
                int(rng.integers(0, hi_wgt)))]
    gemm = Gemm(False, 0, 3, iter_out=3, iter_in=4, dst_factor_out=8, dst_factor_in=0,
                src_factor_out=5, src_factor_in=2, wgt_factor_out=1, wgt_factor_in=2)
    dram = DRAM()
    i, w, b = dram.alloc(inp) // 16, dram.alloc(wgt) // 256, dram.alloc(bias) // 64
    prog = program(loads=[Load(Mem.INP, 0, i, 1, n_inp, n_inp),
                          Load(Mem.WGT, 0, w, 1, n_wgt, n_wgt)],
                   compute=[Load(Mem.UOP, 0, 0, 1, 3, 3), Load(Mem.ACC, 0, b, 1, 64, 64), gemm])
    sim, stats = simulate(prog, uops, dram)
    ref = bias.astype(np.int64)
    for a, s, k in loop_nest(gemm, uops):
        ref[a] += inp[s].astype(np.int64) @ wgt[k].T.astype(np.int64)
    assert (sim.acc[:64] == wrap32(ref)).all()
    assert stats.gemm_uops == 36 and stats.macs == 36 * 256


def test_gemm_reset_zeroes_exactly_the_addressed_entries():
    rng = np.random.default_rng(13)
    bias = rand_i32(rng, (32, 1, 16))
    dram = DRAM()
    b = dram.alloc(bias) // 64
    uops = [Uop(1, 0, 0), Uop(4, 0, 0)]
    prog = program(compute=[Load(Mem.UOP, 0, 0, 1, 2, 2), Load(Mem.ACC, 0, b, 1, 32, 32),
                            Gemm(True, 0, 2, 2, 3, 10, 2, 0, 0, 0, 0)])
    sim, stats = simulate(prog, uops, dram)
    zeroed = {a for a, _, _ in loop_nest(prog[2], uops)}
    expect = bias.copy()
    expect[sorted(zeroed)] = 0
    assert (sim.acc[:32] == expect).all() and len(zeroed) == 12
    assert stats.reset_uops == 12 and stats.gemm_uops == 0 and stats.macs == 0


# -- ALU --------------------------------------------------------------------------------------
def ref_alu(op, x, y):
    x, y = int(x), int(y)
    if op == AluOp.SHR:
        r = x >> y if y >= 0 else x << -y
    else:
        r = {AluOp.MIN: min, AluOp.MAX: max, AluOp.ADD: int.__add__,
             AluOp.MUL: int.__mul__}[op](x, y)
    return (r + I32) % (1 << 32) - I32


def run_alu(acc0, uops, alus):
    dram = DRAM()
    b = dram.alloc(acc0) // 64
    n = len(acc0)
    prog = program(compute=[Load(Mem.UOP, 0, 0, 1, len(uops), len(uops)),
                            Load(Mem.ACC, 0, b, 1, n, n), *alus])
    sim, stats = simulate(prog, uops, dram)
    return sim.acc[:n], stats


def alu_reference(acc0, uops, alus):
    acc = acc0.astype(np.int64).reshape(len(acc0), -1).copy()
    for insn in alus:
        for d, s, _ in loop_nest(insn, uops):
            y = [insn.imm] * acc.shape[1] if insn.use_imm else acc[s]
            acc[d] = [ref_alu(insn.alu_op, a, b) for a, b in zip(acc[d], y)]
    return acc.reshape(acc0.shape)


@pytest.mark.parametrize("op", list(AluOp), ids=lambda o: o.name)
@pytest.mark.parametrize("use_imm", [True, False], ids=["imm", "src"])
def test_alu_ops(op, use_imm):
    rng = np.random.default_rng(20 + int(op) * 2 + use_imm)
    acc0 = rand_i32(rng, (48, 1, 16))
    if op == AluOp.SHR:  # operand entries hold shift amounts of both signs, some >= 32
        acc0[24:] = rng.choice([-40, -31, -9, -1, 1, 3, 8, 31, 33], (24, 1, 16))
    uops = [Uop(0, 24), Uop(1, 30)]
    # dst: 2 uops x iter (2, 3) over 0..23 without repeats; src over 24..47
    alus = [Alu(0, 2, 2, 3, dst_factor_out=12, dst_factor_in=2, src_factor_out=3,
                src_factor_in=1, alu_op=op, use_imm=use_imm, imm=imm)
            for imm in ((5, -7) if op == AluOp.SHR else (int(rng.integers(-30000, 30000)),))]
    got, stats = run_alu(acc0, uops, alus)
    assert (got == alu_reference(acc0, uops, alus)).all()
    assert stats.alu_uops == 12 * len(alus)


def test_alu_uops_see_earlier_writes_of_the_same_instruction():
    """A chain dst[k] += dst[k-1] applied twice (repeated dst), the same chain once (distinct
    dst, src reading an earlier dst) and an immediate MUL applied three times to the same
    entries: sequential loop order, not one vector step."""
    rng = np.random.default_rng(30)
    acc0 = rand_i32(rng, (8, 1, 16), lim=1000)
    uops = [Uop(1, 0), Uop(2, 1), Uop(3, 2), Uop(5, 5)]
    alus = [Alu(0, 4, 2, 1, 0, 0, 0, 0, AluOp.ADD),
            Alu(0, 3, 1, 1, 0, 0, 0, 0, AluOp.ADD),
            Alu(0, 3, 1, 3, 0, 0, 0, 0, AluOp.MUL, use_imm=True, imm=-3)]
    got, _ = run_alu(acc0, uops, alus)
    assert (got == alu_reference(acc0, uops, alus)).all()


# -- STORE ------------------------------------------------------------------------------------
def test_store_truncates_to_low_8_bits_and_keeps_stride_gaps():
    rng = np.random.default_rng(40)
    acc0 = rand_i32(rng, (6, 1, 16))
    acc0[0, 0, :9] = [200, -129, 127, 128, -1, I32 - 1, -I32, 255, 256]
    dram = DRAM()
    b = dram.alloc(acc0) // 64
    sentinel = rand_i8(rng, (2 * 5, 16))
    out = dram.alloc(sentinel)
    prog = program(compute=[Load(Mem.ACC, 0, b, 1, 6, 6)],
                   stores=[Store(Mem.OUT, 0, out // 16, y_size=2, x_size=3, x_stride=5)])
    _, stats = simulate(prog, [], dram)
    got = dram.read(out, sentinel.nbytes, np.int8, (2, 5, 16))
    low = ((acc0.reshape(2, 3, 16).astype(np.int64) + 128) % 256 - 128)
    assert (got[:, :3] == low).all()
    assert list(got[0, 0, :9]) == [-56, 127, 127, -128, -1, -1, 0, -1, 0]
    assert (got[:, 3:] == sentinel.reshape(2, 5, 16)[:, 3:]).all()
    assert stats.bytes_written["OUT"] == 6 * 16


# -- pipeline rules ---------------------------------------------------------------------------
def _inp_and_gemm(dram, rng):
    i = dram.alloc(rand_i8(rng, (4, 1, 16))) // 16
    w = dram.alloc(rand_i8(rng, (1, 16, 16))) // 256
    return ([Load(Mem.INP, 0, i, 1, 4, 4), Load(Mem.WGT, 0, w, 1, 1, 1)],
            [Load(Mem.UOP, 0, 0, 1, 1, 1), Gemm(True, 0, 1, 1, 4, 0, 1, 0, 0, 0, 0),
             Gemm(False, 0, 1, 1, 4, 0, 1, 0, 1, 0, 0)])


def test_deadlock_names_the_blocked_instruction_and_queue():
    dram = DRAM()
    loads, compute = _inp_and_gemm(dram, np.random.default_rng(50))
    compute[2] = with_deps(compute[2], pop_prev=True)  # waits for l2g; load never pushes
    with pytest.raises(LoweringError, match=r"deadlock: compute #4 \(GEMM  uop=\[0,1\).*"
                                            r"deps=pop_prev\) waits on empty l2g"):
        simulate(loads + compute + [Finish()], [Uop(0, 0, 0)], dram)


def test_token_bookkeeping_errors():
    dram = DRAM()
    loads, compute = _inp_and_gemm(dram, np.random.default_rng(51))
    uops = [Uop(0, 0, 0)]
    # the last GEMM pushes a g2l token that no load pops
    leftover = program(loads, compute[:-1] + [with_deps(compute[-1], push_prev=True)])
    with pytest.raises(LoweringError, match=r"tokens left in queues.*g2l \(1\)"):
        simulate(leftover, uops, dram)
    with pytest.raises(LoweringError, match="does not end with FINISH"):
        simulate(program(loads, compute)[:-1], uops, dram)
    with pytest.raises(LoweringError, match=r"#6 \(FINISH.*follows FINISH #5"):
        simulate(program(loads, compute) + [Finish()], uops, dram)
    with pytest.raises(LoweringError, match="load module, which has no pop_prev queue"):
        simulate([with_deps(loads[0], pop_prev=True), Finish()], uops, dram)


def test_finish_must_wait_for_every_module():
    """FINISH is strict: the host reads DRAM when it executes, so the last STORE (and every
    load) must be ordered before it; a program whose FINISH does not pop the store's token is
    refused, naming the STORE that could still be in flight."""
    rng = np.random.default_rng(53)
    dram = DRAM()
    loads, compute = _inp_and_gemm(dram, rng)
    out = dram.alloc(nbytes=64) // 16
    store = Store(Mem.OUT, 0, out, 1, 4, 4)
    good = program(loads, compute, [store])
    simulate(good, [Uop(0, 0, 0)], dram)
    assert good[-2].deps.push_prev and good[-1].deps.pop_next
    late = good[:-2] + [with_deps(good[-2], push_prev=False), Finish()]
    for run in (lambda: simulate(late, [Uop(0, 0, 0)], dram),
                lambda: run_pipeline(late, DEFAULT)):
        with pytest.raises(LoweringError, match=r"FINISH #6 may execute before store #5 "
                                                r"\(STORE OUT"):
            run()
    # a load nothing waits for is as late
    stray = good[:-1] + [Load(Mem.INP, 8, loads[0].dram_base, 1, 4, 4)] + good[-1:]
    with pytest.raises(LoweringError, match=r"FINISH #7 may execute before load #6"):
        simulate(stray, [Uop(0, 0, 0)], dram)


def test_gemm_accumulator_hazard_is_refused():
    """A multiply-accumulate uop may not write an ACC entry one of the two previous uops wrote
    (docs/vta.md §4): distance 1 and 2 are refused, distance 3 runs."""
    rng = np.random.default_rng(54)
    for dsts, bad in (([0, 0], 1), ([0, 1, 0], 2), ([0, 1, 2, 0], None)):
        dram = DRAM()
        i = dram.alloc(rand_i8(rng, (4, 1, 16))) // 16
        w = dram.alloc(rand_i8(rng, (1, 16, 16))) // 256
        n = len(dsts)
        prog = program([Load(Mem.INP, 0, i, 1, 4, 4), Load(Mem.WGT, 0, w, 1, 1, 1)],
                       [Load(Mem.UOP, 0, 0, 1, n, n), Gemm(True, 0, n, 1, 1, 0, 0, 0, 0, 0, 0),
                        Gemm(False, 0, n, 1, 1, 0, 0, 0, 0, 0, 0)])
        uops = [Uop(d, k % 4, 0) for k, d in enumerate(dsts)]
        if bad is None:
            simulate(prog, uops, dram)
            continue
        with pytest.raises(LoweringError, match=rf"GEMM .*accumulator hazard: uop execution "
                                                rf"{n - 1} .*writes ACC entry 0, which the uop "
                                                rf"{bad} before it wrote"):
            simulate(prog, uops, dram)
    # across the iter_in loop too: one uop, dst_factor_in 0
    dram = DRAM()
    i = dram.alloc(rand_i8(rng, (4, 1, 16))) // 16
    w = dram.alloc(rand_i8(rng, (1, 16, 16))) // 256
    prog = program([Load(Mem.INP, 0, i, 1, 4, 4), Load(Mem.WGT, 0, w, 1, 1, 1)],
                   [Load(Mem.UOP, 0, 0, 1, 1, 1), Gemm(True, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0),
                    Gemm(False, 0, 1, 1, 4, 0, 0, 0, 1, 0, 0)])
    with pytest.raises(LoweringError, match=r"uop execution 1 \(iter_out 0, iter_in 1, uop 0\)"):
        simulate(prog, [Uop(0, 0, 0)], dram)


def test_race_without_token_is_reported():
    dram = DRAM()
    loads, compute = _inp_and_gemm(dram, np.random.default_rng(52))
    racy = loads + compute + [Finish()]  # the GEMM reads INP with no l2g token
    with pytest.raises(LoweringError, match=r"#4 \(GEMM  uop.*race: reads INP entry 0 written by "
                                            r"#0 \(LOAD  INP"):
        simulate(racy, [Uop(0, 0, 0)], dram)


def test_out_of_bounds_and_uninitialised_accesses():
    rng = np.random.default_rng(53)
    dram = DRAM()
    loads, compute = _inp_and_gemm(dram, rng)
    uops = [Uop(0, 0, 0)]
    inp_end = loads[0].dram_base + 4

    def fails(prog, pattern, **kw):
        with pytest.raises(LoweringError, match=pattern):
            simulate(prog, uops, dram, **kw)

    fails(program([Load(Mem.INP, 2040, loads[0].dram_base, 1, 4, 4, x_pad1=5)], []),
          r"#0 \(LOAD  INP sram=2040.*INP entries \[2040, 2049\) exceed the buffer depth 2048")
    fails(program([Load(Mem.INP, 0, inp_end - 2, 1, 4, 4)], []),
          r"DRAM bytes .* not inside one allocation")
    fails(program([Load(Mem.INP, 0, 0, 1, 1, 1)], []), "not inside one allocation")
    fails(program(loads, compute[:2] + [dataclasses.replace(compute[2], dst_factor_out=1100,
                                                            iter_out=3)]),
          r"ACC indices reach \[0, 2203\], past the buffer depth 2048")
    fails(program(loads, compute[1:]), r"#2 \(GEMM  reset.*uop 0 was never loaded by LOAD UOP")
    fails(program(loads, compute[:2] + [dataclasses.replace(compute[2], uop_end=8193)]),
          r"uop range \[0, 8193\) exceeds the UOP buffer depth 8192")
    fails(program(loads, [compute[0], compute[2]]),
          "reads ACC entry 0, which no instruction of this program wrote")
    fails(program(loads[1:], compute), "reads INP entry 0, which no instruction")
    fails(program(loads, [Load(Mem.UOP, 0, 1, 1, 1, 1)] + compute[1:]),
          r"uop segment elements \[1, 2\) past the 1 uops")
    fails(program(loads, compute), "exceed the remaining max_steps", max_steps=5)
    fails(program([dataclasses.replace(loads[0], y_size=1 << 16)], []),
          r"instruction #0: LOAD  INP.*field y_size=65536 does not fit its 16-bit")


# -- DRAM and uops in DRAM --------------------------------------------------------------------
def test_dram_alloc_read_write():
    dram = DRAM(nbytes=64)
    a = dram.alloc(np.arange(10, dtype=np.int32))
    b = dram.alloc(None, nbytes=1 << 17, align=1024)  # grows past the initial size
    assert a == 256 and b % 1024 == 0 and b >= a + 40
    assert (dram.read(a, 40, np.int32, (10,)) == np.arange(10)).all()
    dram.write(b + 4, np.array([7, 8], np.int16))
    assert list(dram.read(b, 8, np.int16, (4,))) == [0, 0, 7, 8]
    with pytest.raises(ValueError, match="not inside one allocation"):
        dram.read(a, 44, np.int32, (11,))


def test_uops_placed_in_dram_by_the_caller():
    rng = np.random.default_rng(60)
    dram = DRAM()
    loads, compute = _inp_and_gemm(dram, rng)
    uops = [Uop(7, 0, 0), Uop(0, 0, 0)]
    addr = dram.alloc(encode_uops(uops))
    compute[0] = Load(Mem.UOP, 0, addr // 4 + 1, 1, 1, 1)  # absolute element index of uop 1
    sim, stats = simulate(program(loads, compute), None, dram, uop_dram_addr=addr)
    inp = dram.read(loads[0].dram_base * 16, 64, np.int8, (4, 16)).astype(np.int64)
    wgt = dram.read(loads[1].dram_base * 256, 256, np.int8, (16, 16)).astype(np.int64)
    assert (sim.acc[:4, 0] == inp @ wgt.T).all() and stats.bytes_read["UOP"] == 4


# -- other configurations ---------------------------------------------------------------------
@pytest.mark.parametrize("c", [
    VTAConfig(log_block_in=5, log_block_out=5, log_inp_buff_size=16, log_wgt_buff_size=19,
              log_acc_buff_size=18),
    VTAConfig(log_batch=1)], ids=["block32-big-buffers", "batch2"])
def test_other_config_gemm_and_store(c):
    rng = np.random.default_rng(70)
    b, k, o = c.batch, c.block_in, c.block_out
    inp = rand_i8(rng, (6, b, k))
    wgt = rand_i8(rng, (2, o, k))
    dram = DRAM()
    i = dram.alloc(inp) // c.inp_entry_bytes
    w = dram.alloc(wgt, align=c.wgt_entry_bytes) // c.wgt_entry_bytes
    out = dram.alloc(None, nbytes=12 * c.out_entry_bytes)
    far_inp, far_wgt = c.inp_depth - 8, c.wgt_depth - 12
    uops = [Uop(0, 0, 0), Uop(0, far_inp, far_wgt)]
    prog = program(
        loads=[Load(Mem.INP, 0, i, 1, 6, 6), Load(Mem.INP, far_inp, i, 1, 6, 6),
               Load(Mem.WGT, 0, w, 1, 2, 2), Load(Mem.WGT, far_wgt, w, 1, 2, 2)],
        compute=[Load(Mem.UOP, 0, 0, 1, 2, 2), Gemm(True, 0, 1, 6, 2, 2, 1, 0, 0, 0, 0),
                 Gemm(False, 0, 1, 6, 2, 2, 1, 1, 0, 0, 1),
                 Gemm(False, 1, 2, 6, 2, 2, 1, 1, 0, 0, 1)],
        stores=[Store(Mem.OUT, 0, out // c.out_entry_bytes, 1, 12, 12)])
    sim, stats = simulate(prog, uops, dram, config=c)
    ref = 2 * np.einsum("ibk,wok->iwbo", inp.astype(np.int64), wgt.astype(np.int64))
    assert (sim.acc[:12] == ref.reshape(12, b, o)).all()
    got = dram.read(out, 12 * c.out_entry_bytes, np.int8, (12, b, o))
    assert (got == (ref.reshape(12, b, o) + 128) % 256 - 128).all()
    assert stats.macs == 2 * 12 * b * k * o


# -- cycle model ------------------------------------------------------------------------------
def test_dma_and_uop_cycle_formulas():
    c = DEFAULT
    ld = Load(Mem.INP, 0, 0, y_size=3, x_size=4, x_stride=9, y_pad0=1, x_pad1=2)
    assert insn_cycles(ld, c) == 3 * (c.dma_latency + math.ceil(4 * 16 / 8)) + (4 * 6 - 12)
    wide = VTAConfig(bus_bytes=16, dram_bytes_per_cycle=4.0)
    assert insn_cycles(Store(Mem.OUT, 0, 0, 1, 5, 5), wide) == wide.dma_latency + 20
    assert insn_cycles(Gemm(False, 2, 7, 3, 4, 0, 0, 0, 0, 0, 0), c) == c.pipeline_fill + 60
    alu = Alu(0, 2, 5, 1, 0, 0, 0, 0, AluOp.ADD)
    assert insn_cycles(alu, c) == c.pipeline_fill + 10 * c.alu_ii


def test_pure_gemm_takes_about_one_cycle_per_uop():
    rng = np.random.default_rng(80)
    dram = DRAM()
    i = dram.alloc(rand_i8(rng, (64, 1, 16))) // 16
    w = dram.alloc(rand_i8(rng, (16, 16, 16))) // 256
    uops = [Uop(k, 0, k) for k in range(16)]
    n = 20 * 64 * 16
    prog = program([Load(Mem.INP, 0, i, 1, 64, 64), Load(Mem.WGT, 0, w, 1, 16, 16)],
                   [Load(Mem.UOP, 0, 0, 1, 16, 16), Gemm(True, 0, 16, 1, 64, 0, 16, 0, 0, 0, 0)]
                   + [Gemm(False, 0, 16, 1, 64, 0, 16, 0, 1, 0, 0)] * 20)
    _, stats = simulate(prog, uops, dram)
    assert stats.gemm_uops == n
    assert n < stats.cycles < 1.1 * n
    assert stats.busy["compute"] > 0.95 * stats.cycles
    assert stats.macs == n * 256 and stats.insn_counts == {"LOAD": 3, "GEMM": 21, "FINISH": 1}
    assert stats.cycles == run_pipeline(prog, DEFAULT).cycles
    assert "cycles" in stats.summary() and "MACs" in stats.summary()


def _tiled(double_buffer: bool, dram, rng, drop_war_tokens=False):
    """4 input tiles of 64 entries, each multiplied by 10 weight entries into one ACC region.
    With double buffering, tile t lands in half t % 2 and its load waits only for the GEMM of
    tile t - 2; serialised, it waits for the GEMM of tile t - 1."""
    tiles = [rand_i8(rng, (64, 1, 16)) for _ in range(4)]
    wgt = rand_i8(rng, (10, 16, 16))
    addr = [dram.alloc(t) // 16 for t in tiles]
    w = dram.alloc(wgt) // 256
    lag = 2 if double_buffer else 1
    loads, gemms = [Load(Mem.WGT, 0, w, 1, 10, 10)], []
    for t in range(4):
        half = t % 2 if double_buffer else 0
        loads.append(Load(Mem.INP, 64 * half, addr[t], 8, 8, 8,
                          deps=Deps(pop_next=t >= lag and not drop_war_tokens, push_next=True)))
        gemms.append(Gemm(False, half, half + 1, 64, 10, 10, 1, 1, 0, 0, 1,
                          deps=Deps(pop_prev=True, push_prev=t < 4 - lag and not drop_war_tokens)))
    uops = [Uop(0, 0, 0), Uop(0, 64, 0)]
    prog = (loads + [Load(Mem.UOP, 0, 0, 1, 2, 2), Gemm(True, 0, 1, 64, 10, 10, 1, 0, 0, 0, 0)]
            + gemms + [Finish()])
    ref = sum(np.einsum("ibk,wok->iwbo", t.astype(np.int64), wgt.astype(np.int64))
              for t in tiles)
    return prog, uops, ref.reshape(640, 1, 16)


def test_double_buffering_overlaps_load_and_compute():
    rng = np.random.default_rng(90)
    dram = DRAM()
    results = {}
    for double in (False, True):
        prog, uops, ref = _tiled(double, dram, rng)
        sim, stats = simulate(prog, uops, dram)
        assert (sim.acc[:640] == ref).all()
        results[double] = stats
    serial, overlapped = results[False].cycles, results[True].cycles
    load_busy, compute_busy = results[True].busy["load"], results[True].busy["compute"]
    assert overlapped < 0.8 * serial
    assert serial >= load_busy + 3 * 640  # every GEMM but the last one waits out a load
    assert overlapped < load_busy + compute_busy


def test_double_buffering_without_war_tokens_is_a_race():
    dram = DRAM()
    prog, uops, _ = _tiled(True, dram, np.random.default_rng(91), drop_war_tokens=True)
    with pytest.raises(LoweringError, match=r"#7 \(GEMM .*race: reads INP entry 0 written by "
                                            r"#3 \(LOAD  INP sram=0"):
        simulate(prog, uops, dram)
