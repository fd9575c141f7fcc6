"""An NCHW 1x1 conv as out[co, pixels] = W[co, ci] @ X[ci, pixels] with the pixels on the vector
lanes (`matmul(activation_b=True)`): the activation read in place (not packed, not padded, its
last columns predicated), and the Relax swap taking it for a 1x1 conv where the model prices it
below the implicit GEMM."""

import dataclasses

import numpy as np
import pytest

import tsl
from tsl import ops
from tsl.backends.cpu import host
from tsl.errors import ScheduleError
from tsl.model.cost import feed_efficiency
from tsl.record import record

from conftest import cpu_machines

tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402
from tvm.relax.frontend import nn  # noqa: E402

import tsl.relax  # noqa: E402
from tsl.bench import models as bench  # noqa: E402
from tsl.relax import match, models  # noqa: E402


@pytest.fixture(params=cpu_machines())
def machine(request):
    return host.specialize(tsl.load_machine(request.param), host.info())


def _lanes(machine) -> int:
    return machine.primitive("float32").n


@pytest.mark.parametrize("pixels,epilogue", [(49, "bias_clip"), (196, "bias_residual"),
                                             (7 * 9, "bias_clip"), (7 * 9, "bias_residual")])
def test_in_place_gemm_against_numpy(machine, pixels, epilogue):
    """Pixel counts no multiple of the lanes; channels no multiple of the row tile either."""
    ep = (ops.bias() + ops.clip(0.0, 6.0) if epilogue == "bias_clip"
          else ops.bias() + ops.residual())
    op = ops.matmul(37, pixels, 24, epilogue=ep, activation_b=True)
    art = tsl.build(op, machine)
    # Read in place: the kernel takes B and the residual at their own shapes (no padded copy).
    assert art.ctx.op.input("B").shape == (24, pixels)
    assert art.ctx.op.output.shape == (37, pixels) and not art.ctx.layouts
    xs = op.random_inputs(5)
    ok, err = op.check(art.run(*xs), op.reference(*xs))
    assert ok, f"{op} on {machine.name}: error {err}"
    # The bias runs along the rows (output channels): a column-wise bias would differ.
    assert op.input("bias").shape == (37,)


def _whole_vectors(machine, **options) -> bool:
    art = tsl.build(ops.matmul(16, 196, 8, activation_b=True), machine,
                    knobs={"n_inner": 1, "n_outer": 1, "m_inner": 4}, **options)
    ll = art.executable.mod.inspect_source("ll")
    lanes = _lanes(machine)
    return f"<{lanes} x float> @llvm.fmuladd" in ll or f"<{lanes} x float> @llvm.fma" in ll


def test_whole_tiles_stay_vectors(machine):
    """The predicated edge is split off (LoopPartition): the whole tiles' FMAs stay full vectors
    of the machine's lanes; left under the predicate, TVM scalarizes every tile."""
    assert _whole_vectors(machine)


def test_whole_tiles_stay_vectors_on_aarch64():
    """The in-place GEMM builds for NEON (cross-compiled: no aarch64 host needed) with FMAs of
    its 4 lanes. (Of 4 lanes LLVM also rebuilds vectors from a scalarized tile: here the test
    guards the build, the x86 one the split.)"""
    assert _whole_vectors(tsl.load_machine("aarch64-neon"), cross=True)


def test_in_place_needs_a_vector_fma_primitive():
    """A primitive that reads several rows or reduction steps at once cannot read B in place:
    a typed error saying what to change (the swap then keeps the implicit GEMM)."""
    m = tsl.load_machine("x86-avx512")  # int8: a 4-step VNNI dot
    with pytest.raises(ScheduleError, match="activation_b"):
        record(ops.matmul(16, 49, 32, dtype="int8", activation_b=True), m, None)


def _tile(op, machine, **knobs):
    s = record(op, machine, None, knobs or None)
    return s, (s.knob_values["m_inner"], s.knob_values["n_inner"])


@pytest.mark.parametrize("hw,ci,co,tiles", [(28, 192, 32, {(8, 3)}),
                                            (14, 384, 96, {(8, 3), (12, 2)})])
def test_model_ranks_the_in_place_tiles_as_measured(hw, ci, co, tiles):
    """MobileNetV2's 192x28x28->32 + residual and 384x14x14->96 as the in-place GEMM on the
    AVX-512 file: the model picks a tile of 24 accumulators that needs few loads per FMA, not
    16x1 (17 loads for 16 FMAs), which it took while it priced unpacked operands' loads at two
    a cycle. Measured here (benchmarks/README.md, mnv39p; kernels alternating, medians): 8x3
    0.049 / 0.065 ms against 16x1 0.059 / 0.080 at 28x28, 8x3 and 12x2 0.081 against 16x1
    0.140 at 14x14. The search covers the variant's whole knob space."""
    m = tsl.load_machine("x86-avx512")
    ep = ops.bias() + ops.residual() if hw == 28 else ops.bias()
    op = ops.matmul(co, hw * hw, ci, epilogue=ep, activation_b=True)
    s, pick = _tile(op, m)
    assert pick in tiles and s.choice.exhaustive, tsl.model.explain(s, top=3)
    slow, _ = _tile(op, m, m_inner=16, n_inner=1)
    assert tsl.model.evaluate(slow).seconds > 1.2 * tsl.model.evaluate(s).seconds


@pytest.mark.parametrize("co,pixels,ci,outer", [(24, 56 * 56, 96, ("n",)),
                                                (32, 28 * 28, 192, ("n",)),
                                                (12, 7 * 9, 40, ("n",)), (300, 7 * 7, 24, ("m",)),
                                                (96, 14 * 14, 384, ("n", "m"))])
def test_in_place_gemm_splits_its_larger_operand_over_the_cores(machine, co, pixels, ci, outer):
    """The in-place GEMM's parallel block loop cuts the larger operand: by columns ("n") where
    the activation B (ci x pixels) is several times the weights A (co x ci), so no core reads
    all of what the previous kernel has just written on the other core; by rows where A is.
    The model priced both splits level and took rows for MobileNetV2's projections
    (96x56x56->24: 0.27 ms in the model against 0.11 split by columns; benchmarks/README.md,
    mnv40); now only the larger operand's split is offered there, whatever order the search
    meets the settings in; near a tie (B twice A) both. The model's choice is read from the
    recorded schedule; built and checked against NumPy (with a residual, channels and pixels
    no multiple of the tile) where the operator is small: the MobileNetV2 sizes compile the
    same nest as the small operator of the same split."""
    op = ops.matmul(co, pixels, ci, epilogue=ops.bias() + ops.residual(), activation_b=True)
    s = record(op, machine)
    assert s.space["outer"] == outer
    assert s.knob_values["outer"] in outer
    if co * pixels * ci > 10 ** 6:
        return
    art = tsl.build(op, machine, knobs=s.knob_values)
    xs = op.random_inputs(3)
    ok, err = op.check(art.run(*xs), op.reference(*xs))
    assert ok, f"{op} on {machine.name}: error {err}"


EVERY = (("oh", "co"), ("n_oh_co", "co", "oh"))
ROWS = (EVERY[0], ("oh",))
CHANNELS = (("co",), ("n_oh_co", "co"))


@pytest.mark.parametrize("c,hw,k,r,stride,space,layout", [(384, 14, 64, 1, 1, ROWS, "NCHW"),
                                                           (40, 9, 24, 1, 1, ROWS, "NCHW"),
                                                           (40, 9, 24, 1, 2, ROWS, "NCHW"),
                                                           (320, 7, 1280, 1, 1, CHANNELS, "NCHW"),
                                                           (40, 5, 96, 1, 1, CHANNELS, "NCHW"),
                                                           (384, 14, 96, 1, 1, EVERY, "NCHW"),
                                                           (64, 28, 288, 1, 2, EVERY, "NCHW"),
                                                           (24, 9, 16, 3, 1, EVERY, "NCHW"),
                                                           (24, 9, 16, 3, 2, EVERY, "NCHW"),
                                                           (24, 5, 96, 3, 1, EVERY, "NCHW"),
                                                           (24, 5, 96, 3, 1, CHANNELS, "NHWC"),
                                                           (16, 8, 16, 3, 1, CHANNELS, "NHWC"),
                                                           (40, 9, 24, 1, 1, EVERY, "NHWC")])
def test_pointwise_conv_splits_the_larger_operand(machine, c, hw, k, r, stride, space, layout):
    """A 1x1 implicit-GEMM conv where one operand is 3x the other spreads over the cores only
    splits that cut the larger one, as its in-place GEMM form does. Input 3x the weights
    (input pixels >= 3 x output channels): only the row blocks, so each core reads its own
    rows of the activation (MobileNetV2's 384x14x14->64 + residual, 0.415 -> 0.325 ms over
    three calls in the model, mnv40; stride 2 too: ResNet-18's downsample 64x56x56->128,
    0.155 -> 0.106 ms in the model, res41; benchmarks/README.md). Weights 3x the input
    (output channels >= 3 x pixels): the channel blocks outermost and split, so each core
    streams half the weights (320x7x7->1280, and the other 7x7 convs, mnv41); an NHWC conv with
    a window as soon as its weights are the larger (K x R x S >= pixels: ResNet-18's 3x3 convs
    at 28x28 and 14x14, res43). Near a tie, for an NCHW 3x3 conv and for an NHWC conv's
    larger input, every split. Checked against NumPy with a residual, 9 and 5 columns no
    multiple of the tile."""
    op = ops.conv2d(1, c, hw, hw, k, r, r, stride=stride, padding=r // 2, layout=layout,
                    epilogue=ops.bias() + ops.residual())
    art = tsl.build(op, machine)
    assert (art.schedule.space["outer"], art.schedule.space["parallel_axes"]) == space
    xs = op.random_inputs(4)
    ok, err = op.check(art.run(*xs), op.reference(*xs))
    assert ok, f"{op} on {machine.name}: error {err}"


def test_nhwc_conv_whose_weights_outgrow_the_input_is_not_split_by_rows():
    """ResNet-18's NHWC 256x14x14 3x3 conv (2.4 MB of weights, 12 times its input): the model
    priced splitting its row blocks over the cores (each core streaming all the weights) level
    with splitting its channel blocks, and picked the rows, which ran 1.08x NCHW's time with a
    residual against 0.98-1.03x split by channels (2-core Emerald Rapids, benchmarks/README.md
    "res43"). The model's pick splits the channel blocks, outermost."""
    m = tsl.load_machine("x86-avx512")
    op = ops.conv2d(1, 256, 14, 14, 256, 3, 3, padding=1, layout="NHWC",
                    epilogue=ops.bias() + ops.residual() + ops.relu())
    knobs = tsl.schedule(op, m).knob_values
    assert knobs["outer"] == "co" and knobs["parallel_axes"] in ("co", "n_oh_co")


def test_unpacked_load_rate_leaves_packed_schedules_alone():
    """The AVX-512 file's rate for unpacked operands prices only the in-place GEMM: an implicit
    GEMM conv (both operands packed) is priced as with the packed rate alone."""
    m = tsl.load_machine("x86-avx512")
    mover = m.movers[0]
    assert mover.unpacked_bytes_per_cycle == mover.bytes_per_cycle / 2
    same = dataclasses.replace(m, movers=(dataclasses.replace(mover,
                                                               unpacked_bytes_per_cycle=0.0),))
    op = ops.conv2d(1, 144, 28, 28, 32, 1, 1)
    knobs = {"w_inner": 16, "co_inner": 1}  # 17 loads per 16 FMAs, as 16x1 above
    a, b = record(op, m, None, knobs), record(op, same, None, knobs)
    assert feed_efficiency(a) == feed_efficiency(b) < 1
    assert tsl.model.evaluate(a).seconds == tsl.model.evaluate(b).seconds


def test_model_prices_the_transposed_store_of_nchw_convs():
    """MobileNetV2's 32x112x112->16 on the AVX-512 file: the implicit GEMM's NCHW store gathers
    every output vector lane by lane, the in-place GEMM stores whole vectors. Measured here
    (pw38, mnv39p): the conv 0.19-0.50 ms against the in-place GEMM's 0.10-0.22; the model
    priced them within 1% before it counted the gather, and took the conv when its in-place
    tiles were priced as measured."""
    m = tsl.load_machine("x86-avx512")
    conv = record(ops.conv2d(1, 32, 112, 112, 16, 1, 1, epilogue=ops.bias()), m)
    gemm = record(ops.matmul(16, 112 * 112, 32, epilogue=ops.bias(), activation_b=True), m)
    assert tsl.model.evaluate(gemm).seconds < 0.8 * tsl.model.evaluate(conv).seconds


class PointwiseBlock(nn.Module):
    """A MobileNetV2 block's 1x1 convs on 40x40 (1600 pixels: whole vectors) and on 7x9 (63: an
    edge): expand + relu6, project + residual."""

    def __init__(self, c, k):
        self.expand = nn.Conv2D(c, k, 1)
        self.project = nn.Conv2D(k, c, 1)

    def forward(self, x):
        y = nn.wrap_nested(relax.op.clip(self.expand(x)._expr, 0.0, 6.0), "relu6")
        return self.project(y) + x


@pytest.mark.parametrize("hw", [(40, 40), (7, 9)])
def test_swap_takes_pixels_on_lanes_and_matches_tvm(hw, monkeypatch):
    # The swap's choice for NCHW convs: the graph reaches it NCHW, as where the layout plan
    # keeps it so (a back end offering NCHW alone, or convs the plan prices dearer in NHWC)
    from tsl.relax import channels_last

    monkeypatch.setattr(channels_last, "plan", lambda mod, machine: (mod, 0))
    mod, _, x = models.export(PointwiseBlock(16, 96), (1, 16) + hw)
    c = bench.compile_model(mod, "cpu")
    want = bench.compile_model(mod, "cpu", use_tsl=False)(x)
    assert bench._rel_err(c(x), want) < 1e-5
    taken = [d.pattern for d in c.report.taken]
    if hw == (40, 40):  # priced below the implicit GEMM (measured 0.44-0.6x at 56x56)
        assert sum(p.startswith("conv2d 1x1 as matmul") for p in taken) == 2, str(c.report)
    assert len(taken) == 2 and all(p.startswith("conv2d") for p in taken)


def test_only_nchw_1x1_unit_stride_convs_have_the_variant():
    def conv_match(**kw):
        op = ops.conv2d(**kw)
        ops_ = {"A": match.Operand(0, op.input("A").shape),
                "B": match.Operand(1, op.input("B").shape)}
        return match.Match(op, ops_, op.output.shape, None)

    one = dict(N=1, C=8, H=7, W=9, K=16, R=1, S=1)
    alt = match.pixels_on_lanes(conv_match(**one))
    assert alt.op.name == "matmul" and alt.op.params["activation_b"]
    assert alt.operands["A"] == match.Operand(1, (16, 8))
    assert alt.operands["B"] == match.Operand(0, (8, 63))
    for other in (dict(one, stride=2), dict(one, N=2), dict(one, R=3, S=3, padding=1),
                  dict(one, layout="NHWC")):
        assert match.pixels_on_lanes(conv_match(**other)) is None
