"""VTA back end: machine files, lowered TIR, program shape, tokens, the classic baseline."""
import dataclasses
from pathlib import Path

import numpy as np
import pytest

import tsl
from tsl.backends.vta import backend, classic, codegen
from tsl.backends.vta.isa import (Alu, AluOp, Finish, Gemm, Load, Mem, Store, decode_uops,
                                  from_words)
from tsl.backends.vta.timing import run_pipeline
from tsl.errors import LoweringError, ScheduleError, TAMError

EP = tsl.ops.requantize(shift=8, bias=True, clip=(0, 127))


def small_conv(**kw):
    args = dict(stride=1, padding=1, dtype="int8", epilogue=EP) | kw
    return tsl.ops.conv2d(1, 32, 8, 8, 32, 3, 3, **args)


def test_machine_files_give_the_hardware_configuration():
    c = codegen.machine_config(tsl.load_machine("vta-1x16x16"))
    assert (c.block_in, c.block_out, c.batch) == (16, 16, 1)
    assert (c.log_inp_buff_size, c.log_wgt_buff_size, c.log_acc_buff_size) == (15, 18, 17)
    assert (c.inp_depth, c.wgt_depth, c.acc_depth, c.uop_depth) == (2048, 1024, 2048, 8192)
    assert c.clock_hz == 100e6 and c.dram_bytes_per_cycle == 8.0
    big = codegen.machine_config(tsl.load_machine("vta-1x32x32"))
    assert (big.block_in, big.block_out) == (32, 32)
    assert big.inp_depth == 2048 and big.wgt_depth == 512


def test_tir_stages_tiles_and_tensorizes():
    art = tsl.build(small_conv(), "vta")
    tir = art.tir()
    for scope in ("local.inp", "local.wgt", "local.acc"):
        assert f'scope="{scope}"' in tir
    assert '"tsl_vta_gemm"' in tir and '"tsl_vta_reset"' in tir
    assert "tsl.vta_stages" in tir  # the default schedule pipelines the reduction


def test_program_prints_encodes_and_decodes():
    art = tsl.build(small_conv(), "vta")
    prog = art.program()
    lines = str(prog).splitlines()
    assert len(lines) == len(prog.insns) and art.source() == str(prog)
    words = prog.words()
    assert words.shape == (len(prog.insns), 2) and words.dtype == np.uint64
    assert from_words(words) == prog.insns


def test_epilogue_runs_on_the_alu_in_order():
    prog = tsl.build(small_conv(), "vta").program()
    alu = [(i.alu_op, i.use_imm, i.imm) for i in prog.insns if isinstance(i, Alu)]
    assert alu[:4] == [(AluOp.ADD, False, 0), (AluOp.SHR, True, 8), (AluOp.MIN, True, 127),
                       (AluOp.MAX, True, 0)]
    relu = tsl.build(small_conv(epilogue=tsl.ops.relu() + tsl.ops.requantize(2)), "vta")
    assert AluOp.MAX in {i.alu_op for i in relu.program().insns if isinstance(i, Alu)}


def test_padding_becomes_dma_padding_and_gemms_fold_loops():
    prog = tsl.build(small_conv(), "vta").program()
    inp = [i for i in prog.insns if isinstance(i, Load) and i.mem == Mem.INP]
    assert any(i.x_pad0 or i.y_pad0 for i in inp) and any(i.x_pad1 or i.y_pad1 for i in inp)
    gemm = [i for i in prog.insns if isinstance(i, Gemm) and not i.reset]
    assert all(i.iter_out * i.iter_in > 1 for i in gemm)


def test_pipelining_adds_tokens_that_overlap_load_and_compute():
    """Each thread with a copy of its tiles (TVM's cthreads): a second pipeline stage
    overlaps the next loads with the compute. Threads that share the input tile take turns
    holding it, which double-buffers it already with one stage."""
    arts = {}
    for stages in (1, 2):
        s = tsl.schedule(small_conv(), "vta", knobs={"stages": stages, "parallel_axes": "co"})
        arts[stages] = backend.build(s, cthreads=True), backend.build(s)
    for art in [a for pair in arts.values() for a in pair]:
        flags = [i.deps for i in art.program().insns]
        assert any(d.push_next for d in flags) and any(d.pop_prev for d in flags)
    (serial, shared), (piped, _) = arts[1], arts[2]
    assert piped.estimate().cycles < serial.estimate().cycles
    assert shared.estimate().cycles < piped.estimate().cycles


def test_classic_baseline_structure_is_pinned():
    m = tsl.load_machine("vta-1x16x16")
    op = classic.layer("C2")
    kn = classic.knobs(op, m)
    s = classic.schedule(op, m, kn)
    names = [lp.name for lp in s.loops]
    # (b, h0, co0, w0, co1, [ci0 r s ci1], h1, w1, ...): loads at ci0 for all h1 rows
    assert names == ["n", "oh.0", "co.0", "ow.0", "co.1", "ci.0", "r", "s", "ci.1", "oh.1",
                     "ow.1", "co.2", "ow.2", "co.3", "ci.2"]
    ext = {lp.name: lp.extent for lp in s.loops}
    assert (ext["oh.0"], ext["oh.1"], ext["ow.0"], ext["ow.1"]) == (7, 8, 1, 56)
    assert (ext["co.0"], ext["co.2"], ext["ci.0"], ext["ci.1"]) == (2, 2, 4, 1)
    staged = {(st.operand, st.level.name, st.at.name, st.at.stages) for st in s.stages}
    assert staged == {("A", "inp", "ci.0", 1), ("B", "wgt", "ci.0", 1), ("C", "acc", "co.1", 1)}
    assert [lp.name for lp in s.loops if lp.parallel] == ["co.0"]  # oc_nthread = 2
    assert "tsl.vta_vthreads" in backend.build(s).tir()
    s4 = classic.schedule(classic.layer("C4"), m, classic.knobs(classic.layer("C4"), m))
    assert [lp.name for lp in s4.loops if lp.parallel] == ["oh.0"]  # h_nthread = 2
    assert classic.knobs(tsl.ops.conv2d(1, 16, 9, 9, 16, 3, 3, dtype="int8"), m) is None


def test_clear_errors():
    with pytest.raises((LoweringError, ScheduleError), match="int8"):
        tsl.build(tsl.ops.matmul(16, 16, 16, dtype="float32"), "vta")
    with pytest.raises(LoweringError, match="requantize"):
        tsl.build(tsl.ops.matmul(16, 16, 16, dtype="int8"), "vta")


def test_finish_waits_for_the_last_store():
    """FINISH pops the token the last STORE pushes (the classic runtime's Synchronize), so the
    strict-FINISH pipeline accepts the program; without that token it is refused."""
    prog = tsl.build(small_conv(), "vta").program()
    last_store = max(k for k, i in enumerate(prog.insns) if isinstance(i, Store))
    assert prog.insns[last_store].deps.push_prev and prog.insns[-1].deps.pop_next
    run_pipeline(prog.insns, prog.config)
    cut = list(prog.insns)
    cut[last_store] = dataclasses.replace(cut[last_store], deps=dataclasses.replace(
        cut[last_store].deps, push_prev=False))
    cut[-1] = Finish()
    with pytest.raises(LoweringError, match=rf"FINISH #{len(cut) - 1} may execute before "
                                            r"store #\d+ \(STORE OUT"):
        run_pipeline(cut, prog.config)


@pytest.mark.parametrize("ep, alu", [
    (tsl.ops.relu() + tsl.ops.bias() + tsl.ops.requantize(4),
     [(AluOp.MAX, 0), (AluOp.ADD, None), (AluOp.SHR, 4), (AluOp.MIN, 127), (AluOp.MAX, -128)]),
    (tsl.ops.shift(3) + tsl.ops.bias() + tsl.ops.clip(-100, 90) + tsl.ops.requantize(1),
     [(AluOp.SHR, 3), (AluOp.ADD, None), (AluOp.MIN, 90), (AluOp.MAX, -100), (AluOp.SHR, 1),
      (AluOp.MIN, 127), (AluOp.MAX, -128)]),
], ids=["relu-bias-requantize", "shift-bias-clip-requantize"])
def test_epilogue_steps_run_in_the_composed_order(ep, alu):
    art = tsl.build(tsl.ops.dense(16, 64, 32, dtype="int8", epilogue=ep), "vta")
    ok, err = art.verify(seed=4)
    assert ok, f"error {err}"
    got = [(i.alu_op, i.imm if i.use_imm else None) for i in art.program().insns
           if isinstance(i, Alu)]
    assert got[:len(alu)] == alu


def test_epilogue_vta_cannot_run_is_refused():
    op = tsl.ops.dense(16, 64, 32, dtype="int8",
                       epilogue=tsl.ops.clip(-40000, 10) + tsl.ops.requantize(2))
    with pytest.raises(ScheduleError, match=r"clip\(-40000, 10\).*16-bit"):
        tsl.build(op, "vta")


def _gemm_dst_sequences(prog):
    """Per multiply-accumulate GEMM, the ACC entries its uop executions write, in order."""
    uops = decode_uops(prog.uops, prog.config)
    buf = np.zeros((prog.config.uop_depth, 3), dtype=np.int64)
    for i in prog.insns:
        if isinstance(i, Load) and i.mem == Mem.UOP:
            buf[i.sram_base:i.sram_base + i.x_size] = uops[i.dram_base:i.dram_base + i.x_size]
        elif isinstance(i, Gemm) and not i.reset:
            off = (np.arange(i.iter_out)[:, None] * i.dst_factor_out
                   + np.arange(i.iter_in)[None, :] * i.dst_factor_in).ravel()
            yield (off[:, None] + buf[i.uop_bgn:i.uop_end, 0][None, :]).ravel()


@pytest.mark.parametrize("op, knobs", [
    (tsl.ops.conv2d(1, 32, 6, 6, 32, 3, 3, padding=1, dtype="int8", epilogue=EP),
     {"w_inner": 1, "co_inner": 1, "h_inner": 1}),            # 1 ACC entry per tile
    (tsl.ops.dense(1, 512, 64, dtype="int8", epilogue=EP), {"n_inner": 2}),  # 2 entries
    (tsl.ops.dense(1, 64, 16, dtype="int8", epilogue=EP), {}),  # the whole output is 1 entry
], ids=["conv-1-entry", "dense-2-entries", "dense-1x16"])
def test_gemm_uops_avoid_the_accumulator_hazard(op, knobs):
    """Tiles of fewer than 3 ACC entries (the C11 w_inner=co_inner=h_inner=1 and dense
    n_inner=2 cases of issue #9) build, pass the simulator's hazard check bit-exact, and no
    uop writes an entry one of the two previous uops wrote."""
    art = tsl.build(op, "vta", knobs=knobs)
    ok, err = art.verify(seed=6)
    assert ok, f"error {err}"
    for seq in _gemm_dst_sequences(art.program()):
        assert not (seq[1:] == seq[:-1]).any() and not (seq[2:] == seq[:-2]).any()


def test_fields_that_do_not_encode_fail_the_build():
    """K = 2**20: a row of A is 65536 entries apart, past the 16-bit x_stride field; found at
    build (naming the field and what to change), not by the first run."""
    op = tsl.ops.dense(1, 1 << 20, 16, dtype="int8", epilogue=tsl.ops.requantize(3))
    with pytest.raises(LoweringError, match=r"x_stride=65536 does not fit.*operator dims"):
        tsl.build(op, "vta", knobs={"k_inner": 256})


def test_vta_machine_params_are_required(tmp_path):
    text = (Path(tsl.tam.loader.BUILTIN_DIR) / "vta-1x16x16.toml").read_text()
    head, rest = text.split("\n[params]\n")
    path = tmp_path / "vta-noparams.toml"
    path.write_text(head + rest[rest.index("[peaks]"):])
    with pytest.raises(TAMError, match=r"vta-noparams.toml: \[params\] key\(s\) "
                                       r"\['log_uop_buff_size', 'bus_bytes'"):
        tsl.build(small_conv(), str(path))
