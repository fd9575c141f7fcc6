"""A schedule written out (`Schedule.to_json`) and replayed (`tsl.Schedule.replay`) builds the
same program on every back end: its loops travel by name, its knob values with it."""

import json

import pytest

import tsl
from tsl import ops
from tsl.backend import get_backend

BF16 = dict(dtype="bfloat16", acc_dtype="float32")


def without_locations(mlir: str) -> str:
    """StableHLO text without its `#loc` table: the Python call sites jax traced from."""
    return "\n".join(line for line in mlir.splitlines() if not line.startswith("#loc"))


# (target, operator with a ragged shape, the artifact's program text)
CASES = [
    ("cpu", lambda: ops.matmul(37, 50, 64, dtype="float32"), lambda a: a.source("asm")),
    ("vta", lambda: ops.dense(16, 72, 40, dtype="int8", epilogue=ops.requantize(8)),
     lambda a: str(a.program())),
    ("tpu", lambda: ops.matmul(200, 136, 264, **BF16), lambda a: without_locations(a.source())),
    # sm_80: the schedule's own lowering (on sm_90 the default fp16 GEMM is the wgmma kernel)
    ("tensorcore-sm80", lambda: ops.matmul(200, 136, 264, dtype="float16"),
     lambda a: a.source()),
]


@pytest.mark.parametrize("target,make,program", CASES, ids=[c[0] for c in CASES])
def test_a_replayed_schedule_builds_the_same_program(target, make, program):
    op = make()
    s = tsl.schedule(op, target)
    text = s.to_json()
    json.loads(text)  # plain JSON: no live Loop in it
    again = tsl.Schedule.replay(text, op, s.machine)
    assert str(again) == str(s) and again.knob_values == s.knob_values
    be = get_backend(s.machine.backend)
    first, second = be.build(s), be.build(again)
    assert program(second) == program(first)
    if target in ("cpu", "vta"):  # what runs here is checked against NumPy too
        assert second.verify()[0]


def test_replay_refuses_another_operator():
    op = ops.matmul(37, 50, 64, dtype="float32")
    text = tsl.schedule(op, "cpu").to_json()
    with pytest.raises(tsl.ScheduleError, match="recorded for"):
        tsl.Schedule.replay(text, ops.matmul(38, 50, 64, dtype="float32"),
                            tsl.schedule(op, "cpu").machine)
