"""Random knob values either build and verify or raise ScheduleError: never a wrong answer.

Values are drawn from each schedule's own knob space (what `tsl.tune` searches), plus values
outside it, which must be refused."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tsl
from tsl import ops
from tsl.errors import ScheduleError

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def attempt(op, picks):
    space = tsl.schedule(op, "cpu").space
    knobs = {name: (choices[picks[n] % len(choices)] if picks[n] >= 0 else 1000)
             for n, (name, choices) in enumerate(sorted(space.items()))}
    try:
        art = tsl.build(op, "cpu", knobs=knobs)
    except ScheduleError:
        return
    ok, err = art.verify(seed=11)
    assert ok, f"{op} with {knobs}: wrong answer (error {err})"


PICKS = st.lists(st.integers(-1, 20), min_size=8, max_size=8)


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
