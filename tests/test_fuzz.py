"""Differential fuzzer: random operators built for every back end that runs here, against NumPy.

Each example draws an operator (matmul / dense / batch_matmul / conv2d with random small shapes,
strides, padding, dilation and layout), an epilogue composed in random order (bias, relu,
shift, clip, a final requantize, as the dtype allows), a dtype of the target, and a value for
every knob of the schedule from the schedule's own knob space. Then either building raises a
typed `TSLError`, or the artifact runs and equals the NumPy reference (exactly for integers,
within the operator's tolerance for floats). A run that raises anything, or any untyped error,
is a failure: a program that builds must run.

The back ends: CPU (when the host has a machine file for it), the VTA simulator, TPU through
XLA's CPU client (`tpu-v5e`) and Tensor Cores through the CPU emulator of
`tests/wmma_emulator.py` (needs g++). CI runs a few examples per back end; a long run is one
command, e.g. ``TSL_FUZZ_EXAMPLES=2000 pytest -q tests/test_fuzz.py -k vta``. The examples
each test ran, and the typed errors they met, are printed with ``-s``; ``TSL_FUZZ_LOG=file``
appends one line per example (operator, knobs, outcome).
"""

import collections
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tsl
from tsl import ops
from tsl.errors import BackendUnavailable, TSLError
from tsl.ops.epilogue import as_epilogue

import wmma_emulator

# target -> (dtypes it computes, examples in CI)
TARGETS = {
    "cpu": (("float32", "int8"), 12),
    "vta": (("int8",), 12),
    "tpu-v5e": (("bfloat16", "int8"), 8),
    "tensorcore-sm80": (("float16", "bfloat16", "int8"), 2),
}
LONG = int(os.environ.get("TSL_FUZZ_EXAMPLES", "0"))
SEEN = collections.defaultdict(collections.Counter)  # target -> outcome -> count
FAILED = collections.defaultdict(list)  # target -> failures a long run went on after


@st.composite
def operators(draw, target: str):
    dtypes, _ = TARGETS[target]
    dtype = draw(st.sampled_from(dtypes))
    integer = dtype == "int8"
    steps = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["bias", "relu", "clip"] + (["shift"] if integer else [])))
        if kind == "bias":
            steps.append(ops.bias())
        elif kind == "relu":
            steps.append(ops.relu())
        elif kind == "shift":
            steps.append(ops.shift(draw(st.integers(-3, 12))))
        else:  # lo <= 0 < hi: clips compose without folding the output to a constant
            if integer:
                steps.append(ops.clip(draw(st.integers(-3000, 0)), draw(st.integers(1, 3000))))
            else:
                steps.append(ops.clip(draw(st.floats(-50, 0)), draw(st.floats(0.5, 50))))
    # VTA stores int8 only: an integer epilogue there always ends with requantize.
    if integer and (target == "vta" or draw(st.booleans())):
        lo = draw(st.integers(-128, 126))
        steps.append(ops.requantize(draw(st.integers(0, 12)), bias=draw(st.booleans()),
                                    clip=(lo, draw(st.integers(lo + 1, 127)))))
    epilogue = as_epilogue(steps)
    kind = draw(st.sampled_from(["matmul", "dense", "batch_matmul", "conv2d"]))
    dim = st.integers(1, 72)
    if kind == "matmul":
        return ops.matmul(draw(dim), draw(dim), draw(dim), dtype=dtype, epilogue=epilogue,
                          transpose_b=draw(st.booleans()))
    if kind == "dense":
        return ops.dense(draw(dim), draw(dim), draw(dim), dtype=dtype, epilogue=epilogue)
    if kind == "batch_matmul":
        return ops.batch_matmul(draw(st.integers(1, 3)), draw(dim), draw(dim), draw(dim),
                                dtype=dtype, epilogue=epilogue)
    r, s = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dilation, padding = draw(st.integers(1, 2)), draw(st.integers(0, 2))
    lo_h = max(1, dilation * (r - 1) + 1 - 2 * padding)
    lo_w = max(1, dilation * (s - 1) + 1 - 2 * padding)
    return ops.conv2d(draw(st.integers(1, 2)), draw(st.integers(1, 40)),
                      draw(st.integers(lo_h, 14)), draw(st.integers(lo_w, 14)),
                      draw(st.integers(1, 40)), r, s, stride=draw(st.integers(1, 3)),
                      padding=padding, dilation=dilation,
                      layout=draw(st.sampled_from(["NCHW", "NHWC"])), dtype=dtype,
                      epilogue=epilogue)


def knob_values(draw, op, target: str) -> dict:
    """For each knob in the order the schedule declares them, its default or a value drawn
    from its choices, which may depend on the knobs before it (the schedule is recorded again
    after each pick)."""
    knobs = {}
    space = tsl.schedule(op, target).space
    for name in list(space):
        if draw(st.booleans()):
            knobs[name] = draw(st.sampled_from(space[name]))
            space = tsl.schedule(op, target, knobs=knobs).space
    return knobs


def _log(target, outcome, op, knobs):
    """With TSL_FUZZ_LOG=path, one line per example (for long runs)."""
    if os.environ.get("TSL_FUZZ_LOG"):
        with open(os.environ["TSL_FUZZ_LOG"], "a") as f:
            f.write(f"{target}\t{outcome}\t{op} {op.params} {op.epilogue}\t{knobs}\n")


def check(target: str, data) -> None:
    op = data.draw(operators(target), label="op")
    knobs = None
    try:
        knobs = knob_values(data.draw, op, target)
        art = tsl.build(op, target, knobs=knobs)
    except BackendUnavailable as e:
        pytest.skip(f"{target}: {e}")
    except TSLError as e:
        SEEN[target][f"{type(e).__name__}: {str(e)[:90]}"] += 1
        _log(target, f"{type(e).__name__}: {e}", op, knobs)
        return
    seed = data.draw(st.integers(0, 1000), label="seed")
    try:
        if target.startswith("tensorcore"):
            ok, err = wmma_emulator.verify(art, seed=seed)
        else:
            ok, err = art.verify(seed=seed)
        verdict = None if ok else f"wrong answer (error {err}, seed {seed})"
    except Exception as e:  # noqa: BLE001 - a program that built must run
        if not LONG:
            raise
        verdict = f"run raised {type(e).__name__}: {str(e)[:300]}"
    SEEN[target]["verified" if verdict is None else "FAILED"] += 1
    _log(target, verdict or f"verified err={err}", op, knobs)
    if verdict and LONG:  # a long run goes on, and fails at the end (see test_fuzz)
        FAILED[target].append(f"{op} {op.params} {op.epilogue} knobs {knobs}: {verdict}")
        return
    assert verdict is None, f"{op} on {target} with knobs {knobs}: {verdict}"


SETTINGS = dict(deadline=None, derandomize=not LONG, database=None,
                suppress_health_check=list(HealthCheck))


def _case(target: str):
    @settings(max_examples=LONG or TARGETS[target][1], **SETTINGS)
    @given(data=st.data())
    def run(data):
        check(target, data)

    return run


def _fuzz(target):
    _case(target)()
    print(f"\n{target}: {dict(SEEN[target])}")
    assert not FAILED[target], "\n".join(FAILED[target])


@pytest.mark.parametrize("target", [t for t in TARGETS if not t.startswith("tensorcore")])
def test_fuzz(target):
    _fuzz(target)


@pytest.mark.skipif(not wmma_emulator.available(), reason="g++ not found (the Tensor Core "
                                                          "emulator compiles kernels with it)")
def test_fuzz_tensorcore_emulated():
    _fuzz("tensorcore-sm80")


ORDERS = [ops.relu() + ops.bias() + ops.requantize(4),
          ops.shift(3) + ops.bias() + ops.clip(-60, 50) + ops.requantize(1)]


@pytest.mark.parametrize("target", list(TARGETS))
def test_epilogue_order_on_every_back_end(target):
    """Two compositions whose result depends on the order of their steps (relu before the
    bias; a shift before the bias) run in the composed order on each back end (issue #9)."""
    if target.startswith("tensorcore") and not wmma_emulator.available():
        pytest.skip("g++ not found (the Tensor Core emulator compiles kernels with it)")
    for ep in ORDERS:
        op = ops.dense(16, 64, 32, dtype="int8", epilogue=ep)
        try:
            art = tsl.build(op, target)
        except BackendUnavailable as e:
            pytest.skip(f"{target}: {e}")
        verify = (wmma_emulator.verify if target.startswith("tensorcore")
                  else lambda a, seed: a.verify(seed=seed))
        ok, err = verify(art, seed=2)
        assert ok, f"{op} on {target}: error {err}"
