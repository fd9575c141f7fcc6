"""The graph's layout plan (`tsl.relax.channels_last`) and the vector rules for what it adds:
channels-last pooling and the NCHW <-> NHWC conversions."""

import numpy as np
import pytest

import tsl.relax
from tsl.schedules.vector import VectorFacts

torch = pytest.importorskip("torch", reason="the references and the imported model need PyTorch")


class _Stem(torch.nn.Module):
    """ResNet's start at 64 x 64: a 7x7 stride-2 stem conv-BN-relu, a max-pool, one residual
    block of 3x3 conv-BN pairs, then global pooling and a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(64, 64, 3, 1, 1, bias=False)
                                         for _ in range(2))
        self.bns = torch.nn.ModuleList(torch.nn.BatchNorm2d(64) for _ in range(3))
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.bns[0](self.stem(x)))
        x = torch.nn.functional.max_pool2d(x, 3, 2, 1)
        y = torch.relu(self.bns[1](self.convs[0](x)))
        x = torch.relu(self.bns[2](self.convs[1](y)) + x)
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _model_and_input():
    torch.manual_seed(0)
    model = _Stem()
    for bn in model.bns:  # statistics to fold that are not the identity
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.uniform_(-0.5, 0.5)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 64, 64)).astype("float32")
    return model.eval(), x


def _imported(model, x):
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad():
        ep = torch.export.export(model, (torch.from_numpy(x),))
    return from_exported_program(ep, keep_params_as_input=False)


def _matches_pytorch(mod, model, x):
    """`mod` compiled through the host's pipeline gives `model`'s output on `x`."""
    import tvm
    from tvm import relax

    ex = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"),
                     relax_pipeline=tsl.relax.pipeline("cpu"),
                     tir_pipeline=tsl.relax.tir_pipeline("cpu"))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    got = (out[0] if not hasattr(out, "numpy") else out).numpy()
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _activation_permutes(func) -> list:
    """The `permute_dims` calls of `func` on activations (not constants)."""
    import tvm
    import tvm_ffi
    from tvm import relax
    from tvm.ir.expr import Constant

    perm, found = tvm.ir.Op.get("relax.permute_dims"), []
    tvm_ffi.structural_walk(func.body, [(relax.Call, lambda c: found.append(c) if (
        c.op.same_as(perm) and not isinstance(c.args[0], Constant)) else None)], order="pre")
    return found


def test_a_residual_cnn_runs_channels_last_with_one_conversion_at_entry_and_exit():
    """On the AVX-512 machine file (any host: the plan is the model's, nothing is measured) the
    model prices every conv of the stem CNN enough cheaper in NHWC to pay the conversions: all
    of them are planned channels-last, the input converted once at the entry and the pooled
    (1, 1, 1, 64) result once at the exit; the max-pool between follows the layout."""
    import tvm

    from tsl.relax.channels_last import plan
    from tsl.tam import load

    model, x = _model_and_input()
    with tsl.relax.tvm_target("cpu"):
        mod = tvm.transform.Sequential(tsl.relax.import_passes())(_imported(model, x))
    planned, k = plan(mod, load("x86-avx512"))
    assert k == 3
    text = planned["main"].script()
    assert text.count('data_layout="NHWC"') == 3 and 'layout="NHWC"' in text  # the max-pool
    perms = _activation_permutes(planned["main"])
    assert len(perms) == 2
    assert perms[0].args[0].same_as(planned["main"].params[0])
    assert [int(d) for d in perms[1].args[0].ty.shape] == [1, 1, 1, 64]


def test_a_graph_named_forward_is_planned_and_two_public_graphs_are_left_alone():
    """A `relax.frontend.nn` export names its graph "forward": the plan takes the module's one
    public function whatever its name (the project's own ResNet-18 ran NCHW throughout while
    the plan looked for "main" alone); with two public functions it does not guess which is
    the model and leaves both NCHW."""
    import tvm

    from tsl.relax.channels_last import plan
    from tsl.tam import load

    model, x = _model_and_input()
    with tsl.relax.tvm_target("cpu"):
        f = tvm.transform.Sequential(tsl.relax.import_passes())(_imported(model, x))["main"]
    named = tvm.IRModule({"forward": f.with_attr("global_symbol", "forward")})
    planned, k = plan(named, load("x86-avx512"))
    assert k == 3 and planned["forward"].script().count('data_layout="NHWC"') == 3
    two = tvm.IRModule({"forward": f.with_attr("global_symbol", "forward"),
                        "other": f.with_attr("global_symbol", "other")})
    assert plan(two, load("x86-avx512"))[1] == 0


def test_the_planned_cnn_matches_pytorch_and_its_convs_read_nhwc():
    """Through `tsl.relax.pipeline("cpu")` (the host's machine plans it): the fused conv
    functions tsl takes read channels-last data wherever the plan says so, and the model's
    result matches PyTorch's."""
    import tvm

    from tsl.relax.channels_last import plan
    from tsl.relax.targets import machine_for

    model, x = _model_and_input()
    mod = _imported(model, x)
    with tsl.relax.tvm_target("cpu"):
        k = plan(tvm.transform.Sequential(tsl.relax.import_passes())(mod),
                 machine_for("cpu"))[1]
    rep = tsl.relax.report(mod, "cpu")
    # 3 convs and the linear head (the 3x3 convs' Winograd GEMM is one function called twice)
    assert sum(d.calls for d in rep.taken) == 4 and not rep.left
    _matches_pytorch(mod, model, x)
    tgt = tsl.relax.tvm_target("cpu")
    with tgt:
        fused = tvm.transform.Sequential(tsl.relax._stages(tgt, machine_for("cpu"))[0])(mod)
    # A 3x3 conv made Winograd (`tsl.relax.winograd`) reads its data in its input transform.
    calls = [b.value for blk in fused["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, tvm.relax.Call) and b.value.args
             and isinstance(b.value.args[0], tvm.ir.GlobalVar)
             and b.value.args[0].name_hint.startswith(("fused_conv2d", "winograd_input"))]
    shapes = [[int(d) for d in c.args[1].fields[0].ty.shape] for c in calls]  # the data's
    assert sum(s[1] == s[2] != s[3] for s in shapes) == k  # (1, H, W, C): channels-last


def test_a_conv_the_model_prices_alike_in_both_layouts_keeps_the_graph_nchw():
    """512 x 7 x 7 3x3 convs (ResNet-18's last stage: the model's two layouts within 1%):
    no conversion is planned, the module is returned as it was."""
    from tvm import relax

    from tsl.relax.channels_last import plan
    from tsl.tam import load

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 512, 7, 7), "float32"))
    w = relax.const(np.random.default_rng(1).standard_normal((512, 512, 3, 3)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)))
            out = bb.emit_output(relax.op.nn.conv2d(y, w, padding=1))
        bb.emit_func_output(out)
    mod = bb.get()
    planned, k = plan(mod, load("x86-avx512"))
    assert k == 0 and planned.same_as(mod)
    assert plan(mod, load("tensorcore-sm90"))[1] == 0  # a back end offering NCHW alone


def _permute(shape, axes):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.permute_dims(x, axes))
        bb.emit_func_output(out)
    return relax.transform.LegalizeOps()(bb.get())


@pytest.mark.parametrize("shape, axes, tiled", [
    ((1, 12, 8, 32), (0, 3, 1, 2), True),     # NHWC -> NCHW, 32 channels x 96 pixels
    ((1, 3, 20, 16), (0, 2, 3, 1), True),     # NCHW -> NHWC with 3 channels: input rows in vectors
    ((1, 7, 5, 19), (0, 3, 1, 2), False),     # 35 pixels, 19 channels: not whole vectors
    ((2, 16, 48), (0, 2, 1), True)])          # a batch of 2-D transposes
@pytest.mark.parametrize("bits", [512, 256])
def test_layout_conversions_are_tiled_transposes_and_match_numpy(shape, axes, tiled, bits):
    """A permutation swapping two runs of axes is scheduled by `transpose` (tiles of lanes x
    lanes, or the input's rows in vectors where the output's run is narrower than a vector)
    where its runs divide into vectors; the others by `injective`. Both match NumPy."""
    import tvm

    from tsl.schedules.transpose import transpose
    from tsl.schedules.vector import injective

    mod = _permute(shape, axes)
    gv = next(g for g, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc))
    facts = VectorFacts(vector_bits=bits, cores=2)
    sch = transpose(mod[gv], facts)
    assert (sch is not None) == tiled
    sch = sch or injective(mod[gv], facts)
    kernel = tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")})
    x = np.random.default_rng(2).standard_normal(shape).astype("float32")
    want = np.transpose(x, axes)
    out = tvm.runtime.tensor(np.full(want.shape, np.nan, "float32"))
    tvm.compile(kernel, target=tsl.relax.tvm_target("cpu"))(tvm.runtime.tensor(x), out)
    np.testing.assert_array_equal(out.numpy(), want)


def _pool(shape, op, stride):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    pool = relax.op.nn.max_pool2d if op == "max" else relax.op.nn.avg_pool2d
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(pool(x, 3, stride, 1, layout="NHWC"))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("op, channels", [("max", 32), ("max", 19), ("avg", 19)])
@pytest.mark.parametrize("stride, size", [(1, 13), (2, 21)])
def test_channels_last_pooling_is_vectorized_over_channels_and_matches_pytorch(
        op, channels, stride, size):
    """An NHWC max- or average pool: `channels_window` (pixels parallel, a vector of channels
    reduced over the window in a register, the average's divide after it in the vector), 19
    channels ending in a predicated vector. All match PyTorch."""
    import tvm
    from tvm import relax

    from tsl.relax.schedule_rest import rest_schedules

    mod = _pool((1, size, size, channels), op, stride)
    assert {r for r, _ in rest_schedules(mod, "cpu").values()} == {"channels_window"}
    ex = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"),
                     relax_pipeline=tsl.relax.pipeline("cpu"))
    x = np.random.default_rng(3).standard_normal((1, size, size, channels)).astype("float32")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    t = torch.from_numpy(x).permute(0, 3, 1, 2)
    ref = (torch.nn.functional.max_pool2d(t, 3, stride, 1) if op == "max" else
           torch.nn.functional.avg_pool2d(t, 3, stride, 1, count_include_pad=False))
    np.testing.assert_allclose(got, ref.permute(0, 2, 3, 1).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("stride", [1, 2])
def test_an_nhwc_depthwise_conv_with_bias_and_relu6_is_a_channels_window(stride):
    """An NHWC depthwise 3x3 conv (HWIO weights, 19 channels: not whole vectors at 8 or 16
    lanes, 15 x 15: a stride-2 output of 8) with its bias and ReLU6 fused: `channels_window`
    (not `window`, whose column vectors would gather channels), matching PyTorch."""
    import tvm
    from tvm import relax

    from tsl.relax.schedule_rest import rest_schedules

    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 15, 15, 19)).astype("float32")
    w = rng.standard_normal((3, 3, 1, 19)).astype("float32")
    b = rng.standard_normal(19).astype("float32")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(xv, relax.const(w), strides=stride, padding=1, groups=19,
                                   data_layout="NHWC", kernel_layout="HWIO")
            y = relax.op.add(y, relax.const(b.reshape(1, 1, 1, 19)))
            out = bb.emit_output(relax.op.clip(y, 0.0, 6.0))
        bb.emit_func_output(out)
    mod = bb.get()
    ex = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"),
                     relax_pipeline=tsl.relax.pipeline("cpu"))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2),
                                     torch.from_numpy(w).permute(3, 2, 0, 1),
                                     torch.from_numpy(b), stride, 1, groups=19).clamp(0, 6)
    np.testing.assert_allclose(got, ref.permute(0, 2, 3, 1).numpy(), rtol=1e-5, atol=1e-5)
    assert {r for r, _ in rest_schedules(mod, "cpu").values()} == {"channels_window"}


class _Inverted(torch.nn.Module):
    """MobileNetV2's start at 32 x 32: a 3x3 stride-2 stem conv-BN-ReLU6, then an inverted
    residual block (1x1 expansion, 3x3 depthwise, each BN-ReLU6; 1x1 projection-BN; the
    residual add), then global pooling and a linear head."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList([
            torch.nn.Conv2d(3, 16, 3, 2, 1, bias=False), torch.nn.Conv2d(16, 48, 1, bias=False),
            torch.nn.Conv2d(48, 48, 3, 1, 1, groups=48, bias=False),
            torch.nn.Conv2d(48, 16, 1, bias=False)])
        self.bns = torch.nn.ModuleList(torch.nn.BatchNorm2d(c) for c in (16, 48, 48, 16))
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.nn.functional.relu6(self.bns[0](self.convs[0](x)))
        y = x
        for conv, bn in zip(self.convs[1:3], self.bns[1:3]):
            y = torch.nn.functional.relu6(bn(conv(y)))
        x = x + self.bns[3](self.convs[3](y))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def test_an_inverted_residual_block_is_planned_channels_last_through_its_depthwise_conv():
    """The block's depthwise conv and ReLU6 (`clip`, which has no layout rule in TVM 0.27) no
    longer end the plan: on the AVX-512 machine file all four convs are channels-last with one
    conversion at the entry and one at the exit, the ReLU6s still clips; through the host's
    pipeline the result matches PyTorch."""
    import tvm

    from tsl.relax.channels_last import plan
    from tsl.tam import load

    torch.manual_seed(0)
    model = _Inverted()
    for bn in model.bns:  # statistics to fold that are not the identity
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    model.eval()
    x = np.random.default_rng(5).uniform(-1, 1, (1, 3, 32, 32)).astype("float32")
    mod = _imported(model, x)
    with tsl.relax.tvm_target("cpu"):
        imported = tvm.transform.Sequential(tsl.relax.import_passes())(mod)
    planned, k = plan(imported, load("x86-avx512"))
    text = planned["main"].script()
    assert k == 4 and text.count('data_layout="NHWC"') == 4 and text.count("R.clip") == 3
    assert len(_activation_permutes(planned["main"])) == 2
    _matches_pytorch(mod, model, x)
