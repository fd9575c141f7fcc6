"""Issue #24 part 3: imported graphs leave no PrimFunc unscheduled on the CPU, and still match
PyTorch. Three small `torch.nn` stand-ins for the bench's models (a residual CNN with BatchNorm,
a MobileNet-style inverted residual, a small TransformerEncoderLayer), each through torch.export
and through ONNX."""

import numpy as np
import pytest
import tvm

import tsl.relax
import tsl.relax.schedule_rest
from conftest import error_vs_torch
from tsl.relax.schedule_rest import unscheduled

torch = pytest.importorskip("torch", reason="the stand-in models are torch.nn modules "
                                            "(pip install -e '.[test]' brings the CPU build)")


class Residual(torch.nn.Module):
    def __init__(self, c=12):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn0 = torch.nn.BatchNorm2d(c)
        self.conv = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.pool = torch.nn.MaxPool2d(3, 2, 1)
        self.fc = torch.nn.Linear(c, 5)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn0(self.stem(x))))
        x = torch.relu(self.bn1(self.conv(x)) + x)
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


class InvertedResidual(torch.nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise (stride 1 and 2), 1x1 project, skip."""

    def __init__(self, c=8, e=3):
        super().__init__()
        h = c * e
        self.expand = torch.nn.Sequential(torch.nn.Conv2d(c, h, 1, bias=False),
                                          torch.nn.BatchNorm2d(h), torch.nn.ReLU6())
        self.dw = torch.nn.Sequential(torch.nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False),
                                      torch.nn.BatchNorm2d(h), torch.nn.ReLU6())
        self.project = torch.nn.Sequential(torch.nn.Conv2d(h, c, 1, bias=False),
                                           torch.nn.BatchNorm2d(c))
        self.down = torch.nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c)

    def forward(self, x):
        x = x + self.project(self.dw(self.expand(x)))
        return torch.nn.functional.relu6(self.down(x)).mean((2, 3))


def _encoder():
    return torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)


STAND_INS = {
    "residual": (Residual, (1, 3, 17, 17)),
    "inverted_residual": (InvertedResidual, (1, 8, 15, 15)),
    "encoder": (_encoder, (1, 11, 32)),
}


def _model(name):
    torch.manual_seed(0)
    make, shape = STAND_INS[name]
    model = make()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):   # statistics that are not the identity
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    x = np.random.default_rng(5).uniform(-1, 1, shape).astype("float32")
    return model.eval(), x


def _imported(model, x, frontend, tmp_path):
    if frontend == "torch":
        from tvm.relax.frontend.torch import from_exported_program

        with torch.no_grad():
            ep = torch.export.export(model, (torch.from_numpy(x),))
        return from_exported_program(ep, keep_params_as_input=False)
    pytest.importorskip("onnx", reason="the ONNX frontend needs the onnx package")
    pytest.importorskip("onnxscript", reason="torch.onnx.export (dynamo) needs onnxscript")
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    path = tmp_path / "model.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (torch.from_numpy(x),), str(path), dynamo=True)
    return from_onnx(onnx.load(str(path)), keep_params_in_input=False)


@pytest.mark.parametrize("frontend", ["torch", "onnx"])
@pytest.mark.parametrize("name", sorted(STAND_INS))
def test_imported_stand_ins_leave_nothing_unscheduled_and_match_pytorch(name, frontend, tmp_path):
    model, x = _model(name)
    mod = _imported(model, x, frontend, tmp_path)
    assert unscheduled(mod, "cpu") == []
    # and as compiled: the functions `tsl.relax.chains` merged after the swap are scheduled too
    left = []
    tgt = tsl.relax.tvm_target("cpu")
    facts = tsl.relax.schedule_rest._facts("cpu")
    with tgt:
        tvm.transform.Sequential(tsl.relax._stages(tgt)[0] + [
            tsl.relax.swap_pass("cpu"), tsl.relax.layout_pass(),
            tsl.relax.schedule_rest.schedule_rest(facts, left)])(mod)
    assert left == []
    err = error_vs_torch(mod, model, x)
    assert err < 1e-4, err


@pytest.mark.parametrize("target", ["tensorcore-sm80", "tensorcore-sm90"])
@pytest.mark.parametrize("name", sorted(STAND_INS))
def test_on_tensor_cores_dlight_binds_every_other_function_and_the_report_says_which(name, target,
                                                                                      tmp_path):
    model, x = _model(name)
    mod = _imported(model, x, "torch", tmp_path)
    rest = tsl.relax.schedule_rest.rest_schedules(mod, target)
    assert rest and all(rule and rule.startswith("dlight.gpu.") for rule, _ in rest.values()), rest
    rep = tsl.relax.report(mod, target)
    taken = {d.function for d in rep.taken}
    assert set(rep.rest) == set(rest) - taken and "UNSCHEDULED" not in str(rep)


@pytest.mark.parametrize("name", sorted(STAND_INS))
def test_the_stand_ins_compile_for_tensor_cores(name, tmp_path):
    """No GPU here: the CUDA code is generated and compiled (nvcc), not run."""
    import shutil

    import tvm

    if shutil.which("nvcc") is None:
        pytest.skip("generating the CUDA module needs the CUDA toolkit's nvcc on PATH")
    model, x = _model(name)
    mod = _imported(model, x, "torch", tmp_path)
    ex = tvm.compile(mod, target=tsl.relax.tvm_target("tensorcore-sm90"),
                     relax_pipeline=tsl.relax.pipeline("tensorcore-sm90"))
    host = list(ex.mod.imports)
    cuda = [m for m in host + [i for h in host for i in h.imports] if m.kind == "cuda"]
    assert cuda, [m.kind for m in host]
    source = cuda[0].inspect_source()
    assert source.count("__global__") >= 2 and "blockIdx" in source
