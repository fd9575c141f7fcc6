"""VTA back end end to end: programs run in the simulator, bit-exact with NumPy."""

import numpy as np
import pytest

import tsl
from tsl.backends.vta import backend, classic

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
    check(backend.build(classic.schedule(op, m, classic.knobs(op, m))))
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
