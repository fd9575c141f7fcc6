"""The CPU back end end to end: every operator x dtype against NumPy, odd shapes included, and
the structure of what the shared schedule lowers to."""

import numpy as np
import pytest

import tsl
from tsl import ops
from tsl.errors import BackendUnavailable, InputError

DTYPES = ["float32", "bfloat16", "int8"]


def check(op, seed=3):
    art = tsl.build(op, "cpu")
    xs = op.random_inputs(seed)
    got = art.run(*xs)
    want = op.reference(*xs)
    assert got.shape == want.shape and got.dtype == want.dtype
    ok, err = op.check(got, want)
    assert ok, f"{op}: error {err}"
    return art


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 64, 64), (37, 50, 29), (1, 130, 7)])
def test_matmul(dtype, shape):
    check(ops.matmul(*shape, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_transpose_b_and_epilogues(dtype):
    ep = (ops.requantize(shift=7, bias=True, clip=(-20, 100)) if dtype == "int8"
          else ops.bias() + ops.relu())
    check(ops.matmul(45, 33, 70, dtype=dtype, transpose_b=True, epilogue=ep))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batch_matmul(dtype):
    check(ops.batch_matmul(3, 20, 40, 24, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_bias_relu(dtype):
    ep = ops.requantize(shift=6, bias=True, clip=(0, 127)) if dtype == "int8" else None
    check(ops.dense(17, 70, 40, dtype=dtype, epilogue=ep))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("geom", [dict(stride=1, padding=1), dict(stride=2, padding=0),
                                  dict(stride=1, padding=2, dilation=2)])
def test_conv2d(layout, dtype, geom):
    ep = ops.requantize(shift=8, bias=True, clip=(0, 127)) if dtype == "int8" else ops.relu()
    check(ops.conv2d(1, 19, 11, 9, 21, 3, 3, layout=layout, dtype=dtype, epilogue=ep, **geom))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_conv2d_batch_and_1x1_unpadded(layout, dtype):
    check(ops.conv2d(2, 16, 8, 8, 32, 1, 1, stride=2, layout=layout, dtype=dtype))


def test_vnni_is_used_and_exact_over_full_int8_range():
    op = ops.matmul(64, 64, 128, dtype="int8")
    art = check(op)
    assert "vpdpbusd" in art.source("asm")
    xs = [np.full((64, 128), -128, np.int8), np.full((128, 64), -128, np.int8)]
    assert (art.run(*xs) == 128 * 128 * 128).all()


def test_fp32_micro_kernel_structure():
    art = tsl.build(ops.matmul(256, 256, 256), "cpu")
    tir = art.tir()
    assert "T.parallel" in tir and "T.vectorized(16)" in tir and "T.unroll" in tir
    # B is packed into blocks of the register tile's width (n_inner x 16 lanes).
    nb = art.schedule.knob_values["n_inner"] * 16
    assert f'B: T.Buffer(({256 // nb}, 256, {nb}), "float32")' in tir
    assert "vfmadd" in art.source("asm")


def test_knobs_change_the_nest():
    op = ops.matmul(128, 128, 128)
    a = tsl.build(op, "cpu", knobs={"m_inner": 4, "n_inner": 1, "k_inner": 32})
    assert a.verify()[0]
    assert 'B: T.Buffer((8, 128, 16), "float32")' in a.tir()


def test_input_errors():
    op = ops.matmul(8, 8, 8)
    art = tsl.build(op, "cpu")
    a, b = op.random_inputs()
    with pytest.raises(InputError, match="takes 2 arrays"):
        art.run(a)
    with pytest.raises(InputError, match=r"input B must have shape \(8, 8\)"):
        art.run(a, b[:4])
    with pytest.raises(InputError, match="input A must be float32, got float64"):
        art.run(a.astype(np.float64), b)


def test_missing_cpu_feature_is_backend_unavailable(tmp_path):
    src = open(tsl.load_machine("x86-avx512").source).read()
    p = tmp_path / "fancy.toml"
    p.write_text(src.replace('name = "x86-avx512"', 'name = "fancy"').replace(
        'require = ["avx512f", "avx512vnni"]', 'require = ["avx512f", "sme2"]'))
    with pytest.raises(BackendUnavailable, match=r"\['sme2'\]"):
        tsl.build(ops.matmul(8, 8, 8), tsl.load_machine(p))


def test_estimate_and_source():
    art = tsl.build(ops.matmul(100, 100, 100), "cpu")
    est = art.estimate()
    assert est.macs == 100 ** 3 and est.padded_macs >= est.macs
    assert est.kind == "model" and "model estimate" in str(est)
    assert "define" in art.source()
