"""schedule_rest's vector rules: scheduled functions compute what the unscheduled ones do."""

import numpy as np
import pytest

from tsl.relax.schedule_rest import schedule_rest
from tsl.schedules.vector import VectorFacts


def _vector_scheduled(mod):
    """The target and `mod` through the Relax pipeline's stages up to fusion and tsl's vector
    rules: its functions as the pipeline schedules them, before lowering."""
    import tvm

    import tsl.relax

    tgt = tsl.relax.tvm_target("cpu")
    with tgt:
        return tgt, tvm.transform.Sequential(tsl.relax._stages(tgt)[0]
                                             + tsl.relax._vector_pass("cpu", tgt))(mod)


def _add_relu_mod():
    from tvm.script import ir as I
    from tvm.script import tirx as T

    @I.ir_module
    class Mod:
        @T.prim_func(s_tir=True)
        def main(a: T.Buffer((7, 37), "float32"), b: T.Buffer((37,), "float32"),
                 c: T.Buffer((7, 37), "float32")):
            for i, j in T.grid(7, 37):
                with T.sblock("c"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    c[vi, vj] = T.max(a[vi, vj] + b[vj], T.float32(0))
    return Mod


def test_injective_rule_parallel_vectorized_and_correct():
    import tvm

    left = []
    mod = schedule_rest(VectorFacts(vector_bits=512, cores=2), left)(_add_relu_mod())
    assert not left and "tsl.vector" in mod["main"].attrs
    text = mod["main"].script()
    assert "T.parallel" in text and "T.vectorized" in text
    lib = tvm.compile(mod, target="llvm")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((7, 37)).astype("float32")
    b = rng.standard_normal(37).astype("float32")
    c = tvm.runtime.tensor(np.empty((7, 37), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    np.testing.assert_allclose(c.numpy(), np.maximum(a + b, 0), rtol=1e-6)


def _padded_pack_mod():
    """(3, 8, n) packed into (3, ceil(n / 32), 8, 32) panels, the columns past n zero: the
    swap's pack of a GEMM's B whose columns are a run-time length (the attention scores')."""
    from tvm.script import ir as I
    from tvm.script import tirx as T

    @I.ir_module
    class Mod:
        @T.prim_func(s_tir=True)
        def main(x: T.handle, p: T.handle):
            n = T.int64()
            a = T.match_buffer(x, (T.int64(3), T.int64(8), n), "float32")
            b = T.match_buffer(p, (T.int64(3), (n + T.int64(31)) // T.int64(32), T.int64(8),
                                   T.int64(32)), "float32")
            for i0, i1, i2, i3 in T.grid(T.int64(3), (n + T.int64(31)) // T.int64(32),
                                         T.int64(8), T.int64(32)):
                with T.sblock("pack"):
                    v0, v1, v2, v3 = T.axis.remap("SSSS", [i0, i1, i2, i3])
                    b[v0, v1, v2, v3] = T.if_then_else(
                        v1 * T.int64(32) + v3 < n,
                        a[v0, v2, T.min(v1 * T.int64(32) + v3, n - T.int64(1))], T.float32(0))
    return Mod


@pytest.mark.parametrize("cpu", [None, "x86-avx2"])
def test_pack_padded_along_a_symbolic_extent_peels_its_last_panel_and_is_correct(cpu, monkeypatch):
    """Every panel but the last is whole: TVM's LoopPartition (hinted on the symbolic loop, the
    static batch loop parallel) drops the check and the clamp there; right at lengths under, at
    and over the panel."""
    import tvm

    import tsl.relax

    if cpu:
        monkeypatch.setenv("TSL_CPU", cpu)
    from tsl.relax.schedule_rest import _facts

    mod = schedule_rest(_facts("cpu"))(_padded_pack_mod())
    text = mod["main"].script()
    assert "pragma_loop_partition_hint" in text and "T.parallel(T.int64(3))" in text, text
    lib = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"))
    for n in (1, 5, 32, 33, 100):
        a = np.random.default_rng(n).standard_normal((3, 8, n)).astype("float32")
        panels = (n + 31) // 32
        want = np.zeros((3, 8, panels * 32), "float32")
        want[:, :, :n] = a
        out = tvm.runtime.tensor(np.full((3, panels, 8, 32), np.nan, "float32"))
        lib["main"](tvm.runtime.tensor(a), out)
        np.testing.assert_array_equal(out.numpy(), want.reshape(3, 8, panels, 32).transpose(0, 2, 1, 3))


def _heads_transpose_mod():
    """(n, 3 * 8) rows into (3, 8, n) heads, the run-time length innermost: the attention's K
    heads taken from the projections' rows, scaled."""
    from tvm.script import ir as I
    from tvm.script import tirx as T

    @I.ir_module
    class Mod:
        @T.prim_func(s_tir=True)
        def main(x: T.handle, y: T.handle):
            n = T.int64()
            a = T.match_buffer(x, (n, T.int64(24)), "float32")
            b = T.match_buffer(y, (T.int64(3), T.int64(8), n), "float32")
            for i0, i1, i2 in T.grid(T.int64(3), T.int64(8), n):
                with T.sblock("heads"):
                    v0, v1, v2 = T.axis.remap("SSS", [i0, i1, i2])
                    b[v0, v1, v2] = a[v2, v0 * T.int64(8) + v1] * T.float32(0.125)
    return Mod


@pytest.mark.parametrize("cpu", [None, "x86-avx2"])
def test_transpose_into_a_symbolic_innermost_extent_is_tiled_in_vectors_and_correct(
        cpu, monkeypatch):
    """The run-time length in vectors (a scalar loop before: 0.12 ms against 0.04 for the BERT
    layer's K heads at s = 128), the static loop before it inside each vector's loop, the heads
    parallel, the last partial vector peeled off; right at lengths under, at and over the
    lanes."""
    import tvm

    import tsl.relax

    if cpu:
        monkeypatch.setenv("TSL_CPU", cpu)
    from tsl.relax.schedule_rest import _facts

    mod = schedule_rest(_facts("cpu"))(_heads_transpose_mod())
    text = mod["main"].script()
    assert ("T.vectorized" in text and "pragma_loop_partition_hint" in text
            and "T.parallel(T.int64(3))" in text), text
    lib = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"))
    for n in (1, 5, 8, 16, 17, 100):
        a = np.random.default_rng(n).standard_normal((n, 24)).astype("float32")
        out = tvm.runtime.tensor(np.full((3, 8, n), np.nan, "float32"))
        lib["main"](tvm.runtime.tensor(a), out)
        np.testing.assert_array_equal(out.numpy(), a.T.reshape(3, 8, n) * np.float32(0.125))


def test_pipeline_vectorizes_relax_glue_and_matches_numpy():
    import tvm
    from tvm import relax
    from tvm.script import ir as I
    from tvm.script import relax as R

    import tsl.relax

    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((5, 19), "float32"), y: R.Tensor((19,), "float32")):
            with R.dataflow():
                z = R.nn.relu(R.add(x, y))
                R.output(z)
            return z

    ex = tvm.compile(Mod, target=tsl.relax.tvm_target("cpu"), relax_pipeline=tsl.relax.pipeline("cpu"))
    tgt, fused = _vector_scheduled(Mod)
    prims = [f for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert prims and all("tsl.vector" in f.attrs for f in prims)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 19)).astype("float32")
    y = rng.standard_normal(19).astype("float32")
    out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy()
    np.testing.assert_allclose(out, np.maximum(x + y, 0), rtol=1e-6)


def test_softmax_taken_rowwise_and_unscheduled_names_the_rest():
    from tvm.script import ir as I
    from tvm.script import relax as R

    from tsl.relax.schedule_rest import unscheduled

    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((4, 33), "float32")):
            with R.dataflow():
                z = R.nn.relu(R.nn.softmax(x, axis=-1))
                R.output(z)
            return z

    assert unscheduled(Mod, "cpu") == []
    # A 1-D reduction has no rows to run in parallel: named, with why.
    @I.ir_module
    class Sum:
        @R.function
        def main(x: R.Tensor((33,), "float32")):
            with R.dataflow():
                z = R.sum(x, axis=0)
                R.output(z)
            return z

    left = unscheduled(Sum, "cpu")
    assert [n for n, _ in left] and all("sum" in n and why for n, why in left)


def test_rowwise_softmax_matches_numpy():
    import tvm
    from tvm import relax
    from tvm.script import ir as I
    from tvm.script import relax as R

    import tsl.relax

    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((6, 45), "float32")):
            with R.dataflow():
                z = R.nn.softmax(x, axis=-1)
                R.output(z)
            return z

    ex = tvm.compile(Mod, target=tsl.relax.tvm_target("cpu"), relax_pipeline=tsl.relax.pipeline("cpu"))
    x = np.random.default_rng(2).standard_normal((6, 45)).astype("float32")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True), rtol=1e-5)


def test_softmax_over_a_symbolic_row_is_vectorized_with_its_tail_peeled_and_correct():
    """A row of run-time length n: vectors of lanes with the partial one peeled off by TVM's
    LoopPartition (no bound check per vector), its max and sum too (lanes partials, their init
    outside the bound check: inside it, rows shorter than the lanes read uninitialized lanes),
    right at lengths under, off and over the lanes."""
    import tvm
    from tvm import relax, tirx
    from tvm.script import ir as I
    from tvm.script import relax as R

    import tsl.relax

    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((3, "n"), "float32")):
            with R.dataflow():
                z = R.nn.softmax(x, axis=-1)
                R.output(z)
            return z

    tgt, fused = _vector_scheduled(Mod)
    f = next(f for gv, f in fused.functions.items()
             if isinstance(f, tirx.PrimFunc) and "softmax" in gv.name_hint)
    assert "T.vectorized" in f.script() and "pragma_loop_partition_hint" in f.script()
    assert f.script().count("_rf_init") == 2 and f.script().count("_rf_update") == 2
    vm = relax.VirtualMachine(tvm.compile(Mod, target=tgt,
                                          relax_pipeline=tsl.relax.pipeline("cpu")), tvm.cpu())
    for n in (1, 3, 5, 16, 17, 37, 100):
        x = np.random.default_rng(n).standard_normal((3, n)).astype("float32")
        e = np.exp(x - x.max(-1, keepdims=True))
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(),
                                   e / e.sum(-1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("cpu", [None, "x86-avx2"])
def test_symbolic_rows_are_computed_row_by_row_in_one_parallel_loop_and_correct(cpu, monkeypatch):
    """Rows of run-time length (a (2, n, n) softmax) and a run-time count of rows (an (n, 40)
    layer norm) scheduled as a static build's: every block row by row under one parallel loop.
    The softmax's max and sum run over whole vectors with the row's end checked in their bodies
    (`tsl.schedules.guarded`: the check of a split would be lost by TVM's `compute_at`, the
    partials then reading past the row); right at lengths under, off and over the lanes."""
    import tvm
    from tvm import relax
    from tvm.script import ir as I
    from tvm.script import relax as R

    import tsl.relax

    if cpu:
        monkeypatch.setenv("TSL_CPU", cpu)

    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((2, "n", "n"), "float32"), y: R.Tensor(("n", 40), "float32"),
                 g: R.Tensor((40,), "float32"), b: R.Tensor((40,), "float32")):
            with R.dataflow():
                r = (R.nn.softmax(x, axis=-1), R.nn.layer_norm(y, g, b, axes=[-1]))
                R.output(r)
            return r

    tgt, fused = _vector_scheduled(Mod)
    for name in ("fast_softmax", "layer_norm"):
        assert fused[name].script().count("T.parallel") == 1, fused[name].script()
    assert fused["fast_softmax"].script().count("T.if_then_else") == 2
    vm = relax.VirtualMachine(tvm.compile(Mod, target=tgt,
                                          relax_pipeline=tsl.relax.pipeline("cpu")), tvm.cpu())
    rng = np.random.default_rng(5)
    g, b = (rng.standard_normal(40).astype("float32") for _ in range(2))
    for n in (1, 5, 17, 100, 128, 333):
        x = rng.standard_normal((2, n, n)).astype("float32") * 4
        y = rng.standard_normal((n, 40)).astype("float32")
        s, t = vm["main"](*(tvm.runtime.tensor(a) for a in (x, y, g, b)))
        e = np.exp(x - x.max(-1, keepdims=True))
        np.testing.assert_allclose(s.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
        mu, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
        np.testing.assert_allclose(t.numpy(), (y - mu) / np.sqrt(var + 1e-5) * g + b,
                                   rtol=1e-4, atol=1e-5)


def test_a_softmax_row_of_bounded_run_time_length_is_on_the_stack_and_correct():
    """The exp row of a softmax over a symbol bounded at 333: sized at the bound, one stack
    array per parallel task (no TVMBackendAllocWorkspace / Free per row), right at lengths
    under, off and at the bound, and an error, not an overrun, past it."""
    import tvm
    from tvm import relax
    from tvm.script import ir as I
    from tvm.script import relax as R

    import tsl.relax

    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((2, "n", "n"), "float32")):
            R.func_attr({"tir_var_upper_bound": {"n": 333}})
            with R.dataflow():
                z = R.nn.softmax(x, axis=-1)
                R.output(z)
            return z

    ex = tvm.compile(Mod, target=tsl.relax.tvm_target("cpu"),
                     relax_pipeline=tsl.relax.pipeline("cpu"),
                     tir_pipeline=tsl.relax.tir_pipeline("cpu"))
    ll = "".join(m.inspect_source("ll") for m in ex.mod.imports)
    assert "TVMBackendAllocWorkspace" not in ll and "alloca [333 x float]" in ll
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(3)
    for n in (1, 5, 17, 100, 333):
        x = rng.standard_normal((2, n, n)).astype("float32") * 4
        e = np.exp(x - x.max(-1, keepdims=True))
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(),
                                   e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    with pytest.raises(Exception, match="over its upper bound"):
        vm["main"](tvm.runtime.tensor(np.ones((2, 334, 334), "float32")))


def test_reductions_along_the_contiguous_axis_vectorized_in_lanes_and_correct():
    import tvm
    from tvm import relax
    from tvm.script import ir as I
    from tvm.script import relax as R

    import tsl.relax

    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((7, 64), "float32"), g: R.Tensor((64,), "float32"),
                 b: R.Tensor((64,), "float32")):
            with R.dataflow():
                s = R.nn.softmax(x, axis=-1)
                n = R.nn.layer_norm(x, g, b, axes=[-1])
                r = (s, n)
                R.output(r)
            return r

    tgt, fused = _vector_scheduled(Mod)
    text = fused["fast_softmax"].script()   # exp is TVM's polynomial fast_exp: it vectorizes
    assert "_rf" in text and "T.exp" not in text   # the max and sum run in vector partial sums
    # every block inside one parallel loop over the rows (a row's intermediates stay in L1)
    for name in ("fast_softmax", "layer_norm"):
        assert fused[name].script().count("T.parallel") == 1, fused[name].script()
    ex = tvm.compile(Mod, target=tgt, relax_pipeline=tsl.relax.pipeline("cpu"))
    rng = np.random.default_rng(3)
    x, g, b = (rng.standard_normal(s).astype("float32") for s in [(7, 64), (64,), (64,)])
    s, n = relax.VirtualMachine(ex, tvm.cpu())["main"](*(tvm.runtime.tensor(a) for a in (x, g, b)))
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(s.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(n.numpy(), (x - mu) / np.sqrt(var + 1e-5) * g + b, rtol=1e-4, atol=1e-5)


def _window_module(op: str, stride: int, channels: int = 19, size: int = 21, width=None):
    from tvm import relax
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, size, width or size), "float32"))
    w = relax.Var("w", relax.TensorType((channels, 1, 3, 3), "float32"))
    b = relax.Var("b", relax.TensorType((1, channels, 1, 1), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            if op == "depthwise":
                y = bb.emit(R.nn.conv2d(x, w, strides=stride, padding=1, groups=channels))
                y = bb.emit(R.clip(R.add(y, b), 0, 6))
            elif op == "maxpool":
                y = bb.emit(R.nn.max_pool2d(x, pool_size=3, strides=stride, padding=1))
            else:
                y = bb.emit(R.nn.avg_pool2d(x, pool_size=3, strides=stride, padding=1))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _torch_window(op, stride, x, w, b):
    import torch

    t = torch.from_numpy
    if op == "depthwise":
        y = torch.nn.functional.conv2d(t(x), t(w), stride=stride, padding=1, groups=x.shape[1])
        return torch.clamp(y + t(b), 0, 6).numpy()
    if op == "maxpool":
        return torch.nn.functional.max_pool2d(t(x), 3, stride, 1).numpy()
    return torch.nn.functional.avg_pool2d(t(x), 3, stride, 1, count_include_pad=False).numpy()


@pytest.mark.parametrize("op", ["depthwise", "maxpool", "avgpool"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("size", [21, 37, 67])
def test_window_rule_takes_depthwise_and_pooling_and_matches_pytorch(op, stride, size):
    """19 channels, 21 x 21 (on 16 lanes a row in one vector and a predicated rest), 37 x 37
    (vectors of 16, the last one predicated) and 67 x 67 (on a host of up to 4 cores, 67 or 34
    output rows cut in bands, the last band shorter), stride 1 and 2 (odd padded widths: the phase split pads a column),
    padding 1."""
    pytest.importorskip("torch", reason="the reference is PyTorch's conv2d / pooling")
    import tvm
    from tvm import relax

    import tsl.relax

    mod = _window_module(op, stride, size=size)
    tgt, fused = _vector_scheduled(mod)
    prims = [f for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    # the window schedule: planes parallel, the accumulation a vector of output columns
    assert any("T.parallel" in f.script() and "_update" in f.script() for f in prims)
    # stride 2: the padded input's columns split by phase (N, C, H, 2, W / 2): taps read
    # consecutive columns, not gathers
    pad = f"T.sblock_alloc_buffer((T.int64(1), T.int64(19), T.int64({size + 2}), T.int64(2), "
    assert any(pad in f.script() for f in prims) == (stride == 2)
    ex = tvm.compile(mod, target=tgt, relax_pipeline=tsl.relax.pipeline("cpu"))
    rng = np.random.default_rng(4)
    x, w, b = (rng.standard_normal(s).astype("float32")
               for s in [(1, 19, size, size), (19, 1, 3, 3), (1, 19, 1, 1)])
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = (x, w, b)
    got = vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()
    np.testing.assert_allclose(got, _torch_window(op, stride, x, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["depthwise", "maxpool"])
@pytest.mark.parametrize("cores, size, bands", [(2, 67, True), (3, 67, True), (2, 29, False),
                                                (4, 61, False)])
def test_window_rule_cuts_tall_outputs_in_row_bands_per_core(op, cores, size, bands):
    """Outputs with at least BAND_ROWS rows per core: one band of rows per core is the parallel
    loop (67 rows on 3 cores: 23 + 23 + 21), every plane inside it; shorter ones (29 rows on 2
    cores, 61 on 4) keep one plane per task. Both match PyTorch."""
    pytest.importorskip("torch", reason="the reference is PyTorch's conv2d / pooling")
    import tvm

    import tsl.relax
    from tsl.schedules.vector import VectorFacts
    from tsl.schedules.window import BAND_ROWS, window

    assert (size >= BAND_ROWS * cores) == bands
    tgt = tsl.relax.tvm_target("cpu")
    with tgt:
        fused = tvm.transform.Sequential(tsl.relax._stages(tgt)[0])(
            _window_module(op, 1, size=size))
    func = next(f for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    sch = window(func, VectorFacts(vector_bits=256, cores=cores))
    script = sch.mod["main"].script()
    assert (f"T.parallel(T.int64({cores}))" in script) == bands
    assert ("T.parallel(T.int64(19))" in script) == (not bands)
    rng = np.random.default_rng(5)
    x, w, b = (rng.standard_normal(s).astype("float32")
               for s in [(1, 19, size, size), (19, 1, 3, 3), (1, 19, 1, 1)])
    args = [x, w, b][:len(func.params) - 1]
    out = tvm.runtime.tensor(np.full((1, 19, size, size), np.nan, "float32"))
    kernel = tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")})
    tvm.compile(kernel, target=tgt)(*(tvm.runtime.tensor(a) for a in args), out)
    np.testing.assert_allclose(out.numpy(), _torch_window(op, 1, x, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["depthwise", "maxpool"])
@pytest.mark.parametrize("channels, size, width, bits, tasks", [
    (96, 14, 14, 512, 24), (24, 13, 9, 512, 12), (96, 14, 14, 256, 96), (19, 14, 14, 512, 19),
    (8, 57, 57, 512, 8)])
def test_window_rule_stages_small_phase_split_planes_several_per_task(op, channels, size, width,
                                                                       bits, tasks):
    """Stride 2: the input's columns split by phase even where the output rows are narrow (7
    and 5 columns). Phase rows narrower than a vector (8 and 6 columns on 16 lanes): planes
    staged several per parallel task, up to STAGED_BYTES (96 x 14 x 14: 16 x 2 x 8 padded,
    1 KB, four planes), as many as divide the channels (19: one) and leave TASKS_PER_CORE
    tasks on each of the 2 cores (24 x 13 x 9: 720 bytes a plane, two planes, 12 tasks). Phase
    rows of a whole vector (8 columns on 8 lanes) or more (57 x 57: 30), one plane per task.
    Every case matches PyTorch on random data."""
    pytest.importorskip("torch", reason="the reference is PyTorch's conv2d / pooling")
    import tvm

    import tsl.relax
    from tsl.schedules.vector import VectorFacts
    from tsl.schedules.window import window

    tgt = tsl.relax.tvm_target("cpu")
    with tgt:
        fused = tvm.transform.Sequential(tsl.relax._stages(tgt)[0])(
            _window_module(op, 2, channels, size, width))
    func = next(f for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    sch = window(func, VectorFacts(vector_bits=bits, cores=2))
    script = sch.mod["main"].script()
    padded = f"T.int64({size + 2}), T.int64(2), T.int64({(width + 3) // 2}))"
    assert padded in script
    assert f"T.parallel(T.int64({tasks}))" in script
    rng = np.random.default_rng(6)
    x, w, b = (rng.standard_normal(s).astype("float32")
               for s in [(1, channels, size, width), (channels, 1, 3, 3), (1, channels, 1, 1)])
    args = [x, w, b][:len(func.params) - 1]
    out_shape = (1, channels, (size + 1) // 2, (width + 1) // 2)
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, "float32"))
    kernel = tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")})
    tvm.compile(kernel, target=tgt)(*(tvm.runtime.tensor(a) for a in args), out)
    np.testing.assert_allclose(out.numpy(), _torch_window(op, 2, x, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["maxpool", "avgpool"])
@pytest.mark.parametrize("size, width", [(57, 56), (21, 30)])
def test_window_rule_fills_a_phase_split_plane_one_phase_row_at_a_time(op, size, width):
    """Stride 2: the staged plane's fill (the padding value everywhere, before the copy of the
    interior) runs phases outer and the columns of one phase row as a vector, consecutive
    stores; in the copy's order (phases inner) LLVM made it 8-element scatters (ResNet-18's
    max-pool ran 2.1x slower). Even widths (an odd one's padded layout is written by the copy
alone: no fill); the kernel matches PyTorch."""
    pytest.importorskip("torch", reason="the reference is PyTorch's conv2d / pooling")
    import tvm
    from tvm.tirx import ForKind

    import tsl.relax
    from tsl.schedules.vector import VectorFacts
    from tsl.schedules.window import window

    tgt = tsl.relax.tvm_target("cpu")
    with tgt:
        fused = tvm.transform.Sequential(tsl.relax._stages(tgt)[0])(
            _window_module(op, 2, 19, size, width))
    func = next(f for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    sch = window(func, VectorFacts(vector_bits=512, cores=2))
    fill = sch.get_sblock("pad_temp_pad_const")
    phase, cols = (sch.get(lp) for lp in sch.get_loops(fill)[-2:])
    assert (phase.extent.value, phase.kind) == (2, ForKind.SERIAL)
    assert (cols.extent.value, cols.kind) == (width // 2 + 1, ForKind.VECTORIZED)
    rng = np.random.default_rng(8)
    x, w, b = (rng.standard_normal(s).astype("float32")
               for s in [(1, 19, size, width), (19, 1, 3, 3), (1, 19, 1, 1)])
    args = [x, w, b][:len(func.params) - 1]
    out = tvm.runtime.tensor(np.full((1, 19, (size + 1) // 2, (width + 1) // 2), np.nan, "float32"))
    kernel = tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")})
    tvm.compile(kernel, target=tgt)(*(tvm.runtime.tensor(a) for a in args), out)
    np.testing.assert_allclose(out.numpy(), _torch_window(op, 2, x, w, b), rtol=1e-5, atol=1e-5)


def test_reshapes_around_tsl_gemms_are_views_not_copies_and_the_model_matches_numpy():
    """ONNX's MatMul on (1, rows, k) tensors: the swap's kernels work on (rows, k) and reshape
    their operands and results; those reshapes (and TVM's own) must reach the VM as views, not
    as copies scheduled by the vector rules."""
    import re

    import tvm
    from tvm import relax

    import tsl.relax

    rng = np.random.default_rng(7)
    w1, b1 = rng.standard_normal((32, 48)).astype("float32"), rng.standard_normal(48)
    w2 = rng.standard_normal((48, 32)).astype("float32")
    x = relax.Var("x", relax.TensorType((1, 16, 32), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, relax.const(w1)))
            h = bb.emit(relax.op.nn.relu(relax.op.add(h, relax.const(b1.astype("float32")))))
            out = bb.emit_output(relax.op.nn.relu(relax.op.matmul(h, relax.const(w2))))
        bb.emit_func_output(out)
    mod = bb.get()
    tgt = tsl.relax.tvm_target("cpu")
    with tgt:
        before = tsl.relax._stages(tgt)[0]
        done = tvm.transform.Sequential(before + [tsl.relax.swap_pass("cpu")]
                                        + tsl.relax._vector_pass("cpu", tgt))(mod)
    called = re.findall(r"call_tir\((?:\w+\.)?(\w+),", done["main"].script())
    simplify = tvm.s_tir.transform.StmtSimplify()
    copies = [n for n in called if not n.endswith("_tsl") and relax.analysis.has_reshape_pattern(
        simplify(tvm.IRModule({"main": done[n]}))["main"])]
    assert sum(n.endswith("_tsl") for n in called) == 2 and not copies, called
    ex = tvm.compile(mod, target=tgt, relax_pipeline=tsl.relax.pipeline("cpu"))
    xs = rng.standard_normal((1, 16, 32)).astype("float32")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xs)).numpy()
    want = np.maximum(np.maximum(xs @ w1 + b1, 0) @ w2, 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_copy_chains_become_one_function_per_consumer_and_match_numpy():
    """An attention-style split: a transpose read by three `take`s, each transposed and scaled,
    one also exponentiated. Each output is one function reading x (the copies computed inside
    their consumers, `tsl.relax.chains`); a non-copy (exp) read twice stays a function of its
    own; a transpose read only by a sum, and an add read only by a layer norm, are computed
    inside them. Shapes off the vector lanes (7 x 3 x 10)."""
    import re

    import tvm
    from tvm import relax

    import tsl.relax

    x = relax.Var("x", relax.TensorType((7, 30), "float32"))
    op = relax.op
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(op.permute_dims(op.reshape(x, (7, 3, 10)), [1, 0, 2]))
            parts = [bb.emit(op.take(t, relax.const(i, "int64"), axis=0)) for i in range(3)]
            q = bb.emit(op.multiply(op.permute_dims(parts[0], [1, 0]), relax.const(0.5)))
            k = bb.emit(op.exp(op.permute_dims(parts[1], [1, 0])))
            e = bb.emit(op.exp(parts[2]))
            s = bb.emit(op.sum(op.permute_dims(x, [1, 0]), axis=[1]))
            g = relax.const(np.linspace(0.5, 1.5, 30, dtype="float32"))
            n = bb.emit(op.nn.layer_norm(op.add(x, relax.const(1.0)), g, g, axes=[-1]))
            out = bb.emit_output(relax.Tuple([q, k, op.add(e, e), op.multiply(e, e), s, n]))
        bb.emit_func_output(out)
    mod = bb.get()
    tgt, done = _vector_scheduled(mod)
    calls = re.findall(r"call_tir\((?:\w+\.)?(\w+), \((\w+)", done["main"].script())
    # q, k and e's exp from x directly; e's add and multiply; the sum and the norm
    assert sum(arg == "x" and "take" in name for name, arg in calls) == 3, calls
    assert len(calls) == 3 + 2 + 2, calls
    assert {n for n, arg in calls if arg == "x"} >= {"fused_transpose2_sum", "fused_add_layer_norm"}
    ex = tvm.compile(mod, target=tgt, relax_pipeline=tsl.relax.pipeline("cpu"))
    xs = np.random.default_rng(8).standard_normal((7, 30)).astype("float32")
    got = [a.numpy() for a in relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xs))]
    p = xs.reshape(7, 3, 10).transpose(1, 0, 2)
    ev = np.exp(p[2])
    h = xs + 1
    norm = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
    want = [p[0].T * 0.5, np.exp(p[1].T), ev + ev, ev * ev, xs.T.sum(axis=1),
            norm * np.linspace(0.5, 1.5, 30) + np.linspace(0.5, 1.5, 30)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("init, padded", [(0.0, True), (1.5, False)])
def test_a_row_sum_is_padded_only_where_its_init_is_the_identity(init, padded):
    """`guarded.pad_reductions` folds the init in once per padded element: right for a sum
    starting at 0, wrong for one starting at a bias (counted once per padding element), which
    is left as it is; run at lengths off the lanes either way."""
    import tvm
    from tvm.script import tirx as T

    from tsl.schedules.guarded import pad_reductions

    @T.prim_func(s_tir=True)
    def row_sum(a: T.handle, b: T.handle):
        n = T.int64()
        A = T.match_buffer(a, (T.int64(4), n), "float32")
        B = T.match_buffer(b, (T.int64(4),), "float32")
        for i, k in T.grid(T.int64(4), n):
            with T.sblock("sum"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    B[vi] = T.float32(init)
                B[vi] = B[vi] + A[vi, vk]

    func, names = pad_reductions(row_sum, lambda _: 16)
    assert names == (["sum"] if padded else []), func.script()
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    rng = np.random.default_rng(3)
    for n in (1, 5, 17, 40):
        x = rng.standard_normal((4, n)).astype("float32")
        out = tvm.runtime.tensor(np.zeros(4, "float32"))
        lib["main"](tvm.runtime.tensor(x), out)
        np.testing.assert_allclose(out.numpy(), x.sum(1) + init, rtol=1e-5, atol=1e-6)


def _rows_copy_mod(rows: tuple, src: int, dst: int):
    """(*rows, src) -> (*rows, dst): the swap's crop of padded channels (dst < src, the first
    dst of each row) or pad (dst > src, zeros past src), as the swap writes them."""
    import tvm
    from tvm import te

    from tsl.relax.swap import _crop_te, _pack_te

    x = te.placeholder((*rows, src), "float32", name="x")
    y = (_crop_te((*rows, src), (*rows, dst), (*rows, dst), "float32") if dst < src else
         _pack_te((*rows, src), (*rows, dst), None, "float32", "pad"))(x)
    return tvm.IRModule({"main": te.create_prim_func([x, y])})


@pytest.mark.parametrize("bits", [512, 256])
@pytest.mark.parametrize("rows,src,dst,vector", [((1, 5, 6), 32, 24, 8), ((1, 3, 4), 48, 40, 8),
                                                 ((1, 3, 4), 32, 19, None),
                                                 ((2, 7), 24, 32, 16)])
def test_copies_between_rows_of_other_widths_run_rows_parallel_in_whole_vectors(
        bits, rows, src, dst, vector):
    """A crop of padded channels (or a pad to them): rows parallel, each row in vectors of the
    largest power of two dividing it up to the lanes (no gather across rows), or a loop of its
    own under 4; the result NumPy's."""
    import tvm

    left = []
    mod = schedule_rest(VectorFacts(vector_bits=bits, cores=2), left)(
        _rows_copy_mod(rows, src, dst))
    assert not left
    text = mod["main"].script()
    assert "T.parallel" in text
    if vector is None:
        assert "T.vectorized" not in text
    else:
        assert f"T.vectorized({min(vector, bits // 32)})" in text
    lib = tvm.compile(mod, target="llvm")
    x = np.random.default_rng(0).standard_normal((*rows, src)).astype("float32")
    y = tvm.runtime.tensor(np.full((*rows, dst), np.nan, "float32"))
    lib["main"](tvm.runtime.tensor(x), y)
    want = x[..., :dst] if dst < src else np.concatenate(
        [x, np.zeros((*rows, dst - src), "float32")], axis=-1)
    np.testing.assert_array_equal(y.numpy(), want)
