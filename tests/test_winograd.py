"""Winograd F(2x2, 3x3) and F(4x4, 3x3) for channels-last 3x3 stride-1 convs
(`tsl.relax.winograd`): the input transform, the batch GEMM with the transformed weights and the
output transform give the conv's result at odd spatial sizes (not multiples of the tile) and
channel counts that are not multiples of the vector, and an imported CNN (both frontends) has
its convs rewritten where the model prices them lower, its bias, BatchNorm, residual add and
relu fused after the output transform, nothing unscheduled."""

import numpy as np
import pytest

import tsl.relax
from tsl.relax import winograd

torch = pytest.importorskip("torch", reason="the comparisons need PyTorch "
                                            "(pip install -e '.[test]' brings the CPU build)")

from test_imported import _compile_and_run, _imported, _randomized  # noqa: E402


def _fused_names(mod) -> list[str]:
    """The PrimFuncs of `mod` after the pipeline up to fusion, planned on the x86-avx512-zen4
    file's own figures: which convs go channels-last and Winograd is the model's price on a
    machine, and the host's (AVX2-only, or Intel's) may price them otherwise."""
    import tvm

    from tsl.relax import _stages, tvm_target

    tgt = tvm_target("cpu")
    with tgt:
        fused = tvm.transform.Sequential(
            _stages(tgt, tsl.load_machine("x86-avx512-zen4"))[0])(mod)
    return [gv.name_hint for gv, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]


# (h, w, c, k, padding, m of F(m x m, 3x3)): odd sizes, 7x7, channels of 3, 20, 24 (not
# multiples of 16 lanes) and 16 (the vectorized input transform).
SHAPES = [(7, 7, 3, 20, 1, 2), (13, 13, 20, 24, 1, 2), (15, 9, 24, 20, 0, 4),
          (7, 7, 16, 16, 1, 4)]


def test_the_transforms_and_batch_gemm_match_the_direct_conv(monkeypatch):
    """Each conv forced through the rewrite as its F(m x m, 3x3) (the model prices these small
    convs direct), with bias and relu; one module, one compile."""
    import tvm
    from tvm import relax

    forms = {(h, w, c, k): m for h, w, c, k, _, m in SHAPES}
    monkeypatch.setattr(winograd, "_choice", lambda shape, *_: forms[shape[1:5]])
    rng = np.random.default_rng(0)
    bb, params, xs, wants = relax.BlockBuilder(), [], [], []
    weights = [rng.uniform(-1, 1, (3, 3, c, k)).astype("float32") for _, _, c, k, *_ in SHAPES]
    biases = [rng.uniform(-1, 1, (1, 1, 1, k)).astype("float32") for _, _, _, k, *_ in SHAPES]
    for i, (h, w, c, k, p, _) in enumerate(SHAPES):
        params.append(relax.Var(f"x{i}", relax.TensorType((1, h, w, c), "float32")))
        xs.append(rng.uniform(-1, 1, (1, h, w, c)).astype("float32"))
        conv = torch.nn.functional.conv2d(torch.from_numpy(xs[-1]).permute(0, 3, 1, 2),
                                          torch.from_numpy(weights[i]).permute(3, 2, 0, 1),
                                          padding=p)
        wants.append(np.maximum(conv.permute(0, 2, 3, 1).numpy() + biases[i], 0))
    with bb.function("main", params):
        with bb.dataflow():
            outs = [bb.emit(relax.op.nn.relu(relax.op.add(relax.op.nn.conv2d(
                x, relax.const(wt), padding=p, data_layout="NHWC", kernel_layout="HWIO"),
                relax.const(b)))) for x, wt, b, (*_, p, _) in zip(params, weights, biases, SHAPES)]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    mod, rewritten = winograd.rewrite(bb.get(), tsl.relax.machine_for("cpu"))
    assert rewritten == len(SHAPES)
    ex = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"),
                     relax_pipeline=tsl.relax.pipeline("cpu"),
                     tir_pipeline=tsl.relax.tir_pipeline("cpu"))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*(tvm.runtime.tensor(x) for x in xs))
    for g, want, (*_, m) in zip(got, wants, SHAPES):
        # F(4x4, 3x3)'s coefficients (up to 8 and 1/24) round more: ~3e-6 of the largest output
        # here (1e-7 for F(2x2, 3x3), held to the direct conv's tolerance); a wrong transform is
        # off by the outputs' own size.
        tol = (dict(rtol=1e-5, atol=1e-5) if m == 2
               else dict(rtol=0, atol=1e-5 * np.abs(want).max()))
        np.testing.assert_allclose(g.numpy(), want, **tol)


class _Block(torch.nn.Module):
    """A 3-channel conv-BN-relu (priced direct), then two 40-channel 3x3 convs (priced
    Winograd): conv-BN + skip, relu; a conv with bias and no padding (an odd output size)."""

    def __init__(self):
        super().__init__()
        c = 40
        self.stem = torch.nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn0 = torch.nn.BatchNorm2d(c)
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.conv2 = torch.nn.Conv2d(c, 44, 3)

    def forward(self, x):
        x = torch.relu(self.bn0(self.stem(x)))
        x = torch.relu(self.bn1(self.conv1(x)) + x)
        return self.conv2(x)


@pytest.mark.parametrize("frontend,size", [("torch", (17, 11)), ("onnx", (13, 13))])
def test_an_imported_cnn_goes_winograd_where_priced_lower_and_matches_pytorch(
        frontend, size, tmp_path):
    from tsl.relax.schedule_rest import unscheduled

    model = _randomized(_Block())
    x = np.random.default_rng(2).uniform(-1, 1, (1, 3, *size)).astype("float32")
    mod = _imported(model, x, frontend, tmp_path)
    names = _fused_names(mod)
    # On that file both 40-channel convs: their GEMMs alone, the residual add and relu after the
    # transform. The host's own plan may differ; its result is checked against PyTorch below.
    assert sum(n.startswith("winograd_input") for n in names) == 2, names
    assert any(n.startswith("fused_winograd_output") and n.endswith("relu") for n in names), names
    assert sum("conv2d" in n for n in names) == 1, names  # the 3-channel stem stays direct
    assert unscheduled(mod, "cpu") == []
    got = _compile_and_run(mod, x)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_zen4_file_prices_f4_at_56x56_and_f2_where_few_tiles_stream_the_weights():
    """ResNet-18's first and last 3x3 convs on the x86-avx512-zen4 file's figures: 56x56x64 as
    F(4x4, 3x3) (196 tiles; measured 0.33-0.41x the direct conv, F(2x2, 3x3) 0.52-0.62x),
    7x7x512 as F(2x2, 3x3): F(4x4, 3x3) there is 36 GEMMs of 4 rows streaming 37.7 MB of
    transformed weights against F(2x2, 3x3)'s 16.8 MB, which the price counts."""
    machine = tsl.load_machine("x86-avx512-zen4")
    assert winograd._choice((1, 56, 56, 64, 64, 1), "float32", machine) == 4
    assert winograd._choice((1, 7, 7, 512, 512, 1), "float32", machine) == 2
