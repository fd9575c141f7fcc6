"""Epilogue steps that read operands (bias, scale, residual) and the float activations (gelu,
silu): each built on the CPU and checked against the NumPy reference on shapes that are not
multiples of the primitive; back ends whose kernels cannot run a step refuse it by name."""

import numpy as np
import pytest

import tsl
from tsl.errors import ScheduleError
from tsl.ops import bias, gelu, relu, requantize, residual, scale, silu


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_conv_with_a_batch_norm_scale_a_residual_and_silu_matches_numpy(layout):
    op = tsl.ops.conv2d(1, 9, 11, 10, 21, 3, 3, padding=1, layout=layout,
                        epilogue=scale() + bias() + residual() + silu())
    assert [t.name for t in op.inputs] == ["A", "B", "scale", "bias", "residual"]
    assert op.input("residual").shape == op.output.shape
    ok, err = tsl.build(op, "cpu").verify(seed=3)
    assert ok, err


def test_a_dense_with_gelu_and_a_second_bias_names_its_operands_and_matches_numpy():
    op = tsl.ops.dense(37, 70, 53, epilogue=bias() + gelu() + bias())
    assert [t.name for t in op.inputs] == ["A", "B", "bias", "bias2"]
    ok, err = tsl.build(op, "cpu").verify(seed=4)
    assert ok, err


def test_gelu_is_the_exact_erf_form():
    op = tsl.ops.matmul(4, 5, 3, epilogue=gelu())
    a, b = op.random_inputs(1)
    c = a.astype(np.float64) @ b.astype(np.float64)
    from scipy.special import erf

    want = 0.5 * c * (1 + erf(c / np.sqrt(2)))
    np.testing.assert_allclose(op.reference(a, b), want, rtol=1e-5)


def test_an_int8_residual_added_before_the_requantize_is_exact():
    op = tsl.ops.matmul(33, 40, 70, dtype="int8", epilogue=residual() + requantize(6))
    assert op.input("residual").dtype == "int8"
    ok, err = tsl.build(op, "cpu").verify(seed=5)
    assert ok and err == 0


@pytest.mark.parametrize("step", [gelu(), silu(), scale()])
def test_float_only_steps_are_refused_on_an_int_accumulator(step):
    with pytest.raises(ScheduleError, match="floating-point accumulator"):
        tsl.ops.matmul(16, 16, 16, dtype="int8", epilogue=step)


def test_the_tpu_refuses_a_residual_and_names_what_it_runs():
    op = tsl.ops.matmul(128, 128, 128, dtype="bfloat16", epilogue=bias() + residual())
    with pytest.raises(ScheduleError, match="residual"):
        tsl.build(op, "tpu-v5e")


def test_vta_refuses_a_repeated_bias():
    op = tsl.ops.matmul(16, 16, 16, dtype="int8", epilogue=bias() + relu() + bias())
    with pytest.raises(ScheduleError, match="repeated operand"):
        tsl.build(op, "vta")
