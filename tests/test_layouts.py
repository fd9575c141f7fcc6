"""Layouts planned across tsl's kernels (`tsl.relax.layouts`): the crop / pad copies the swap
puts between consecutive kernels are gone (counted in the module the pipeline compiles), and the
model still matches PyTorch."""

import numpy as np
import pytest

import tsl.relax
from conftest import error_vs_torch
from tsl.relax.layouts import is_prefix, layout_calls

torch = pytest.importorskip("torch", reason="the torch frontend tests need PyTorch "
                                            "(pip install -e '.[test]' brings the CPU build)")

C = 20  # not a multiple of any CPU kernel's channel block (8, 16): every conv pads its output


class PaddedResidual(torch.nn.Module):
    """Convs of 20 channels with two residual adds, a depthwise conv between them (TVM's
    function, not a tsl kernel) and a 10-class head: each conv output is cropped by the swap,
    each residual padded back. (3x3 convs: a 1x1 conv may become the GEMM that reads and
    writes NCHW in place, `match.pixels_on_lanes`, with nothing to crop or pad.)"""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, C, 3, padding=1)
        self.conv1 = torch.nn.Conv2d(C, C, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(C, C, 3, padding=1)
        self.dw = torch.nn.Conv2d(C, C, 3, padding=1, groups=C)
        self.conv3 = torch.nn.Conv2d(C, C, 3, padding=1)
        self.fc = torch.nn.Linear(C, 10)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))) + x)
        y = torch.nn.functional.relu6(self.dw(x))
        x = self.conv3(y) + x
        return self.fc(x.mean((2, 3)))


def _imported(model, x):
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad():
        ep = torch.export.export(model, (torch.from_numpy(x),))
    return from_exported_program(ep, keep_params_as_input=False)


def _swapped(mod):
    """`mod` through the pipeline's stages up to the swap."""
    import tvm

    tgt = tsl.relax.tvm_target("cpu")
    before, _ = tsl.relax._stages(tgt)
    with tgt:
        return tvm.transform.Sequential(before + [tsl.relax.swap_pass("cpu")])(mod)


@pytest.fixture(scope="module")
def model_and_input():
    torch.manual_seed(0)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 12, 12)).astype("float32")
    return PaddedResidual().eval(), x


def test_the_crops_and_pads_between_kernels_are_gone(model_and_input):
    model, x = model_and_input
    swapped = _swapped(_imported(model, x))
    swapped, planned = layout_calls(swapped), layout_calls(tsl.relax.layout_pass()(swapped))
    # Four convs write padded channels; two of their outputs are residuals of the next.
    assert swapped.get("crop", 0) >= 5 and swapped.get("pad", 0) == 2, swapped
    # What is left: the head's crop, at the graph's exit (the result is a tensor of its own);
    # every channel crop is a view of the kernel's output, every residual reads it in place.
    assert planned.get("pad", 0) == 0 and planned.get("crop", 0) == 1, planned
    assert planned["view"] == swapped["crop"] - 1, (swapped, planned)


def test_the_planned_model_matches_pytorch_call_after_call(model_and_input):
    import tvm
    from tvm import relax

    model, x = model_and_input
    ex = tvm.compile(_imported(model, x), target=tsl.relax.tvm_target("cpu"),
                     relax_pipeline=tsl.relax.pipeline("cpu"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    xs = [x, np.random.default_rng(1).uniform(-1, 1, x.shape).astype("float32")]
    # Both results kept: a view must not be handed to the next call's buffers.
    outs = [vm["main"](tvm.runtime.tensor(v)) for v in xs]
    for v, out in zip(xs, outs):
        out = (out if hasattr(out, "numpy") else out[0]).numpy()
        with torch.no_grad():
            ref = model(torch.from_numpy(v)).numpy()
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-4


def test_a_crop_is_a_view_only_when_its_elements_lead_the_buffer():
    assert is_prefix((1, 24, 56, 56), (1, 32, 56, 56))  # channels at batch 1
    assert is_prefix((1, 1000), (1, 1008))  # columns of one row
    assert not is_prefix((2, 24, 56, 56), (2, 32, 56, 56))  # the second image starts later
    assert not is_prefix((128, 1000), (128, 1008))  # every row is longer
    assert not is_prefix((1, 24, 56), (1, 24, 56, 56))  # a reshape, not a crop


def test_onnx_clip_bounds_are_written_into_the_tail_and_the_model_matches(tmp_path):
    """ONNX's Clip passes its bounds as 0-d tensors: the element-wise tail after the kernel
    gets them as numbers (a 0-d load per element would keep it from vectorizing)."""
    pytest.importorskip("onnx", reason="the ONNX frontend test needs the onnx package")
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript")
    import onnx
    import tvm
    from tvm import relax, tirx
    from tvm.relax.frontend.onnx import from_onnx

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, C, 3, padding=1), torch.nn.ReLU6(),
                                torch.nn.Conv2d(C, C, 1), torch.nn.ReLU6()).eval()
    x = np.random.default_rng(2).uniform(-1, 1, (1, 3, 10, 10)).astype("float32")
    path = tmp_path / "clipped.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (torch.from_numpy(x),), str(path), dynamo=True)
    mod = from_onnx(onnx.load(str(path)), keep_params_in_input=False)
    swapped = _swapped(mod)
    tails = [f for gv, f in swapped.functions.items() if isinstance(f, tirx.PrimFunc)
             and f.attrs is not None and str(f.attrs.get("tsl.layout", "")) == "tail"]
    for f in tails:
        assert all(len(p.ty.shape) for p in f.params), f.script()
    assert error_vs_torch(mod, model, x) < 1e-4
