"""Shape-generic builds (issue #25 step 2): one build of a family runs at every value."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

import tsl
import wmma_emulator
from tsl.dynamic import plan
from tsl.dynamic.symbolic import padded
from tsl.dynamic.shape import dims_of
from tsl.errors import InputError, ScheduleError
from tsl.ops import sym


def _check(art, fam, m, seed=0):
    xs = fam.random_inputs(seed=seed, m=m)
    op = fam.at(m=m)
    ok, err = op.check(art.run(*xs), fam.reference(*xs, m=m))
    assert ok, (m, err)


def test_dense_family_builds_once_and_matches_numpy_at_every_kind_of_value():
    fam = tsl.ops.dense(sym("m", upper=72), 40, 24,
                        epilogue=tsl.ops.bias() + tsl.ops.relu())
    art = tsl.build(fam, "cpu")
    for m in (1, 5, 17, 37, 64, 71, 72):
        _check(art, fam, m, seed=m)
    text = art.dispatch()
    assert "m in [1" in text and "72" in text and "knobs" in text


def test_bind_packs_the_weights_once_for_every_kernel():
    fam = tsl.ops.dense(sym("m", upper=48), 32, 20, epilogue=tsl.ops.bias())
    art = tsl.build(fam, "cpu")
    x, w, b = fam.random_inputs(seed=3, m=48)
    f = art.bind(B=w, bias=b)
    for m in (1, 13, 37, 48):
        np.testing.assert_allclose(f(x[:m]), fam.reference(x[:m], w, b, m=m),
                                   rtol=1e-4, atol=1e-4)
    with pytest.raises(InputError, match="follow m"):
        art.bind(A=x)
    # a call's checks are made once per shape and dtype: bad inputs after good ones still fail
    with pytest.raises(InputError, match="float32"):
        f(x[:13].astype(np.float64))
    with pytest.raises(InputError, match=r"\[1, 48\]"):
        f(np.ones((49, 32), np.float32))
    np.testing.assert_allclose(f(np.asfortranarray(x[:13])), fam.reference(x[:13], w, b, m=13),
                               rtol=1e-4, atol=1e-4)


def test_values_above_the_top_kernel_run_in_chunks(monkeypatch):
    # conv2d's batch can be cut but is not a GEMM's rows: per-value kernels, then chunks
    monkeypatch.setattr(plan, "CHUNK_TOP", 4)
    fam = tsl.ops.conv2d(sym("m", upper=11), 4, 6, 6, 8, 3, 3, padding=1)
    art = tsl.build(fam, "cpu")
    assert max(k.value for k in art.kernels) == 4 and not any(k.blocks for k in art.kernels)
    assert [take for _, take in art.pieces(11)] == [4, 4, 3]
    for m in (3, 5, 11):
        _check(art, fam, m, seed=m)


def test_gemm_rows_are_a_run_time_argument_padded_only_to_the_block():
    fam = tsl.ops.matmul(sym("m", upper=300), 24, 40)
    art = tsl.build(fam, "cpu")
    assert all(k.blocks for k in art.kernels)
    # a kernel per value up to SMALL (6), then one per doubling range: 6 + 8..256 + 300 = 13
    # ranges, each with at most a second kernel for the values its top pads: not one per value
    assert len(art.kernels) <= 2 * 13 and all(len(art.pieces(m)) == 1 for m in (1, 77, 300))
    for m in (1, 3, 8, 9, 77, 129, 255, 300):
        _check(art, fam, m, seed=m)
    assert "padded to whole blocks" in art.dispatch()


def test_each_range_runs_the_static_build_s_choice_at_its_top():
    # a range's kernel is what a static build of its top runs (the model's best there), and
    # values off their kernel's block (padded rows) still match NumPy
    # 256 x 256: enough work per call that the pool's launch (x86-avx512's launch_cycles)
    # leaves padding the difference between kernels (at 96 x 80 no second kernel pays)
    fam = tsl.ops.dense(sym("m", upper=40), 256, 256, epilogue=tsl.ops.bias())
    art = tsl.build(fam, "cpu")
    assert [k.value for k in art.kernels][:6] == [1, 2, 3, 4, 5, 6]  # small values: their own
    tops = {k.value: k for k in reversed(art.kernels)}  # a range's first kernel: its top's
    for k in tops.values():
        static = tsl.build(fam.at(m=k.value), "cpu").schedule
        assert k.knobs == dict(static.knob_values), k.value
    padded = [m for m in range(7, 41) if m % art.kernels[art.pieces(m)[0][0]].blocks["i"]]
    assert len(padded) >= 2  # values off their kernel's block: padded rows
    for m in padded[:2] + padded[-1:]:
        _check(art, fam, m, seed=m)
    _second_kernels_run_what_their_top_pads(art, fam)


def _second_kernels_run_what_their_top_pads(art, fam):
    # (16, 32]'s top pads 17..24 to 32 rows; a second kernel of a smaller block runs them,
    # the model pricing it its margin below the top's there; the top keeps its whole blocks
    from tsl.dynamic.microkernel import padded_price

    seconds = [n for n in range(1, len(art.kernels))
               if art.kernels[n].value == art.kernels[n - 1].value]
    assert seconds, art.dispatch()
    for n in seconds:
        top, sec = art.kernels[n - 1], art.kernels[n]
        runs = [m for m in range(1, 41) if art.pieces(m) == [(n, m)]]
        assert runs and top.value not in runs and all(m % top.blocks["i"] for m in runs)
        for m in runs[:1] + runs[-1:]:
            assert sec.margin * padded_price(fam, sec.fn, sec.schedule, ("i",), m) < \
                padded_price(fam, top.fn, top.schedule, ("i",), m)
            _check(art, fam, m, seed=m)
        assert art.pieces(top.value) == [(n - 1, top.value)]


def test_a_symbol_in_several_axes_is_padded_not_cut():
    fam = tsl.ops.batch_matmul(3, sym("s", upper=20), sym("s", upper=20), 16,
                               transpose_b=True)
    assert dims_of(fam).chunk_axis is None
    art = tsl.build(fam, "cpu")
    for s in (1, 7, 20):
        xs = fam.random_inputs(seed=s, s=s)
        ok, err = fam.at(s=s).check(art.run(*xs), fam.reference(*xs, s=s))
        assert ok, (s, err)
        assert len(art.pieces(s)) == 1
    assert all(set(k.blocks) == {"i", "j"} for k in art.kernels)  # run-time M and N


def test_one_bound_call_reuses_its_staged_packed_inputs_at_any_value():
    # both inputs free and B packed: staged in buffers grown once, each value's arguments
    # views of their first bytes in its padded (and B's packed) shape
    fam = tsl.ops.batch_matmul(3, sym("s", upper=40), sym("s", upper=40), 16,
                               transpose_b=True)
    f = tsl.build(fam, "cpu").bind()
    for s in (37, 5, 1, 23, 40, 17):
        xs = fam.random_inputs(seed=s, s=s)
        ok, err = fam.at(s=s).check(f(*xs), fam.reference(*xs, s=s))
        assert ok, (s, err)


def test_a_staged_input_s_padding_is_zero_again_after_another_value_wrote_there():
    # a kernel's staging buffers are shared by every value it runs: a value's zeros past its
    # input are written again only where another value's call wrote there (`Fill`), and an
    # input that nothing pads (whole blocks) is packed from the caller's array directly
    fam = tsl.ops.batch_matmul(3, sym("s", upper=40), sym("s", upper=40), 16,
                               transpose_b=True)
    art = tsl.build(fam, "cpu")
    f = art.bind()
    top = art.table.at(40)
    whole = next(v for v in range(40, 0, -1) if all(
        v % b == 0 for b in art.kernels[art.table.at(v).kernel].blocks.values()))
    for s in (top.lo, 40, top.lo, top.lo, whole, top.lo):
        xs = fam.random_inputs(seed=s, s=s)
        ok, err = fam.at(s=s).check(f(*xs), fam.reference(*xs, s=s))
        assert ok, (s, err)
        stage = f.bounds[art.table.at(s).kernel].staging.at(s)
        for fill in stage.inputs:
            assert all(not fill.dst[z].any() for z in fill.past), (s, fill.i)
    assert any(fill.direct for fill in
               f.bounds[art.table.at(whole).kernel].staging.at(whole).inputs)


def test_attention_values_times_scores_with_the_sequence_in_the_reduction():
    fam = tsl.ops.batch_matmul(2, sym("s", upper=40), 16, sym("s", upper=40))
    art = tsl.build(fam, "cpu")
    assert not any(k.blocks for k in art.kernels)  # a run-time reduction: per-rung kernels
    for s in (1, 9, 33, 40):
        xs = fam.random_inputs(seed=s, s=s)
        ok, err = fam.at(s=s).check(art.run(*xs), fam.reference(*xs, s=s))
        assert ok, (s, err)


@pytest.mark.parametrize("make,axis", [
    (lambda v: tsl.ops.dense(v, 16, 8), "i"),
    (lambda v: tsl.ops.matmul(8, 8, v), None),  # the reduction: padded only
    (lambda v: tsl.ops.conv2d(1, 4, v, 9, 4, 3, 3, padding=1), None),  # a window: halo
    (lambda v: tsl.ops.conv2d(v, 4, 9, 9, 4, 3, 3, padding=1), "n"),
])
def test_which_symbols_can_be_cut(make, axis):
    assert dims_of(make(sym("v", upper=12))).chunk_axis == axis


def test_conv2d_spatial_family_verifies():
    fam = tsl.ops.conv2d(1, 4, sym("h", upper=12), 9, 8, 3, 3, padding=1)
    art = tsl.build(fam, "cpu")
    for h in (3, 7, 12):
        xs = fam.random_inputs(seed=h, h=h)
        ok, err = fam.at(h=h).check(art.run(*xs), fam.reference(*xs, h=h))
        assert ok, (h, err)


def test_bad_input_is_a_typed_error_naming_the_shape(tmp_path):
    fam = tsl.ops.dense(sym("m", upper=16), 8, 8)
    art = tsl.build(fam, "cpu")
    x, w, *rest = fam.random_inputs(m=4)
    with pytest.raises(InputError, match=r"\[1, 16\]"):
        art.run(np.ones((17, 8), np.float32), w, *rest)
    with pytest.raises(InputError, match="shape"):
        art.run(x, w[:4], *rest)
    with pytest.warns(UserWarning, match="no complete record for dense.*cost model's knobs"):
        tsl.build(fam, "cpu", knobs=tsl.tune.Database(tmp_path / "t.jsonl"))
    with pytest.raises(InputError, match="float32"):
        art.run(x.astype(np.float64), w, *rest)
    with pytest.raises(ScheduleError, match="one symbolic dim"):
        tsl.build(tsl.ops.matmul(sym("a", upper=8), sym("b", upper=8), 8), "cpu")


def test_the_table_pads_small_values_and_cuts_large_ones_by_the_model():
    ks = [plan.Kernel(v, None, s) for v, s in ((1, 1.0), (4, 1.1), (8, 8.0))]
    tab = plan.table(ks, 20, chunkable=True)
    assert tab.at(1).kernel == 0 and not tab.at(1).chunk
    assert tab.at(3).kernel == 1  # padded 3 -> 4: one call
    assert tab.at(6).kernel == 2 and not tab.at(6).chunk
    assert tab.at(20).chunk and tab.at(20).kernel == 2
    assert plan.pieces(tab, ks, 20) == [(2, 8), (2, 8), (1, 4)]
    with pytest.raises(ScheduleError, match="no kernel covers value 9"):
        plan.table(ks, 20, chunkable=False)


def test_ladder_covers_the_bound():
    assert plan.ladder(20, 1, False) == [1, 2, 3, 4, 6, 8, 12, 16, 20]
    assert plan.ladder(5000, 4, True)[-1] == 4 * plan.CHUNK_TOP


def test_bench_row_times_the_dynamic_and_the_static_build_and_verifies():
    from tsl.bench import dynamic as bench

    fam = tsl.ops.dense(sym("m", upper=24), 16, 32, epilogue=tsl.ops.bias())
    art = tsl.build(fam, "cpu")
    r = bench.row("dense", fam, art, 13, peers=False)
    assert r["verified"] and r["dynamic_s"] > 0 and r["static_s"] > 0


def test_bench_pairs_each_call_with_the_others_in_rounds():
    from tsl.bench import dynamic as bench

    order = []
    t = bench._paired(lambda x: order.append(("f", x)), lambda x: order.append(("g", x)),
                      [1], [2])
    timed = order[4:]  # two warm-up calls each first
    assert timed[0::2] == [("f", 1)] * (len(timed) // 2)
    assert timed[1::2] == [("g", 2)] * (len(timed) // 2)
    assert len(timed) // 2 >= bench.ROUNDS * bench.CALLS and len(timed) % (2 * bench.ROUNDS) == 0
    assert all(x > 0 for x in t)


def test_the_same_family_builds_on_vta_in_rows_and_is_bit_exact():
    fam = tsl.ops.dense(sym("m", upper=4), 32, 16, dtype="int8",
                        epilogue=tsl.ops.bias() + tsl.ops.requantize(8))
    art = tsl.build(fam, "vta")
    assert art.target == "vta"
    for m in (1, 3, 4):
        assert art.verify(m=m) == (True, 0.0)


def test_the_same_family_builds_on_tpu_bucketed():
    pytest.importorskip("jax", reason="the TPU back end runs its Mosaic kernel under JAX")
    fam = tsl.ops.dense(sym("m", upper=40), 64, 32, dtype="bfloat16")
    art = tsl.build(fam, "tpu")
    assert art.target == "tpu"
    for m in (1, 17, 40):
        ok, err = art.verify(m=m)
        assert ok, (m, err)


@pytest.mark.skipif(not wmma_emulator.available(), reason="g++ not found (the CUDA kernels "
                    "are run by tests/wmma_emulator.py on the CPU)")
def test_the_same_family_builds_for_tensor_cores_and_its_plan_runs_emulated():
    """Tensor Cores: one kernel per rung (its grid follows the rung's M), each passing ptxas's
    checks where nvcc is, and the family's plan at values between rungs -- inputs padded to
    the rung, output cropped -- with every kernel run by the CUDA emulator, against NumPy."""
    from tsl.backends.cuda_tensorcore import codegen

    fam = tsl.ops.dense(sym("m", upper=32), 64, 32, dtype="float16", acc_dtype="float32")
    art = tsl.build(fam, "tensorcore-sm80")
    used = sorted(art.table.used())
    grids = {art.kernels[n].artifact.kernel.grid for n in used}
    assert len(used) > 1 and len(grids) > 1  # the grid follows the rung's M
    if codegen.nvcc() is not None:
        for n in used:
            ok, summary = art.kernels[n].artifact.check("sm_80")
            assert ok, (art.kernels[n].value, summary)

    def emulated(k, xs):
        ka = art.kernels[k].artifact
        return ka.op.crop_output(wmma_emulator.execute(ka, ka.prepare(xs)))

    for m in (1, 17, 30):
        op = art.op_at(m)
        xs = op.random_inputs(m)
        assert art.kernels[art.pieces(m)[0][0]].value >= m
        ok, err = op.check(art._run(list(xs), range(len(xs)), emulated), op.reference(*xs))
        assert ok, (m, err)


def test_a_call_s_fixed_cost_is_timed_where_the_calls_run_on_this_host():
    from tsl.backend import resolve_target
    from tsl.dynamic import calls

    cpu = calls.call_seconds(*resolve_target("cpu"))
    # Measured (not the simulated machines' constant); its size is the host's, not asserted.
    assert math.isfinite(cpu) and cpu > 0 and cpu != calls.CALL_SECONDS
    assert calls.call_seconds(*resolve_target("vta")) == calls.CALL_SECONDS  # simulated
    fam = tsl.ops.dense(sym("m", upper=8), 16, 16)
    assert f"{cpu * 1e6:.0f} us per call" in tsl.build(fam, "cpu").dispatch()


def test_only_a_top_that_runs_columns_outermost_offers_its_regroupings():
    # a rows-outermost top's regroupings ran 1.14-1.60 of static (benchmarks/README.md dyn38,
    # dyn39): those ranges take only other kernels, at the margin. The AVX-512 file on any
    # host: the 8 x 3 register tile needs its 24 accumulators (an AVX2 host has 16)
    from tsl.backends.cpu import host
    from tsl.dynamic import microkernel
    from tsl.record import record

    machine = host.specialize(tsl.load_machine("x86-avx512"), host.info())
    op = tsl.ops.dense(256, 768, 3072)
    knobs = {"k_inner": 1, "m_inner": 8, "m_outer": 16, "n_inner": 3, "n_outer": 4,
             "stages": 1}
    got = {}
    for outer in ("n", "m"):
        s = record(op, machine, None, {**knobs, "outer": outer})
        regroup = record(op, machine, None, {**knobs, "outer": outer, "m_outer": 4})
        top = plan.Kernel(256, s, 0.0, blocks={"i": 128})
        found = [SimpleNamespace(schedule=regroup, knobs=dict(regroup.knob_values))]
        got[outer] = sorted(m for _, m in microkernel._others(top, found, ("i",)))
    assert got == {"n": [1.0, microkernel.MARGIN], "m": [microkernel.MARGIN]}


def test_a_second_kernel_runs_where_its_price_is_the_tops_for_less_padded_work():
    # the model's prices of attention's scores at s = 333 on Zen 4: the top's 16 x 64 blocks
    # (336 x 384) and the second's 8 x 32 (336 x 352), 8.2% below for 9.1% less work: the
    # second ran 0.91 of static, the top 1.01 (benchmarks/README.md, dyn44); dense 3072->768
    # at 333 on a Xeon, 5% below for 9.1% fewer rows (3.6% dearer a row), ran 1.25x (dyn39)
    from tsl.dynamic.microkernel import MARGIN, margin_at

    assert margin_at(0.8993, 0.8258, 336 * 384, 336 * 352, MARGIN) == 1.0
    assert margin_at(1.0, 0.95, 384, 352, MARGIN) == MARGIN
    assert margin_at(1.0, 0.95, 384, 384, MARGIN) == MARGIN  # the same work: knobs ranked


def test_a_range_s_third_kernel_fits_the_values_its_top_and_second_pad_most():
    # attention's scores on the Zen 4 file's figures: (64, 128]'s top runs 8 x 32 blocks and
    # its second 12 x 16, so s = 100 ran 104 x 128 (1.07-1.17 of static); the model's best
    # inside the range (4 x 112 blocks) runs 97..112 (0.96 of static at 100: dyn45)
    from tsl.backends.cpu import host
    from tsl.dynamic import _check as checker, dims_of, microkernel
    from tsl.schedules import default_schedule

    machine = host.specialize(tsl.load_machine("x86-avx512-zen4"), host.info())
    fam = tsl.ops.batch_matmul(12, sym("s", upper=128), sym("s", upper=128), 64,
                               transpose_b=True)
    fn, axes = default_schedule(fam.name), dims_of(fam).axes
    per = microkernel.kernels(fam, machine, fn, axes, [64, 128], 128, None, checker(machine))
    kernels, tab = microkernel.table(fam, per)
    top, third = per[-1][0], per[-1][-1]
    assert third.value < 128 and third.knobs == dict(
        tsl.record.record(fam.at(s=third.value), machine, fn).knob_values)
    k = kernels[tab.at(100).kernel]
    assert k is third and padded(100, k.blocks["j"]) < padded(100, top.blocks["j"])
    assert all(kernels[tab.at(v).kernel] is top for v in (96, 128))  # the top's whole blocks
    art = tsl.build(fam, "cpu")  # this host's plan, whatever it holds: right at any value
    for v in (97, 100, 112):
        xs = fam.random_inputs(seed=v, s=v)
        ok, err = fam.at(s=v).check(art.run(*xs), fam.reference(*xs, s=v))
        assert ok, (v, err)
