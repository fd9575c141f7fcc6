"""Each TSL primitive's generic lowering, seen in the TIR it produces (CPU hooks)."""

import re

import tsl
from tsl import ops
from tsl.backends.cpu.lowering import CPULowering
from tsl.lower import lower
from tsl.primitives import Schedule


def lowered(op, fn, knobs=None):
    s = Schedule(op, tsl.load_machine("x86-avx512"), knobs)
    fn(s)
    ctx = lower(s, CPULowering(s.machine, s.primitive))
    return ctx, ctx.sch.mod.script()


def test_tile_and_reorder_become_splits_in_that_order():
    def fn(s):
        i, j, k = s.loops
        i0, i1 = s.tile(i, 16)
        k0, k1 = s.tile(k, 8)
        s.reorder(i0, k0, j, i1, k1)
    _, tir = lowered(ops.matmul(40, 24, 32), fn)
    # i padded 40 -> 48: 3 x 16; k: 4 x 8; loop order i.0, k.0, j, i.1, k.1 (TE names the
    # matmul's axes i0, i1, k).
    assert "for i0_0, k_0, i1, i0_1, k_1 in T.grid(3, 4, 24, 16, 8)" in tir, tir
    assert 'A: T.Buffer((48, 32), "float32")' in tir


def test_parallel_fuses_and_binds():
    def fn(s):
        i, j, k = s.loops
        s.parallel([i, j], "core")
    _, tir = lowered(ops.matmul(8, 8, 8), fn)
    assert "in T.parallel(64)" in tir


def test_cache_accumulator_stages_the_tile():
    def fn(s):
        i, j, k = s.loops
        i0, i1 = s.tile(i, 4)
        j0, j1 = s.tile(j, 16)
        s.reorder(i0, j0, k, i1, j1)
        s.cache("C", "accumulator", at=j0)
    ctx, tir = lowered(ops.matmul(16, 32, 8), fn)
    assert "C_global" in tir and "C_store" in ctx.blocks
    # the copy-out runs per (i.0, j.0) tile, over its 4 x 16 region, 16 lanes wide
    assert re.search(r"for ax0 in range\(4\):\s+for ax1 in T.vectorized\(16\)", tir), tir


def test_cache_into_a_hardware_cache_copies_nothing():
    def fn(s):
        i, j, k = s.loops
        s.cache("A", "scratchpad", at=i)     # l2 is managed = false
    _, tir = lowered(ops.matmul(8, 8, 8), fn)
    assert "A_global" not in tir


def test_pack_changes_the_weight_signature_and_the_artifact_packs():
    def fn(s):
        s.pack("B")
    ctx, tir = lowered(ops.matmul(8, 32, 8), fn, {"n_inner": 2})
    assert 'B: T.Buffer((1, 8, 32), "float32")' in tir
    assert ctx.layouts[1].shape((8, 32)) == (1, 8, 32)


def test_tensorize_calls_the_machine_files_intrinsic():
    art = tsl.build(ops.matmul(32, 32, 64, dtype="int8"), "x86-avx512", cross=True)
    assert "llvm.x86.avx512.vpdpbusd.512" in art.source("ll")
    assert "T.call_llvm_pure_intrin" in art.tir()     # the block body is the intrinsic now


def test_fuse_epilogue_writes_the_output_from_the_tile():
    art = tsl.build(ops.dense(16, 32, 32, epilogue=ops.bias() + ops.relu()), "cpu")
    tir = art.tir()
    # no full-size intermediate C: the epilogue block reads the staged tile
    assert 'C = T.sblock_alloc_buffer' not in tir and 'sblock("out")' in tir


def test_tvm_failure_is_a_lowering_error_with_a_sentence():
    import pytest

    class Broken(CPULowering):
        def finalize(self, ctx):
            ctx.sch.vectorize(ctx.sch.get_loops(ctx.block)[0])   # a reduction block: refused

    s = tsl.schedule(ops.matmul(8, 8, 8), "cpu")
    with pytest.raises(tsl.LoweringError, match="failed in TVM; the schedule was"):
        lower(s, Broken(s.machine, s.primitive))
