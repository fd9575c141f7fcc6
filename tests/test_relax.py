"""tsl.relax: targets, the swap pass on small models (equal to TVM without tsl), fallbacks and
the report, knobs / database, int8 requantize, Tensor Core compile, art.mod."""

import json

import numpy as np
import pytest

import tsl
from tsl.bench import models as bench
from tsl.relax import models

tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402
from tvm.relax.frontend import nn  # noqa: E402

import tsl.relax  # noqa: E402
from tsl.backends.cpu import detect  # noqa: E402


def _compile_both(mod, x, target="cpu", **kw):
    tsl_c = bench.compile_model(mod, target, **kw)
    tvm_c = bench.compile_model(mod, target, use_tsl=False)
    return tsl_c, tsl_c(x), tvm_c(x)


def _swapped(report):
    return {d.function for d in report.taken}


# -- targets ----------------------------------------------------------------------------------
def test_targets_map_to_machines():

    assert tsl.relax.machine_for("llvm").name == detect().name
    assert tsl.relax.machine_for({"kind": "llvm"}).name == detect().name
    assert tsl.relax.machine_for({"kind": "cuda", "arch": "sm_90"}).name == "tensorcore-sm90"
    assert tsl.relax.machine_for(tvm.target.Target({"kind": "cuda", "arch": "sm_80"})).name \
        == "tensorcore-sm80"
    assert tsl.relax.machine_for("cpu").name == detect().name
    tgt = tsl.relax.tvm_target("cpu")
    assert tgt.kind.name == "llvm" and "+avx2" in [str(a) for a in tgt.attrs["mattr"]]


@pytest.mark.parametrize("target, words", [
    ({"kind": "cuda", "arch": "sm_70"}, ["sm_70", "sm_80", "sm_90"]),
    ({"kind": "vulkan"}, ["vulkan", "llvm", "cuda"]),
])
def test_unmapped_target_names_the_known_ones(target, words):
    with pytest.raises(tsl.BackendUnavailable) as e:
        tsl.relax.machine_for(target)
    assert all(w in str(e.value) for w in words)


# -- art.mod ----------------------------------------------------------------------------------
def test_artifact_mod_is_the_scheduled_module():
    op = tsl.ops.matmul(40, 24, 32)
    art = tsl.build(op, "cpu")
    assert isinstance(art.mod, tvm.IRModule) and art.mod.script() == art.tir()
    ex = tvm.compile(art.mod, target=tsl.relax.tvm_target("cpu"))
    a, b = op.random_inputs(3)
    args = [tvm.runtime.tensor(x) for x in art.prepare([a, b])]
    out = tvm.runtime.empty(art.ctx.op.output.shape, "float32")
    ex(*args, out)
    assert op.check(op.crop_output(out.numpy()), op.reference(a, b))[0]


# -- the bridge on small models ---------------------------------------------------------------
class TinyConvNet(nn.Module):
    """conv+bias+relu (odd channel count: padded), a residual block, a 1x1 stride-2 conv,
    a grouped conv (not tsl's: left to TVM), a linear layer."""

    def __init__(self):
        self.c1 = nn.Conv2D(3, 12, 3, padding=1)
        self.c2 = nn.Conv2D(12, 12, 3, padding=1)
        self.down = nn.Conv2D(12, 16, 1, stride=2)
        self.grouped = nn.Conv2D(16, 16, 3, padding=1, groups=4)
        self.fc = nn.Linear(16 * 5 * 5, 10)

    def forward(self, x):
        y = nn.relu(self.c1(x))
        y = nn.relu(self.c2(y) + y)
        y = nn.relu(self.grouped(self.down(y)))
        return self.fc(nn.op.reshape(y, (1, 16 * 5 * 5)))


@pytest.fixture(scope="module")
def tiny():
    mod, weights, x = models.export(TinyConvNet(), (1, 3, 9, 9))
    return mod, weights, x


def test_tiny_convnet_equals_tvm_and_reports(tiny):
    mod, _, x = tiny
    c, got, want = _compile_both(mod, x)
    assert bench._rel_err(got, want) < 1e-5
    rep = c.report
    assert rep.machine == tsl.relax.machine_for("cpu").name
    patterns = sorted(d.pattern for d in rep.taken)
    assert any(p.startswith("conv2d+bias+relu") for p in patterns)
    assert "conv2d+bias+residual+relu" in patterns  # the skip connection fused in the epilogue
    assert any(p.startswith("matmul+bias") for p in patterns)
    assert len(rep.taken) == 4
    left = [d for d in rep.left]
    assert len(left) == 1 and "grouped" in left[0].reason
    assert "tvm " in str(rep) and "schedule tsl.schedules.schedule_conv2d" in str(rep)
    # report() on the unfused module says the same
    again = tsl.relax.report(mod, "cpu")
    assert _swapped(again) == _swapped(rep)


def test_swapped_functions_carry_machine_and_knobs(tiny):
    mod, _, _ = tiny
    seen = []

    def grab(m, _ctx):
        seen.append(m)
        return m

    pipe = tsl.relax.pipeline("cpu")
    tgt = tsl.relax.tvm_target("cpu")
    with tgt:
        fused = tvm.transform.Sequential(tsl.relax._stages(tgt)[0])(mod)
    out = tsl.relax.swap_pass("cpu")(fused)
    tagged = {gv.name_hint: f for gv, f in out.functions.items() if "tsl.machine" in f.attrs}
    assert len(tagged) == 4 and all(n.endswith("_tsl") for n in tagged)
    for f in tagged.values():
        assert str(f.attrs["tsl.machine"]) == tsl.relax.machine_for("cpu").name
        assert isinstance(json.loads(str(f.attrs["tsl.knobs"])), dict)
    assert pipe is not None


def test_runtime_weights_are_packed_by_relax_calls():
    """Weights passed at run time (not bound as constants) are padded and packed by Relax
    calls inserted before the kernel."""
    model = TinyConvNet()
    mod, params = model.export_tvm({"forward": {"x": nn.spec.Tensor((1, 3, 9, 9), "float32")}})
    weights = models.random_weights(params, 1)
    x = np.random.default_rng(2).uniform(-1, 1, (1, 3, 9, 9)).astype("float32")
    args = [tvm.runtime.tensor(x)] + [tvm.runtime.tensor(weights[n]) for n, _ in params]
    outs = []
    for pipe in (tsl.relax.pipeline("cpu"), "default"):
        ex = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"), relax_pipeline=pipe)
        outs.append(relax.VirtualMachine(ex, tvm.cpu())["forward"](*args).numpy())
    assert bench._rel_err(outs[0], outs[1]) < 1e-5


class LongLinear(nn.Module):
    """One linear layer whose weight panel per register tile outgrows the L1 (K long)."""

    def __init__(self, k):
        self.fc = nn.Linear(k, 40)

    def forward(self, x):
        return self.fc(x)


def _assembly(ex) -> str:
    """The assembly of every compiled module under `ex` (the kernels are in an import)."""
    out, todo = [], [ex.mod]
    while todo:
        m = todo.pop()
        if m.kind == "llvm":
            out.append(m.inspect_source("asm"))
        todo += list(m.imports)
    return "\n".join(out)


def test_cpu_tir_pipeline_keeps_the_weight_prefetch():
    """Compiled with `tir_pipeline("cpu")`, a model's GEMM keeps what `tsl.build`'s has: on a
    machine whose file prefetches the weights (`params.prefetch_bytes`), the prefetch, which
    TVM's default TIR pipeline drops; the output is the same either way."""
    m = detect()
    if not m.params.prefetch_bytes:
        pytest.skip(f"{m.name}'s file has no weight prefetch")
    k = 2 * m.memory_level("l1").capacity // 64 + 3
    mod, params = LongLinear(k).export_tvm({"forward": {"x": nn.spec.Tensor((100, k), "float32")}})
    rng = np.random.default_rng(4)
    weights = models.random_weights(params, 1)
    args = [rng.uniform(-1, 1, (100, k)).astype("float32")] + [weights[n] for n, _ in params]
    outs, asm = [], []
    for tir in (tsl.relax.tir_pipeline("cpu"), "default"):
        ex = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"),
                         relax_pipeline=tsl.relax.pipeline("cpu"), tir_pipeline=tir)
        asm.append(_assembly(ex))
        outs.append(relax.VirtualMachine(ex, tvm.cpu())["forward"](
            *[tvm.runtime.tensor(a) for a in args]).numpy())
    assert "prefetcht0" in asm[0] and "prefetcht0" not in asm[1]
    np.testing.assert_array_equal(outs[0], outs[1])
    x, w, b = (args[0], weights["fc.weight"], weights["fc.bias"])
    assert bench._rel_err(outs[0], (x.astype("float64") @ w.T + b).astype("float32")) < 1e-5


class BiasAndNoBias(nn.Module):
    """The encoder's out-projection as the two frontends import it: torch.export keeps its
    all-zero bias, ONNX's exporter drops it (benchmarks/README.md, enc40)."""

    def __init__(self):
        self.with_bias = nn.Linear(768, 768)
        self.without = nn.Linear(768, 768, bias=False)

    def forward(self, x):
        return self.without(self.with_bias(x))


def test_a_linear_with_or_without_bias_gets_the_same_register_tile():
    """Both GEMMs are swapped, with the same register tile (the one reading the fewest operand
    bytes per MAC among the settings the model prices alike): the ONNX build's bias-less
    out-projection had 4x3 blocks where torch's had 8x2."""
    mod, _ = BiasAndNoBias().export_tvm({"forward": {"x": nn.spec.Tensor((128, 768), "float32")}})
    # The file's own figures, on any host: the target "x86-avx512" takes the host's
    # micro-architecture figures (on Zen 4 znver4's clock and peaks, where both GEMMs get 16x1).
    rep = tsl.relax.report(mod, tsl.load_machine("x86-avx512"))
    taken = sorted(rep.taken, key=lambda d: d.pattern)
    assert [d.pattern for d in taken] == ["matmul", "matmul+bias"]
    tiles = {(d.knobs["m_inner"], d.knobs["n_inner"]) for d in taken}
    assert tiles == {(8, 3)}


def test_tiny_encoder_equals_tvm_and_torch():
    model, shape = models.bert_layer(small=True)
    mod, weights, x = models.export(model, shape)
    c, got, want = _compile_both(mod, x)
    assert bench._rel_err(got, want) < 1e-5
    pats = [d.pattern for d in c.report.taken]
    assert sum(p.startswith("batch_matmul") for p in pats) == 2  # QK^T and PV
    assert sum(p.startswith("matmul+bias") for p in pats) >= 4
    assert {"fast_softmax", "layer_norm"} <= set(c.report.other)   # FastMathTransform
    torch = pytest.importorskip("torch", reason="PyTorch is optional (pip install torch)")
    with torch.inference_mode():
        ref = models.torch_forward("bert", weights, small=True)(torch.from_numpy(x)).numpy()
    assert bench._rel_err(got, ref) < 1e-5


def test_knobs_and_database_argument(tiny):
    mod, _, x = tiny
    c, got, want = _compile_both(mod, x, database={"stages": 1})
    assert bench._rel_err(got, want) < 1e-5
    assert all(d.knobs["stages"] == 1 for d in c.report.taken)
    # A knob value no schedule accepts: every candidate falls back to TVM, with the reason.
    rep = tsl.relax.report(mod, "cpu", database={"stages": 7})
    assert not rep.taken and sum("knob('stages')" in d.reason for d in rep.left) == 4


def test_int8_requantize_is_exact():
    mod, x = models.resnet18_int8(small=True)
    c, got, want = _compile_both(mod, x)
    assert got.dtype == np.int32 and np.array_equal(got, want)
    assert np.ptp(want) > 0
    pats = [d.pattern for d in c.report.taken]
    assert any("shift+clip->int8" in p for p in pats)
    assert not c.report.left


def test_tensorcore_compile_swaps_kernels():
    row = bench.compile_tensorcore("bert", small=True)
    assert row["machine"] == "tensorcore-sm90" and row["tsl_calls"] >= 4, row["report"]


def test_the_swap_s_build_cache_tells_machines_of_one_name_apart_by_their_figures():
    """A target name takes the host's probed figures, `tsl.load_machine` the file's: one name,
    other tiles. The swap's per-process cache must not hand one the other's kernel."""
    import dataclasses

    from tsl.ops import defs
    from tsl.relax import swap

    m = tsl.load_machine("x86-avx512")
    faster = dataclasses.replace(m, clock_hz=2 * m.clock_hz)
    op = defs.dense(64, 96, 128, dtype="float32")
    assert swap._key(op, m, None) != swap._key(op, faster, None)
    assert swap._key(op, m, None) == swap._key(op, tsl.load_machine("x86-avx512"), None)
