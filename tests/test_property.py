"""Random knob values either build and verify or raise ScheduleError: never a wrong answer.

Values are drawn from each schedule's own knob space (what `tsl.tune` searches), plus values
outside it, which must be refused."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tsl
from tsl import ops
from tsl.errors import ScheduleError, TAMError

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def attempt(op, picks):
    space = tsl.schedule(op, "cpu").space
    assert len(space) <= len(picks), f"PICKS draws {len(picks)} values for {len(space)} knobs"
    knobs = {name: (choices[picks[n] % len(choices)] if picks[n] >= 0 else 1000)
             for n, (name, choices) in enumerate(sorted(space.items()))}
    try:
        art = tsl.build(op, "cpu", knobs=knobs)
    except ScheduleError:
        return
    ok, err = art.verify(seed=11)
    assert ok, f"{op} with {knobs}: wrong answer (error {err})"


PICKS = st.lists(st.integers(-1, 20), min_size=12, max_size=12)  # one per knob, at most


@settings(max_examples=14, **SETTINGS)
@given(picks=PICKS, dtype=st.sampled_from(["float32", "int8"]),
       m=st.integers(1, 70), n=st.integers(1, 70), k=st.integers(1, 70))
def test_gemm_knobs(picks, dtype, m, n, k):
    attempt(ops.matmul(m, n, k, dtype=dtype), picks)


@settings(max_examples=6, **SETTINGS)
@given(picks=PICKS, layout=st.sampled_from(["NCHW", "NHWC"]), stride=st.sampled_from([1, 2]),
       dtype=st.sampled_from(["float32", "int8"]))
def test_conv_knobs(picks, layout, stride, dtype):
    attempt(ops.conv2d(1, 8, 9, 9, 20, 3, 3, stride=stride, padding=1, layout=layout,
                       dtype=dtype), picks)


KNOB_NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10)


@settings(max_examples=25, **SETTINGS)
@given(name=KNOB_NAME, target=st.sampled_from(["cpu", "vta", "tpu-v5e", "tensorcore-sm80"]),
       misspell=st.booleans())
def test_unknown_knob_names_are_refused(name, target, misspell):
    """A knob the schedule does not declare (a typo such as m_innr) is a ScheduleError that
    lists the schedule's knobs, never a silent build with the default."""
    dtype = {"vta": "int8", "tpu-v5e": "bfloat16", "tensorcore-sm80": "float16"}.get(target,
                                                                                       "float32")
    ep = tsl.ops.requantize(3) if dtype == "int8" else None
    op = ops.matmul(32, 48, 64, dtype=dtype, epilogue=ep)
    space = tsl.schedule(op, target).space
    if misspell:
        name = sorted(space)[len(name) % len(space)][:-1]  # drop the last letter: m_inne
    if name in space:
        return
    with pytest.raises(ScheduleError, match=r"not knobs of this schedule.*its knobs are") as e:
        tsl.schedule(op, target, knobs={name: 2})
    assert all(k in str(e.value) for k in space)


@pytest.mark.parametrize("call, match", [
    (lambda s: s.tensorize(s.loops[-1], "nosuch"), r"has no tensor primitive of that name; "
                                                   r"it has \['gemm_1x16x16'\]"),
    (lambda s: s.role_of("nosuch"), "no such axis"),
    (lambda s: s.pack("A", "nosuch"), "the only layout is 'primitive'"),
], ids=["tensorize", "role_of", "pack"])
def test_schedule_misuse_is_a_schedule_error(call, match):
    op = ops.matmul(32, 32, 32, dtype="int8", epilogue=ops.requantize(4))
    with pytest.raises(ScheduleError, match=match):
        tsl.schedule(op, "vta", schedule=call)


def test_bad_arguments_are_typed_errors(tmp_path):
    op = ops.matmul(32, 32, 32, dtype="int8", epilogue=ops.requantize(4))
    with pytest.raises(ScheduleError, match="knobs must be a dict"):
        tsl.schedule(op, "vta", knobs=[("m_inner", 2)])
    with pytest.raises(TAMError, match="no such machine file"):
        tsl.load_machine(str(tmp_path))
    with pytest.raises(TAMError, match="a machine is a built-in name"):
        tsl.build(op, 3)
    m = tsl.load_machine("vta-1x16x16")
    with pytest.raises(TAMError, match=r"no memory level 'l9'; it has \['dram'"):
        m.memory_level("l9")
    with pytest.raises(TAMError, match="no tensor primitive 'x'"):
        m.primitive_named("x")
    with pytest.raises(ScheduleError, match=r"shift\(3\) needs an integer accumulator"):
        ops.matmul(8, 8, 8, dtype="float32", epilogue=ops.requantize(3))
    with pytest.raises(ScheduleError, match=r"shift\(40\)"):
        ops.shift(40)
    with pytest.raises(ScheduleError, match="needs lo <= hi"):
        ops.clip(3, 1)
