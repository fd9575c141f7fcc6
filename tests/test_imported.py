"""Models nobody on this project wrote, imported the way TVM users import them
(`torch.export` + `from_exported_program`, or an ONNX file + `from_onnx`), compiled through
`tsl.relax.pipeline("cpu")` and checked against PyTorch on the same weights."""

import functools

import numpy as np
import pytest

import tsl
import tsl.relax

torch = pytest.importorskip("torch", reason="the torch frontend tests need PyTorch "
                                            "(pip install -e '.[test]' brings the CPU build)")


class Residual(torch.nn.Module):
    """conv-BN-relu, conv-BN + skip, relu; a depthwise conv-BN-relu6; pooled linear head."""

    def __init__(self):
        super().__init__()
        c = 16
        self.stem = torch.nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn0 = torch.nn.BatchNorm2d(c)
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(c)
        self.dw = torch.nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.bn3 = torch.nn.BatchNorm2d(c)
        self.fc = torch.nn.Linear(c, 10)

    def forward(self, x):
        x = torch.relu(self.bn0(self.stem(x)))
        y = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(y)) + x)
        x = torch.nn.functional.relu6(self.bn3(self.dw(x)))
        return self.fc(x.mean((2, 3)))


def _randomized(model):
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):  # non-trivial statistics to fold
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    return model.eval()


def _compile_and_run(mod, x):
    import tvm
    from tvm import relax

    ex = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"),
                     relax_pipeline=tsl.relax.pipeline("cpu"),
                     tir_pipeline=tsl.relax.tir_pipeline("cpu"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    out = out[0] if not hasattr(out, "numpy") else out
    return out.numpy()


def _exported(model, x):
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad():
        ep = torch.export.export(model, (torch.from_numpy(x),))
    return from_exported_program(ep, keep_params_as_input=False)


@functools.cache
def _residual_exported():
    """The Residual model and its torch.export import, shared by the tests that read it (the
    export depends on the input's shape, not its values)."""
    model = _randomized(Residual())
    x = np.random.default_rng(1).uniform(-1, 1, (1, 3, 20, 20)).astype("float32")
    return model, _exported(model, x)


def test_batch_norms_are_folded_into_the_convs_and_the_residual_add_is_an_epilogue(monkeypatch):
    # The direct convs' epilogues: the model prices this CNN's 16-channel 3x3 convs as Winograd
    # F(4x4, 3x3), whose bias and residual add fuse after its output transform (test_winograd).
    monkeypatch.setattr(tsl.relax.winograd, "_choice", lambda *_: None)
    _, mod = _residual_exported()
    folded = tsl.relax.fold_batch_norm()(mod)
    assert "batch_norm" not in folded.script()
    rep = tsl.relax.report(mod, "cpu")
    patterns = [d.pattern for d in rep.taken]
    assert sum(p.startswith("conv2d+bias") for p in patterns) >= 3, str(rep)
    assert any("residual" in p for p in patterns), str(rep)


def test_a_residual_cnn_with_batch_norm_matches_pytorch_through_the_torch_frontend():
    model, mod = _residual_exported()
    x = np.random.default_rng(2).uniform(-1, 1, (1, 3, 20, 20)).astype("float32")
    got = _compile_and_run(mod, x)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 1e-4, err


def _onnx_imported(model, x, tmp_path):
    pytest.importorskip("onnx", reason="the ONNX frontend test needs the onnx package")
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript")
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    path = tmp_path / "model.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (torch.from_numpy(x),), str(path), dynamo=True)
    return from_onnx(onnx.load(str(path)), keep_params_in_input=False)


def _imported(model, x, frontend, tmp_path):
    return _exported(model, x) if frontend == "torch" else _onnx_imported(model, x, tmp_path)


def test_the_same_model_through_onnx_matches_pytorch(tmp_path):
    model = _randomized(Residual())
    x = np.random.default_rng(3).uniform(-1, 1, (1, 3, 20, 20)).astype("float32")
    mod = _onnx_imported(model, x, tmp_path)
    got = _compile_and_run(mod, x)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 1e-4, err


class ClippedConvs(torch.nn.Module):
    """MobileNet's pointwise conv-BN-relu6, then a hardtanh of fractional bounds."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(8, 24, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(24)
        self.conv2 = torch.nn.Conv2d(24, 16, 3, padding=1)

    def forward(self, x):
        x = torch.nn.functional.relu6(self.bn1(self.conv1(x)))
        return torch.nn.functional.hardtanh(self.conv2(x), -0.25, 0.75)


@pytest.mark.parametrize("frontend", ["torch", "onnx"])
def test_relu6_and_float_clips_after_a_conv_are_its_epilogue_not_a_pass_after_it(frontend,
                                                                                 tmp_path):
    """The ONNX frontend lowers Clip to TE max / min calls at import; tsl.relax.restore_clip
    makes them Relax clips again, so both frontends give the conv the same epilogue."""
    model = _randomized(ClippedConvs())
    x = np.random.default_rng(4).uniform(-1, 1, (1, 8, 9, 11)).astype("float32")
    mod = _imported(model, x, frontend, tmp_path)
    rep = tsl.relax.report(mod, "cpu")
    taken = [d for d in rep.taken if d.pattern.startswith("conv2d")]
    assert len(taken) == 2, str(rep)
    assert all("clip" in d.pattern and "left to TVM" not in d.pattern for d in taken), str(rep)
    got = _compile_and_run(mod, x)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    assert got.min() >= -0.25 and got.max() <= 0.75
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 1e-4, err


def _onnx_clip(lo, hi, bounds_as_inputs):
    """An ONNX graph y = Clip(x, lo, hi), the bounds initializers or graph inputs."""
    onnx = pytest.importorskip("onnx", reason="the ONNX frontend test needs the onnx package")
    from onnx import TensorProto, helper

    bounds = [helper.make_tensor_value_info(n, TensorProto.FLOAT, []) for n in ("lo", "hi")]
    inits = [] if bounds_as_inputs else [helper.make_tensor("lo", TensorProto.FLOAT, [], [lo]),
                                         helper.make_tensor("hi", TensorProto.FLOAT, [], [hi])]
    graph = helper.make_graph(
        [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], "clip",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5])]
        + (bounds if bounds_as_inputs else []),
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("lo, hi, bounds_as_inputs", [(-0.3, 0.4, False), (0.5, -0.5, False),
                                                      (-0.3, 0.4, True)])
def test_onnx_clip_is_a_relax_clip_only_where_its_bounds_are_constants_in_order(lo, hi,
                                                                                bounds_as_inputs):
    """Constant bounds lo <= hi: one relax clip. lo > hi (ONNX: every value becomes hi) and
    bounds given at run time keep the frontend's max / min calls; all three compute ONNX's
    min(max(x, lo), hi)."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(_onnx_clip(lo, hi, bounds_as_inputs), keep_params_in_input=False)
    with tsl.relax.tvm_target("cpu"):
        imported = tvm.transform.Sequential(tsl.relax.import_passes())(mod)
    clips = imported["main"].script().count("R.clip(")
    assert clips == (1 if lo <= hi and not bounds_as_inputs else 0), imported["main"].script()
    x = np.random.default_rng(6).uniform(-1, 1, (2, 3, 5)).astype("float32")
    ex = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"),
                     relax_pipeline=tsl.relax.pipeline("cpu"),
                     tir_pipeline=tsl.relax.tir_pipeline("cpu"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(x)] + ([tvm.runtime.tensor(np.array(v, "float32"))
                                       for v in (lo, hi)] if bounds_as_inputs else [])
    got = vm["main"](*args).numpy()
    np.testing.assert_allclose(got, np.minimum(np.maximum(x, lo), hi), rtol=0, atol=0)


class LinearGelu(torch.nn.Module):
    """A transformer MLP: linear, erf gelu, linear."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(24, 40)
        self.down = torch.nn.Linear(40, 24)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


@pytest.mark.parametrize("frontend", ["torch", "onnx"])
def test_erf_gelu_after_a_linear_is_its_epilogue_through_both_frontends(frontend, tmp_path):
    torch.manual_seed(0)
    model = LinearGelu().eval()
    x = np.random.default_rng(8).uniform(-2, 2, (1, 13, 24)).astype("float32")
    mod = _imported(model, x, frontend, tmp_path)
    rep = tsl.relax.report(mod, "cpu")
    assert any(d.pattern.startswith("matmul+bias+gelu") and "left to TVM" not in d.pattern
               for d in rep.taken), str(rep)
    got = _compile_and_run(mod, x)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 1e-4, err


def test_constants_of_one_value_become_scalars_where_the_result_keeps_its_shape():
    """Torch's safe softmax selects from `full_like(x, 0)`, folded into a constant as large as
    x; `splat_constants` makes it a 0-d constant (read once, not in full per call), but not
    where the constant alone gives the result its shape, nor an add's operand (a GEMM's bias
    stays a vector). Shapes off the vector lanes."""
    import tvm
    from tvm import relax

    x = relax.Var("x", relax.TensorType((3, 5), "float32"))
    y = relax.Var("y", relax.TensorType((5,), "float32"))
    op = relax.op
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            c = op.greater(x, relax.const(0.25))
            s = bb.emit(op.where(c, relax.const(np.full((3, 5), 2, "float32")), x))
            t = bb.emit(op.where(op.less(y, relax.const(0.5)), y,
                                 relax.const(np.full((3, 5), 3, "float32"))))
            u = bb.emit(op.add(x, relax.const(np.full((5,), 4, "float32"))))
            out = bb.emit_output(relax.Tuple([s, t, u]))
        bb.emit_func_output(out)
    mod = bb.get()
    done = tsl.relax.imports.splat_constants()(mod)
    import tvm_ffi
    from tvm.ir.expr import Constant

    consts = []
    tvm_ffi.structural_walk(done["main"].body, [(Constant, consts.append)])
    ndims = sorted(c.value.numpy().ndim for c in consts if hasattr(c.value, "numpy"))
    # 0.25, 0.5 and 2 (was 3 x 5); the 3s stay 3 x 5 (the shape), the 4s a vector (an add)
    assert ndims == [0, 0, 0, 1, 2], ndims
    ex = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"),
                     relax_pipeline=tsl.relax.pipeline("cpu"),
                     tir_pipeline=tsl.relax.tir_pipeline("cpu"))
    rng = np.random.default_rng(9)
    xs, ys = rng.uniform(-1, 1, (3, 5)).astype("float32"), rng.uniform(-1, 1, 5).astype("float32")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    s, t, u = vm["main"](tvm.runtime.tensor(xs), tvm.runtime.tensor(ys))
    np.testing.assert_array_equal(s.numpy(), np.where(xs > 0.25, 2, xs))
    np.testing.assert_array_equal(t.numpy(), np.broadcast_to(np.where(ys < 0.5, ys, 3), (3, 5)))
    np.testing.assert_allclose(u.numpy(), xs + 4, rtol=1e-6)
