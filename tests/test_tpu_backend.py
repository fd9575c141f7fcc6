"""The TPU back end: TAM files, the XLA program's structure, numerics on XLA:CPU (jaxlib),
layout placement, the estimate against XLA's own cost analysis, and the errors."""

import dataclasses
import re
import sys
import time
from functools import cache

import numpy as np
import pytest

import tsl
from tsl.backends.tpu import backend, runtime

try:
    import jaxlib  # noqa: F401
    HAVE_JAX = True
except ImportError:
    HAVE_JAX = False
needs_jax = pytest.mark.skipif(not HAVE_JAX, reason="jaxlib not installed")

BF16 = dict(dtype="bfloat16", acc_dtype="float32")
# Every operator x dtype at small sizes; 200x136x300 and the conv's 9x9 are no multiple of 128.
SUITE = {
    "matmul-bf16": lambda: tsl.ops.matmul(256, 384, 256, **BF16),
    "matmul-s8": lambda: tsl.ops.matmul(256, 256, 384, dtype="int8"),
    "matmul-odd-bf16": lambda: tsl.ops.matmul(200, 136, 300, **BF16),
    "batch_matmul-bf16": lambda: tsl.ops.batch_matmul(3, 128, 256, 128, **BF16),
    "batch_matmul-s8": lambda: tsl.ops.batch_matmul(2, 128, 128, 256, dtype="int8"),
    "dense-bias-relu-bf16": lambda: tsl.ops.dense(128, 256, 384, **BF16,
                                                  epilogue=tsl.ops.bias() + tsl.ops.relu()),
    "dense-bias-relu-s8": lambda: tsl.ops.dense(64, 256, 128, dtype="int8",
                                                epilogue=tsl.ops.bias() + tsl.ops.relu()),
    "conv2d-nhwc-bf16": lambda: tsl.ops.conv2d(1, 64, 9, 9, 96, 3, 3, padding=1,
                                               layout="NHWC", **BF16),
    "conv2d-nhwc-s8-stride2": lambda: tsl.ops.conv2d(2, 32, 9, 9, 48, 3, 3, stride=2, padding=1,
                                                     layout="NHWC", dtype="int8",
                                                     epilogue=tsl.ops.bias() + tsl.ops.relu()),
    "conv2d-nchw-bf16": lambda: tsl.ops.conv2d(1, 32, 9, 9, 40, 3, 3, padding=1, layout="NCHW",
                                               **BF16),
    "matmul-s8-requantize": lambda: tsl.ops.matmul(128, 256, 256, dtype="int8",
                                                   epilogue=tsl.ops.requantize(8, bias=True)),
}
# A known schedule: the default GEMM schedule with its knobs fixed.
KNOWN = {"m_inner": 4, "n_inner": 4, "k_inner": 4, "stages": 2, "outer": "m"}


@cache
def built(name: str, machine: str = "tpu-v5e"):
    return tsl.build(SUITE[name](), target=machine)


@cache
def known():
    return tsl.build(tsl.ops.matmul(1024, 1024, 1024, **BF16), "tpu-v5e", knobs=KNOWN)


@cache
def gemm2048():
    t = time.perf_counter()
    art = tsl.build(tsl.ops.matmul(2048, 2048, 2048, **BF16), "tpu-v5e")
    if HAVE_JAX:
        art.program()
    return art, time.perf_counter() - t


@pytest.mark.parametrize("name", ["tpu-v4", "tpu-v5e"])
def test_machine_files(name):
    m = tsl.load_machine(name)
    assert m.backend == "tpu" and m.params["mxu_shape"] == [128, 128]
    assert m.params["tiling"] == [8, 128] and m.params["native_tile"]["int8"] == [32, 128]
    assert m.params["uncertain"], "each file lists its uncertain figures"
    for p in m.primitives:
        assert (p.m, p.n, p.k) == (128, 128, 128)
        peak = 2 * p.macs_per_cycle * m.cores() * m.clock_hz
        assert peak == pytest.approx(m.peak(p.a_dtype), rel=0.01)
    assert {(p.a_dtype, p.acc_dtype) for p in m.primitives} == {("bfloat16", "float32"),
                                                                ("int8", "int32")}
    vmem = sum(lv.capacity for lv in m.memory if lv.role != "global")
    assert vmem <= m.params["vmem_scoped_bytes"] <= m.params["vmem_physical_bytes"]


def test_target_resolves_to_this_backend():
    s = tsl.schedule(tsl.ops.matmul(256, 256, 256, **BF16), "tpu")
    assert s.machine.name == backend.default_machine == "tpu-v5e"


@needs_jax
@pytest.mark.parametrize("name", list(SUITE))
def test_verified_against_numpy(name):
    art = built(name)
    op = art.op
    xs = op.random_inputs(seed=3)
    assert all(np.any(x != 0) for x in xs)
    ok, err = op.check(art.run(*xs), op.reference(*xs))
    assert ok, f"{op}: error {err}"
    assert err <= (1e-2 if op.dtype == "bfloat16" else 0)


def test_structure_of_a_known_schedule():
    """Tile loops are while loops, staged tiles dynamic slices of MXU-aligned shapes, the
    tensorized nest one bf16 x bf16 -> f32 dot_general per tile, the accumulator loop-carried
    and written through dynamic_update_slice; the pipelined stages are prefetched."""
    art = known()
    st = art.structure
    assert [n for _, n in st.loops] == [4, 2]           # 2x2 output tiles, 2 reduction blocks
    assert set(st.slices) == {(512, 512)}
    assert all(a % 128 == 0 for shape in st.slices for a in shape)
    assert st.dots == [((512, 512), (512, 512), (512, 512))]
    assert st.dot_trips == 8 and sorted(st.prefetched) == ["A_global.vmem", "B_global.vmem"]
    text = art.hlo()
    tiled = text.split("func.func private @tiled")[1]
    assert tiled.count("stablehlo.while(") == 2
    assert tiled.count("stablehlo.dot_general") == 1
    assert "(tensor<512x512xbf16>, tensor<512x512xbf16>) -> tensor<512x512xf32>" in tiled
    assert tiled.count("stablehlo.dynamic_update_slice") == 1
    assert tiled.count("stablehlo.dynamic_slice") == 4   # 2 prologue + 2 prefetch
    assert "[parallel over tensorcore]" in tiled and "[pipelined, 2 stages]" in tiled


def test_padding_is_explicit_in_the_program():
    art = built("matmul-odd-bf16")
    main = art.hlo().split("func.func private @tiled")[0]
    assert "stablehlo.pad %arg0" in main and "stablehlo.pad %arg1" in main
    assert "stablehlo.slice %tiled [0:200, 0:136]" in main
    conv = built("conv2d-nhwc-bf16").hlo()
    assert "zero padding of A" in conv and conv.count("stablehlo.pad") >= 2


@needs_jax
def test_classic_hlo_text():
    hlo = known().hlo(dialect="hlo")
    assert hlo.startswith("HloModule") and hlo.count(" while(") == 2
    assert re.search(r"f32\[512,512\]\{1,0\} dot\(", hlo)
    assert "dynamic-slice(" in hlo and "dynamic-update-slice(" in hlo


@needs_jax
def test_estimate_flops_match_xla_cost_analysis():
    art = known()
    est = art.estimate()
    assert est.macs == art.op.macs == est.padded_macs and est.mxu_passes == 8 ** 3
    # XLA counts a while loop's body once: one trip of the dot, plus a few percent of
    # element-wise work (the accumulate, XLA:CPU's bf16 -> f32 conversions, the output update).
    xla = art.program().cost()["flops"]
    assert est.flops / est.dot_trips <= xla <= 1.05 * est.flops / est.dot_trips


@needs_jax
def test_inputs_are_placed_in_the_declared_layout():
    """XLA does not check layouts at run time; the runtime places each input in the layout the
    program declares (here column-major), so the result is right."""
    text = """module @t {
  func.func public @main(%a: tensor<4x8xf32> {mhlo.layout_mode = "{0,1}"}) -> (tensor<4x8xf32> {mhlo.layout_mode = "{1,0}"}) {
    %one = stablehlo.constant dense<1.0> : tensor<4x8xf32>
    %r = stablehlo.add %a, %one : tensor<4x8xf32>
    return %r : tensor<4x8xf32>
  }
}"""
    prog = runtime.Program(text)
    assert prog.layouts == [(0, 1)] == runtime.declared_layouts(text)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(prog([x]), x + 1)
    assert runtime.declared_layouts(known().hlo()) == [(1, 0), (1, 0)]


def test_estimate_of_large_bf16_gemms_on_v5e():
    for n in (2048, 4096):
        art = gemm2048()[0] if n == 2048 else tsl.build(tsl.ops.matmul(n, n, n, **BF16),
                                                         "tpu-v5e")
        est = art.estimate()
        assert est.utilization >= 0.8 and est.pct_peak >= 80, str(est)
        assert est.vmem_bytes <= est.vmem_budget
        row = art.benchmark()
        assert {"seconds", "rate", "pct_peak", "utilization", "baseline", "baseline_seconds",
                "speedup"} <= set(row)
        assert row["baseline"] == "xla-dot estimate" and row["speedup"] > 1


def test_emit_and_compile_2048_cubed_under_10_s():
    art, seconds = gemm2048()
    assert art.hlo().count("stablehlo.dot_general") == 1
    assert seconds < 10


def test_vmem_overflow_is_a_schedule_error():
    op = tsl.ops.matmul(2048, 2048, 2048, **BF16)
    with pytest.raises(tsl.ScheduleError, match="vmem"):
        tsl.build(op, "tpu-v5e", knobs={"k_inner": 16, "m_inner": 16, "stages": 2})
    # The back end's own check counts the double-buffered output block too: 6 MiB of A and B
    # tiles and 2 MiB of accumulator fit the TAM's levels, not with 4 MiB of output block.
    m = tsl.load_machine("tpu-v5e")
    small = dataclasses.replace(m, params=dict(m.params, vmem_scoped_bytes=8 << 20))
    knobs = {"m_inner": 8, "n_inner": 4, "k_inner": 8, "stages": 2, "m_outer": 1,
             "n_outer": 1, "outer": "m"}
    with pytest.raises(tsl.ScheduleError, match="VMEM.*bytes over"):
        tsl.build(op, small, knobs=knobs)
    # Left to the model, the knobs are chosen within the back end's limit.
    assert tsl.build(op, small).estimate().vmem_bytes <= 8 << 20


def test_without_jax_build_emits_and_run_says_what_to_install(monkeypatch):
    for mod in ("jax", "jaxlib"):
        monkeypatch.setitem(sys.modules, mod, None)
    op = tsl.ops.matmul(128, 128, 128, **BF16)
    art = tsl.build(op, "tpu-v4")
    assert "stablehlo.dot_general" in art.hlo() and art.source() == art.hlo()
    assert art.estimate().seconds > 0
    with pytest.raises(tsl.BackendUnavailable, match=r'pip install -e "\.\[tpu\]"'):
        art.run(*op.random_inputs())
    with pytest.raises(tsl.BackendUnavailable):
        art.hlo(dialect="hlo")


def test_suite():
    quick = backend.suite(quick=True)
    full = backend.suite(quick=False)
    assert 2 <= len(quick) <= 3 and len(full) >= 8
    kinds = {(op.name, op.dtype) for op in full}
    assert {("matmul", "bfloat16"), ("matmul", "int8"), ("conv2d", "bfloat16")} <= kinds
