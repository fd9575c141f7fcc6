"""VTA pieces for whole networks: the residual epilogue step (a ResNet skip connection) runs on
VTA as LOAD ACC_8BIT of the int8 residual tile + ALU ADD before the requantize, bit-exact with
NumPy, in the project's programs and in the classic baseline's."""

import numpy as np
import pytest

import tsl
from tsl.backends.vta import classic
from tsl.backends.vta.isa import Alu, AluOp, Load, Mem
from tsl.ops import bias, relu, requantize, residual


def check(art, seed=3):
    xs = art.op.random_inputs(seed)
    res = xs[[t.name for t in art.op.inputs].index("residual")]
    assert res.dtype == np.int8 and np.any(res < 0) and np.any(res > 0)
    np.testing.assert_array_equal(art.run(*xs), art.op.reference(*xs))
    return xs


@pytest.mark.parametrize("op", [
    tsl.ops.conv2d(1, 32, 10, 10, 48, 3, 3, padding=1, dtype="int8",
                   epilogue=bias() + residual() + requantize(8, clip=(0, 127))),
    tsl.ops.conv2d(1, 24, 8, 8, 40, 1, 1, stride=2, dtype="int8",
                   epilogue=residual() + relu() + requantize(4)),       # 40: not a multiple of 16
    tsl.ops.matmul(33, 40, 50, dtype="int8", epilogue=residual() + requantize(6)),
], ids=str)
def test_a_residual_step_runs_on_the_alu_bit_exact(op):
    art = tsl.build(op, "vta")
    check(art)
    insns = art.program().insns
    loads = [i for i in insns if isinstance(i, Load) and i.mem == Mem.ACC_8BIT]
    adds = [i for i in insns if isinstance(i, Alu) and i.alu_op == AluOp.ADD and not i.use_imm]
    assert loads and adds, "the residual is loaded into ACC and added there, not on the host"


def test_the_residual_is_added_before_the_shift_so_the_order_matters():
    """residual + requantize and requantize-then-add differ: the program follows the steps."""
    op = tsl.ops.conv2d(1, 16, 6, 6, 16, 3, 3, padding=1, dtype="int8",
                        epilogue=residual() + requantize(6))
    art = tsl.build(op, "vta")
    x, w, r = check(art, seed=7)
    acc = tsl.ops.conv2d(1, 16, 6, 6, 16, 3, 3, padding=1, dtype="int8").reference(x, w)
    after = np.clip((acc >> 6) + r.astype(np.int32), -128, 127).astype(np.int8)
    assert not np.array_equal(art.run(x, w, r), after)


def test_a_resnet_layer_with_a_residual_in_the_classic_tiles_and_the_default():
    op = tsl.ops.conv2d(1, 512, 7, 7, 512, 3, 3, padding=1, dtype="int8",
                        epilogue=bias() + residual() + requantize(8, clip=(0, 127)))
    art = tsl.build(op, "vta")
    base = classic.build(op, art.machine)
    check(art)
    check(base)
    assert base.estimate().cycles > art.estimate().cycles > 0
