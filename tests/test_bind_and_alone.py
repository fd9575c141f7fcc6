"""`art.bind` (constant operands packed once), the user-level time a CPU row reports, and
`tsl.bench.alone` (a peer timed in a fresh process). No timed assertions: the host is shared."""

import numpy as np
import pytest

import tsl
from tsl import ops
from tsl.bench import alone
from tsl.errors import InputError


@pytest.mark.parametrize("op", [
    ops.dense(17, 70, 40, dtype="float32", epilogue=ops.bias() + ops.relu()),
    ops.dense(17, 70, 40, dtype="int8", epilogue=ops.requantize(shift=6, bias=True,
                                                                clip=(0, 127))),
    ops.conv2d(1, 5, 9, 9, 7, 3, 3, padding=1),
], ids=["dense-f32", "dense-int8", "conv2d"])
def test_bind_matches_run_and_reference(op):
    art = tsl.build(op, "cpu")
    xs = op.random_inputs(3)
    names = art.constants()
    assert "A" not in names and names  # the weight (and bias) bound, the activation not
    consts = {t.name: x for t, x in zip(op.inputs, xs) if t.name in names}
    free = [x for t, x in zip(op.inputs, xs) if t.name not in names]
    f = art.bind(**consts)
    y = f(*free)
    np.testing.assert_array_equal(y, art.run(*xs))
    assert op.check(y, op.reference(*xs))[0]
    # A second activation through the same bound weights.
    xs2 = op.random_inputs(4)
    free2 = [x for t, x in zip(op.inputs, xs2) if t.name not in names]
    assert op.check(f(*free2), op.reference(*[x if t.name not in names else consts[t.name]
                                               for t, x in zip(op.inputs, xs2)]))[0]


def _split(art, xs):
    names = art.constants()
    return ({t.name: x for t, x in zip(art.op.inputs, xs) if t.name in names},
            [x for t, x in zip(art.op.inputs, xs) if t.name not in names])


@pytest.mark.parametrize("op", [
    ops.dense(17, 70, 40, dtype="float32", epilogue=ops.bias() + ops.relu()),
    ops.dense(17, 70, 40, dtype="int8", epilogue=ops.requantize(shift=6, bias=True,
                                                                clip=(0, 127))),
    ops.conv2d(1, 5, 9, 9, 7, 3, 3, padding=1),
    ops.matmul(19, 33, 21, dtype="int8"),
    ops.dense(16, 64, 64, dtype="float32"),
], ids=["dense-f32", "dense-int8", "conv2d", "matmul-int8", "dense-aligned"])
def test_resident_inputs_reuse_buffers_across_calls(op):
    """Resident tensors in, `out=` out, twice through the same buffers with different data:
    each answer is its own inputs' (shapes off the primitive: the padding border must stay
    zero), and the NumPy path's returned array does not alias the next call's output."""
    import tvm

    art = tsl.build(op, "cpu")
    xs1, xs2 = op.random_inputs(5), op.random_inputs(6)
    consts, free1 = _split(art, xs1)
    free2 = _split(art, xs2)[1]
    f = art.bind(**consts)
    assert f.resident is not None
    ref = [op.reference(*[consts.get(t.name, x) for t, x in zip(op.inputs, xs)])
           for xs in (xs1, xs2)]
    out = tvm.runtime.empty(op.output.shape, op.output.dtype, tvm.cpu(0))
    for free, want in zip((free1, free2, free1), ref + ref[:1]):
        got = f(*[art.device_tensor(x) for x in free], out=out)
        assert got is out and op.check(out.numpy(), want)[0]
    y1 = f(*free1)
    y2 = f(*free2)
    assert op.check(y1, ref[0])[0] and op.check(y2, ref[1])[0]
    with pytest.raises(InputError, match="out= must be"):
        f(*free1, out=tvm.runtime.empty((2, 2), op.output.dtype, tvm.cpu(0)))


def test_bind_errors_name_the_input():
    op = ops.dense(8, 16, 16)
    art = tsl.build(op, "cpu")
    with pytest.raises(InputError, match="no input named W"):
        art.bind(W=np.ones((16, 16), np.float32))
    w, bias = op.random_inputs(0)[1:]
    f = art.bind(B=w, bias=bias)
    with pytest.raises(InputError, match="must have shape"):
        f(np.ones((3, 3), np.float32))


def test_user_time_reports_its_parts():
    op = ops.conv2d(1, 8, 10, 10, 8, 3, 3, padding=1)
    art = tsl.build(op, "cpu")
    row = art.user_time(op.random_inputs(1), repeat=3)
    assert row["bound_inputs"] == ["B"] and len(row["user_samples"]) == 3
    assert row["user_seconds"] > 0 and row["weight_prep_seconds"] > 0 and row["resident"]


def test_time_alone_returns_a_rate_from_a_fresh_process():
    t = alone.time_alone("numpy gemm", {"gemm": [1, 32, 32, 32], "work": 2 * 32 ** 3}, cores=1,
                         repeat=3, settle=0)
    assert t.seconds > 0 and len(t.samples) == 3 and t.rate == pytest.approx(
        2 * 32 ** 3 / t.seconds)
    assert t.info["blas"] is None or "threads" in t.info["blas"]


@pytest.mark.parametrize("op", [ops.dense(5, 48, 32, epilogue=ops.bias() + ops.relu()),
                                ops.batch_matmul(3, 7, 9, 16),
                                ops.batch_matmul(2, 5, 6, 16, transpose_b=True)],
                         ids=["dense", "batch_matmul", "batch_matmul_bt"])
def test_onnxruntime_peer_runs_the_operator_with_dynamic_rows(op):
    pytest.importorskip("onnxruntime", reason="ONNX Runtime is an optional peer")
    from tsl.backends.cpu import peers

    sp = peers.spec(op)
    assert "onnxruntime f32" in peers.makers(sp)
    (y,) = peers.onnxruntime_gemm(sp)()
    b, m, n, k = sp["gemm"]
    lead = (b,) if op.name == "batch_matmul" else ()
    rng = np.random.default_rng(0)  # the maker's draws, in its order
    x = rng.standard_normal((*lead, m, k), dtype=np.float32)
    w = rng.standard_normal((*lead, k, n), dtype=np.float32)
    want = x @ w
    if sp["bias"]:
        want = want + rng.standard_normal(n, dtype=np.float32)
    if sp["relu"]:
        want = np.maximum(want, 0)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_time_alone_unknown_kind_is_an_input_error():
    with pytest.raises(InputError, match="unknown peer kind"):
        alone.time_alone("no such peer", {}, cores=1)


def test_models_bench_interleaves_fresh_processes(monkeypatch):
    """`--models` runs each party in REPEATS fresh processes, interleaved (each repeat rotated
    by one party), and a row takes the median of the runs' medians, its spread, the compile
    time of the run that compiled, and each peer's ratio to tsl as the median of the ratios
    within a repeat (not the ratio of the medians)."""
    from tsl.bench import imported

    rng = np.random.default_rng(7)
    drawn = list(rng.uniform(0.01, 0.06, size=4 * imported.REPEATS))
    calls, seconds = [], iter(drawn)

    def party(p, name, fe, work, rounds, profile):
        calls.append((p, fe, profile))
        info = {"seconds": next(seconds), "output": np.ones(2)}
        if p == "tsl" and sum(c[:2] == (p, fe) for c in calls) == 1:
            info["compile_s"] = 5.0
        return info

    monkeypatch.setattr(imported, "_run_party", party)
    runs = imported._repeated("encoder", ("torch", "onnx"), None, 20, True)
    order = [c[:2] for c in calls]
    parties = imported._parties(("torch", "onnx"))
    assert order[:4] == parties and order[4:8] == parties[1:] + parties[:1]
    assert all(order.count(p) == imported.REPEATS for p in parties)
    assert [c for c in calls if c[2]] == [("tsl", "torch", True), ("tsl", "onnx", True)]
    mine = {p: [s for q, s in zip(order, drawn) if q == p] for p in parties}
    torch_runs = sorted(mine[("torch", "torch")])
    assert runs[("torch", "torch")]["seconds"] == pytest.approx(np.median(torch_runs))
    assert runs[("torch", "torch")]["spread"] == pytest.approx(
        (torch_runs[-1] - torch_runs[0]) / np.median(torch_runs))
    assert runs[("tsl", "onnx")]["compile_s"] == 5.0
    ort, tsl_ = runs[("ort", "torch")], runs[("tsl", "onnx")]
    assert imported._paired(ort, tsl_) == pytest.approx(np.median(
        [o / t for o, t in zip(mine[("ort", "torch")], mine[("tsl", "onnx")])]))
    # the host slows 2x and 3x over the repeats for both parties, and tsl's second run meets a
    # burst of its own: the paired ratio keeps the 1.25 of the other two repeats, where the
    # ratio of the medians (2.0 / 2.4) would read tsl slower than the peer
    drift = {"runs": [1.0, 2.0, 3.0]}, {"runs": [0.8, 3.2, 2.4]}
    assert imported._paired(*drift) == pytest.approx(1.25)
    failed = imported._merged([{"seconds": 1.0}, {"error": "boom"}])
    assert failed == {"error": "boom"}
