"""VTA pieces for whole networks: the residual epilogue step (a ResNet skip connection) runs on
VTA as LOAD ACC_8BIT of the int8 residual tile + ALU ADD before the requantize, bit-exact with
NumPy, in the project's programs and in the classic baseline's."""

import numpy as np
import pytest

import tsl
import tsl.relax
from tsl.backends.vta import classic
from tsl.backends.vta.isa import Alu, AluOp, Load, Mem
from tsl.ops import bias, relu, requantize, residual


def check(art, seed=3):
    xs = art.op.random_inputs(seed)
    res = xs[[t.name for t in art.op.inputs].index("residual")]
    assert res.dtype == np.int8 and np.any(res < 0) and np.any(res > 0)
    np.testing.assert_array_equal(art.run(*xs), art.op.reference(*xs))
    return xs


@pytest.mark.parametrize("op", [
    tsl.ops.conv2d(1, 32, 10, 10, 48, 3, 3, padding=1, dtype="int8",
                   epilogue=bias() + residual() + requantize(8, clip=(0, 127))),
    tsl.ops.conv2d(1, 24, 8, 8, 40, 1, 1, stride=2, dtype="int8",
                   epilogue=residual() + relu() + requantize(4)),       # 40: not a multiple of 16
    tsl.ops.matmul(33, 40, 50, dtype="int8", epilogue=residual() + requantize(6)),
], ids=str)
def test_a_residual_step_runs_on_the_alu_bit_exact(op):
    art = tsl.build(op, "vta")
    check(art)
    insns = art.program().insns
    loads = [i for i in insns if isinstance(i, Load) and i.mem == Mem.ACC_8BIT]
    adds = [i for i in insns if isinstance(i, Alu) and i.alu_op == AluOp.ADD and not i.use_imm]
    assert loads and adds, "the residual is loaded into ACC and added there, not on the host"


def test_the_residual_is_added_before_the_shift_so_the_order_matters():
    """residual + requantize and requantize-then-add differ: the program follows the steps."""
    op = tsl.ops.conv2d(1, 16, 6, 6, 16, 3, 3, padding=1, dtype="int8",
                        epilogue=residual() + requantize(6))
    art = tsl.build(op, "vta")
    x, w, r = check(art, seed=7)
    acc = tsl.ops.conv2d(1, 16, 6, 6, 16, 3, 3, padding=1, dtype="int8").reference(x, w)
    after = np.clip((acc >> 6) + r.astype(np.int32), -128, 127).astype(np.int8)
    assert not np.array_equal(art.run(x, w, r), after)


def test_a_resnet_layer_with_a_residual_in_the_classic_tiles_and_the_default():
    op = tsl.ops.conv2d(1, 512, 7, 7, 512, 3, 3, padding=1, dtype="int8",
                        epilogue=bias() + residual() + requantize(8, clip=(0, 127)))
    art = tsl.build(op, "vta")
    base = classic.build(op, art.machine)
    check(art)
    check(base)
    assert base.estimate().cycles > art.estimate().cycles > 0


# -- quantize: power-of-two post-training quantization of an imported float model -----------

@pytest.fixture(scope="module")
def small_cnn():
    """A conv-BN-relu, a residual conv-BN block and a linear head, imported through
    torch.export + TVM's torch frontend, with calibration samples and PyTorch's output."""
    torch = pytest.importorskip("torch", reason="the import needs PyTorch (the test extra)")
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
            self.c2, self.b2 = torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
            self.fc = torch.nn.Linear(16, 10)

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            z = torch.relu(self.b2(self.c2(y)) + y)
            return self.fc(torch.nn.functional.adaptive_avg_pool2d(z, 1).flatten(1))

    net = Net().eval()
    for bn in (net.b1, net.b2):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.uniform_(0.5, 1.5)
    cal = [np.random.default_rng(i).standard_normal((1, 3, 16, 16), np.float32) for i in range(4)]
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(net, (torch.tensor(cal[0]),)))
        want = net(torch.tensor(cal[0])).numpy()
    return mod, cal, want


def _run(mod, pipeline, x):
    import tvm
    from tvm import relax

    ex = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"), relax_pipeline=pipeline)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return (out[0] if not hasattr(out, "numpy") else out).numpy()


def test_quantize_makes_every_layer_int8_with_shift_requantize_and_stays_close(small_cnn):
    mod, cal, want = small_cnn
    q = tsl.relax.quantize(mod, calibration=cal, scheme="power_of_two")
    text = q.script()
    assert "batch_norm" not in text and text.count('out_dtype="int32"') == 3
    # int8 from layer to layer: one quantize of the float image, one dequantize (the pooling).
    assert text.count("R.round") == 2 and text.count("R.nn.relu") == 0
    got = _run(q, tsl.relax.pipeline("cpu"), cal[0])
    # tsl's int8 kernels and TVM's own lowering of the same quantized graph: bit-exact.
    np.testing.assert_array_equal(got, _run(q, "default", cal[0]))
    assert np.abs(got - want).max() < 0.15 * np.abs(want).max()  # against PyTorch's float


def test_quantize_can_leave_the_first_layer_in_float(small_cnn):
    mod, cal, _ = small_cnn
    q = tsl.relax.quantize(mod, calibration=cal[:1], skip_first=True)
    assert q.script().count('out_dtype="int32"') == 2


def test_quantize_refuses_what_vta_cannot_requantize(small_cnn):
    from tsl.errors import InputError

    mod, cal, _ = small_cnn
    with pytest.raises(InputError, match="power_of_two"):
        tsl.relax.quantize(mod, calibration=cal, scheme="per_channel_float")
    with pytest.raises(InputError, match="calibration"):
        tsl.relax.quantize(mod, calibration=[])


def test_each_quantized_layer_runs_on_vta_bit_exact_with_the_cpu_int8_path(small_cnn):
    """The int8 layers of the quantized model (tsl.relax.vta_layers.scan), each run in the
    simulator on the int8 input the CPU computes for it, give the CPU's int8 output."""
    import tvm
    from tvm import relax

    from tsl.relax.quantize import probe
    from tsl.relax.vta_layers import scan

    mod, cal, _ = small_cnn
    q = tsl.relax.quantize(mod, calibration=cal)
    fn = relax.transform.ToNonDataflow()(q)["main"]
    layers, why = scan(fn)
    assert [l.op.name for l in layers] == ["conv2d", "conv2d", "dense"] and not why
    kinds = [s.kind for s in layers[1].op.epilogue.steps]
    assert kinds[:3] == ["bias", "shift", "residual"] and kinds[-1] == "clip", \
        "the skip connection is fused in conv 2's epilogue"
    assert layers[1].residual.same_as(layers[0].y) and layers[1].x.same_as(layers[0].y)
    assert layers[0].op.epilogue.steps[-1].value == (0, 127), "the relu is the clip's 0"
    (vals,) = probe(fn, [e for l in layers for e in (l.x, l.y)], cal[:1])
    for i, layer in enumerate(layers):
        x, want = vals[2 * i], vals[2 * i + 1]
        assert x.dtype == want.dtype == np.int8 and np.any(x) and np.any(want)
        got = tsl.build(layer.op, "vta").run(*layer.args(x, vals[1] if i == 1 else None))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("skip_first", [False, True])
def test_the_network_runs_with_its_layers_on_vta_bit_exact_and_the_classic_baseline_runs(
        small_cnn, skip_first):
    import tvm

    mod, cal, _ = small_cnn
    q = tsl.relax.quantize(mod, calibration=cal, skip_first=skip_first)
    want = _run(q, tsl.relax.pipeline("cpu"), cal[1])
    ex = tvm.compile(q, target=tsl.relax.tvm_target("vta"),
                     relax_pipeline=tsl.relax.pipeline("vta"))
    (got,), stats = tsl.relax.run_vta(ex, cal[1])
    np.testing.assert_array_equal(got, want)
    if skip_first:
        assert len(stats["layers"]) == 2
        return
    # conv 1's output reaches conv 2 (its input and its residual) in VTA's blocked layout;
    # conv 1's padded 3-channel input and the CPU's pooling get NCHW.
    assert [l["blocked"] for l in stats["layers"]] == [["out"], ["A", "residual"], []]
    assert len(stats["layers"]) == 3 and stats["cycles"] == sum(
        l["cycles"] for l in stats["layers"]) > 0
    assert all(l["sim_s"] > 0 for l in stats["layers"]), "every VTA layer ran in the simulator"
    assert stats["model_cycles"] == sum(l["model_cycles"] for l in stats["layers"]) > 0
    (base,), bstats = tsl.relax.run_vta(q, cal[1], classic=True)
    np.testing.assert_array_equal(base, want)


def test_a_model_for_vta_compiles_for_the_host_cpu():
    assert tsl.relax.tvm_target("vta").kind.name == "llvm"
    assert str(tsl.relax.tvm_target("vta-1x32x32")) == str(tsl.relax.tvm_target("cpu"))


def test_report_says_which_calls_go_to_vta_and_why_the_rest_stays_on_the_cpu(small_cnn):
    mod, cal, _ = small_cnn
    rep = tsl.relax.report(tsl.relax.quantize(mod, calibration=cal, skip_first=True), "vta")
    text = str(rep)
    assert len(rep.layers) == 2 and "bias+shift+residual" in text, text
    assert "relax.nn.conv2d: float or non-constant weights" in text
    assert "mean x1: not in the vta-1x16x16 ISA" in text, text
    # The CPU's casts: to int8 the float conv's output (conv 2's input and residual: one) and
    # the pooling's; to float conv 2's and the head's outputs. The residual's cast in conv 2's
    # chain is VTA's (LOAD ACC_8BIT).
    assert "astype x4:" in text, text


def test_a_downsampling_block_fuses_its_add_into_the_main_path_conv_and_runs_bit_exact():
    """Two layers meet in the add (conv-BN and the 1x1 downsample conv-BN): the add and relu
    go with torch's main path (`out += identity`), the downsample is its own VTA layer whose
    int8 output is the residual; channels 24 and 40 are not multiples of VTA's 16."""
    torch = pytest.importorskip("torch", reason="the import needs PyTorch (the test extra)")
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(1)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(24, 40, 3, 2, 1, bias=False)
            self.b1 = torch.nn.BatchNorm2d(40)
            self.d, self.bd = torch.nn.Conv2d(24, 40, 1, 2, bias=False), torch.nn.BatchNorm2d(40)

        def forward(self, x):
            return torch.relu(self.b1(self.c1(x)) + self.bd(self.d(x))).mean((2, 3))

    net = Block().eval()
    cal = [np.random.default_rng(i).standard_normal((1, 24, 9, 9), np.float32) for i in range(3)]
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(net, (torch.tensor(cal[0]),)))
    q = tsl.relax.quantize(mod, calibration=cal)
    rep = tsl.relax.report(q, "vta")
    assert len(rep.layers) == 2 and "residual" not in rep.layers[0] \
        and "residual" in rep.layers[1] and rep.layers[1].endswith("clip)"), str(rep)
    want = _run(q, tsl.relax.pipeline("cpu"), cal[2])
    (got,), stats = tsl.relax.run_vta(q, cal[2])
    np.testing.assert_array_equal(got, want)
    assert len(stats["layers"]) == 2 and np.any(got)


def _bound_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "vta_network_bound.py"
    spec = importlib.util.spec_from_file_location("vta_network_bound", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name,epilogue,near", [
    ("C11", bias() + requantize(9, clip=(0, 127)), 1.05),
    ("C5", bias() + tsl.ops.shift(9) + residual() + requantize(1, clip=(0, 127)), 1.05),
    ("C10", bias() + requantize(9, clip=(-128, 127)), 1.5),
], ids=["C11", "C5-residual", "C10"])
def test_no_program_beats_the_compute_floor_of_benchmarks_vta_network_bound(name, epilogue,
                                                                           near):
    """The floor that benchmarks/vta_network_bound.py proves the 1.3x goal out of reach with is
    below what tsl's program and the classic tiles take; tsl's 3x3 programs are within 5% of
    it (the 1x1 C10, whose first tiles' load is exposed, within 50%)."""
    hw, cin, cout, k, pad, stride = classic.LAYERS[name]
    op = tsl.ops.conv2d(1, cin, hw, hw, cout, k, k, stride=stride, padding=pad, dtype="int8",
                        epilogue=epilogue)
    art = tsl.build(op, "vta")
    floor, with_bias = _bound_script()._floors(op, art.program().config)
    assert floor < with_bias <= art.estimate().cycles <= near * with_bias
    assert with_bias <= classic.build(op, art.machine).estimate().cycles
