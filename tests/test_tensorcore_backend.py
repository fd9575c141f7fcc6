"""The Tensor Core back end: TAM files, CUDA generation, PTX checks for sm_80 and sm_90 (nvcc),
export, estimate; numerics where there is a GPU."""

import copy
import json
import re
from dataclasses import replace
from functools import cache

import numpy as np
import pytest

import tsl
from tsl.backends.cuda_tensorcore.hopper import HopperArtifact
import wmma_emulator
from tsl.backends.cuda_tensorcore import backend, codegen, runtime
from tsl.model.search import record_fixed

ARCHS = ("sm_80", "sm_90")
needs_nvcc = pytest.mark.skipif(codegen.nvcc() is None, reason="nvcc not found")
needs_gpu = pytest.mark.skipif(runtime.gpu_missing() is not None, reason="no CUDA GPU")
needs_gxx = pytest.mark.skipif(not wmma_emulator.available(), reason="g++ not found")

# Every operator x dtype of the default suite, at sizes that compile quickly.
SUITE = {
    "matmul-f16": lambda: tsl.ops.matmul(512, 256, 512, dtype="float16"),
    "matmul-bf16": lambda: tsl.ops.matmul(256, 256, 256, dtype="bfloat16"),
    "matmul-s8": lambda: tsl.ops.matmul(256, 256, 512, dtype="int8"),
    "batch_matmul-f16": lambda: tsl.ops.batch_matmul(3, 128, 128, 256, dtype="float16"),
    "dense-f16-bias-relu": lambda: tsl.ops.dense(128, 768, 768, dtype="float16",
                                                 epilogue=tsl.ops.bias() + tsl.ops.relu()),
}

# conv2d NHWC (an implicit GEMM) with the default schedule: each dtype with its epilogue, a
# stride-2 layer, a 1x1 layer, and channel counts that are not multiples of 16 (the core pads
# them).
_BIAS_RELU = tsl.ops.bias() + tsl.ops.relu()
CONV = {
    "conv-f16-bias-relu": lambda: tsl.ops.conv2d(1, 32, 8, 8, 32, 3, 3, padding=1, layout="NHWC",
                                                 dtype="float16", epilogue=_BIAS_RELU),
    "conv-bf16-bias-relu": lambda: tsl.ops.conv2d(2, 32, 8, 8, 48, 3, 3, padding=1,
                                                  layout="NHWC", dtype="bfloat16",
                                                  epilogue=_BIAS_RELU),
    "conv-s8-requantize": lambda: tsl.ops.conv2d(
        1, 32, 8, 8, 32, 3, 3, padding=1, layout="NHWC", dtype="int8",
        epilogue=tsl.ops.requantize(shift=8, bias=True, clip=(0, 127))),
    "conv-f16-stride2": lambda: tsl.ops.conv2d(1, 32, 16, 16, 32, 3, 3, stride=2, padding=1,
                                               layout="NHWC", dtype="float16"),
    "conv-f16-1x1": lambda: tsl.ops.conv2d(2, 64, 8, 8, 32, 1, 1, layout="NHWC",
                                           dtype="float16"),
    "conv-f16-3to20-channels": lambda: tsl.ops.conv2d(2, 3, 9, 9, 20, 3, 3, padding=1,
                                                      layout="NHWC", dtype="float16"),
    "conv-s8-24to40-channels-stride2": lambda: tsl.ops.conv2d(1, 24, 14, 14, 40, 3, 3, stride=2,
                                                              padding=1, layout="NHWC",
                                                              dtype="int8"),
}


# 2 x 2 warps of 64 x 64 accumulator tiles: the multi-warp kernels the suite's large GEMMs
# get by default (the small test shapes would default to more, smaller blocks). Two 16-deep
# slices per stage: with 8 (the default for K=768), nvcc unrolls them and the dense kernel's
# column-major B fragments push sm_80 past 255 registers (16 B spilled), which check() fails.
WARPS_2X2 = {"m_inner": 4, "n_inner": 4, "m_outer": 2, "n_outer": 2, "k_inner": 2}


def uses_mma(art) -> bool:
    return "mma.sync.aligned" in art.source()


@cache
def built(name: str, machine: str = "tensorcore-sm90"):
    if name in SUITE:
        # Whole reductions: split in parts (sm_80 lists splits), these small GEMMs would have
        # one k-step per block, nothing to pipeline (test_split_reduction_* builds splits).
        whole = {"split_k": 1} if tsl.load_machine(machine).params.split_k else {}
        return tsl.build(SUITE[name](), target=machine, knobs={**WARPS_2X2, **whole})
    # Two stages: these small layers have one reduction step, where the model rightly
    # prefers no pipeline; the tests are about the cp.async copies of a pipelined one.
    return tsl.build(CONV[name](), target=machine, knobs={"stages": 2})


@pytest.mark.parametrize("name,sms,smem,peak", [("tensorcore-sm80", 108, 163 * 1024, 3.119e14),
                                                ("tensorcore-sm90", 132, 227 * 1024, 9.894e14)])
def test_tam_files(name, sms, smem, peak):
    m = tsl.load_machine(name)
    assert m.backend == "cuda_tensorcore" and m.cores() == sms
    assert m.compute_level("subcore").bind == "threadIdx.y"
    assert m.levels("scratchpad")[0].capacity == smem
    assert m.peak("float16") == peak and m.peak("int8") == 2 * peak
    for dt, acc in (("float16", "float32"), ("bfloat16", "float32"), ("int8", "int32")):
        p = m.primitive(dt)
        # sm_80's int8 primitive is mma.sync's 32-deep one (two m16n8k32 per 16x16x32)
        deep = 32 if dt == "int8" and name == "tensorcore-sm80" else 16
        assert p.shape == (16, 16, deep) and p.acc_dtype == acc
    assert m.params.cp_async and m.params.mma_shapes["tf32"] == "m16n8k8"
    assert m.params.mma_sync == (name == "tensorcore-sm80")


@pytest.mark.parametrize("name", SUITE)
def test_cuda_source(name):
    art = built(name)
    src = art.source()
    assert "nvcuda::wmma::mma_sync" in src and "cp.async" in src
    assert "extern __shared__" in src                     # staged tiles: dynamic shared memory
    k = art.kernel
    assert k.block == (32, 4, 1) and k.grid[0] >= 1
    assert [p[1] for p in k.params][:2] == [art.op.dtype] * 2


@needs_nvcc
def test_small_gemm_ptx():
    art = tsl.build(tsl.ops.dense(128, 768, 768, dtype="float16"), "tensorcore-sm90")
    ok, summary = art.check("sm_90")
    assert ok, summary


@pytest.mark.parametrize("name", CONV)
def test_conv2d_cuda_source(name):
    art = built(name)
    src = art.source()
    assert "nvcuda::wmma::mma_sync" in src and "cp.async" in src
    assert "extern __shared__" in src
    k = art.kernel
    assert k.block[0] == 32 and k.grid[0] >= 1
    assert [p[1] for p in k.params][:2] == [art.op.dtype] * 2
    assert k.params[-1][1] == art.op.output.dtype


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", [*SUITE, *CONV])
def test_ptx_and_resources(name, arch):
    art = built(name, "tensorcore-sm80" if arch == "sm_80" else "tensorcore-sm90")
    ins = art.instructions(arch)
    if uses_mma(art):
        assert ins["mma.sync"] > 0 and ins["ldmatrix"] > 0 and ins["wmma.mma"] == 0
    else:
        assert ins["wmma.mma"] > 0 and ins["wmma.load"] > 0
    assert ins["cp.async"] > 0
    res = art.resources(arch)
    assert 0 < res["registers"] <= art.machine.params.max_registers_per_thread
    assert res["static_shared_bytes"] == art.kernel.static_shared_bytes    # ptxas == TIR
    assert res["shared_bytes"] <= art.machine.levels("scratchpad")[0].capacity
    ok, summary = art.check(arch)
    assert ok, summary


@needs_nvcc
@pytest.mark.parametrize("machine,arch,full", [("tensorcore-sm80", "sm_80", True),
                                               ("tensorcore-sm90", "sm_90", False)])
def test_default_suite_has_no_spills_and_shared_loads(machine, arch, full, suite_built):
    """Every kernel of the bench suite, as the bench builds it: ptxas -v reports no spill,
    and every fragment load is a shared-memory load (LDSM, not LD + MOVM). sm_80 takes the
    whole suite (`--full`: bf16 and int8 too); sm_90 the default rows (the whole suite's
    fp16 / bf16 GEMMs on sm_90 are test_tensorcore_sm90.py's; all of it took 29 s of CI)."""
    for op in backend.suite(quick=not full):
        art = suite_built(op, machine)  # sm_90's GEMMs: test_tensorcore_sm90.py's builds too
        res = art.resources(arch)
        assert "spill stores" in res["log"], res["log"]          # ptxas -v was parsed
        assert res["spill_bytes"] == 0, f"{op}: {res['log']}"
        if isinstance(art, HopperArtifact):
            continue  # wgmma reads shared memory through descriptors: test_tensorcore_sm90.py
        ins = art.instructions(arch)
        assert ins["wmma.load"] + ins["ldmatrix"] > 0, f"{op}: {ins}"
        assert ins["wmma.load generic"] == 0, f"{op}: {ins}"   # ldmatrix is .shared always
        ok, summary = art.check(arch)
        assert ok, f"{op}: {summary}"


@needs_nvcc
def test_conv2d_rows_of_a_tile_keep_their_accumulators_in_registers():
    """Two output rows per tile outside the reduction (reduce_rows=False, as the model picks
    for the bench's ResNet layer on sm_80): each row's accumulator fragments are its own, the
    row loop is unrolled, so ptxas needs no stack frame (it was 512 B of local memory)."""
    art = tsl.build(CONV["conv-f16-bias-relu"](), "tensorcore-sm80",
                    knobs={"h_inner": 2, "reduce_rows": False, "stages": 2})
    res = art.resources("sm_80")
    assert res["stack_bytes"] == 0 and res["spill_bytes"] == 0, res["log"]
    assert art.check("sm_80")[0]


@needs_nvcc
def test_check_fails_on_spills_and_generic_loads():
    art = copy.copy(built("matmul-bf16"))
    art._compiled = {}
    ptx, cubin, rep = built("matmul-bf16")._compile("sm_90")
    assert art._compile("sm_90") and art.check("sm_90")[0]
    art._compiled["sm_90"] = (ptx, cubin, {**rep, "spill_bytes": 8})
    ok, summary = art.check("sm_90")
    assert not ok and "8 B of register spills" in summary
    art._compiled["sm_90"] = (ptx, cubin, {**rep, "stack_bytes": 512})
    ok, summary = art.check("sm_90")
    assert not ok and "512 B of local memory" in summary
    generic = ptx.replace(".m16n16k16.shared.bf16", ".m16n16k16.bf16")
    art._compiled["sm_90"] = (generic, cubin, rep)
    ok, summary = art.check("sm_90")
    assert not ok and "generic addresses" in summary


def test_unpipelined_schedule_has_no_cp_async():
    art = tsl.build(SUITE["matmul-f16"](), "tensorcore-sm90", knobs={**WARPS_2X2, "stages": 1})
    assert "cp.async" not in art.source() and not art.pipelined


def test_too_much_shared_memory_is_a_schedule_error():
    op = tsl.ops.matmul(4096, 4096, 4096, dtype="float16")
    with pytest.raises(tsl.ScheduleError, match="smem"):
        tsl.build(op, "tensorcore-sm80", knobs={**WARPS_2X2, "k_inner": 16, "stages": 2})


@needs_nvcc
def test_conv2d_resnet_layer_of_the_bench():
    op = tsl.ops.conv2d(8, 64, 56, 56, 64, 3, 3, padding=1, layout="NHWC", dtype="float16")
    for machine, arch in (("tensorcore-sm80", "sm_80"), ("tensorcore-sm90", "sm_90")):
        art = tsl.build(op, machine)
        ok, summary = art.check(arch)
        assert ok, summary


def test_conv2d_nchw_is_refused_clearly():
    op = tsl.ops.conv2d(1, 32, 8, 8, 32, 3, 3, padding=1, layout="NCHW", dtype="float16")
    with pytest.raises(tsl.LoweringError, match="layout='NHWC'"):
        tsl.build(op, "tensorcore-sm90")


def test_conv2d_tiles_over_shared_memory_are_a_schedule_error():
    # The TSL footprints fit; the int8 window tile, whose 16-byte fragment rows are padded to
    # 32 bytes, does not: refused on the lowered TIR, before any CUDA is generated.
    op = tsl.ops.conv2d(1, 256, 28, 28, 128, 3, 3, padding=1, layout="NHWC", dtype="int8")
    knobs = {"ci_inner": 2, "w_inner": 2, "co_inner": 8}  # 64 channels: 2 x 32-deep int8
    tsl.schedule(op, "tensorcore-sm80", knobs=knobs)
    with pytest.raises(tsl.ScheduleError, match="does not fit tensorcore-sm80: shared memory"):
        tsl.build(op, "tensorcore-sm80", knobs=knobs)


def test_conv2d_serial_loops_outside_the_grid_are_refused():
    op = tsl.ops.conv2d(1, 32, 16, 16, 16, 3, 3, padding=1, layout="NHWC", dtype="float16")
    # Refused by the back end's check (the knob search skips such settings), not after
    # lowering. The row blocks outermost (outer="oh") and only the channel blocks parallel:
    # the row loop runs serially outside the grid. (Weights K x R x S = 144 under the 256
    # input pixels: the row blocks may go outermost, `schedules._pointwise_split`.)
    with pytest.raises(tsl.ScheduleError, match="parallel_axes='n_oh_co'"):
        tsl.build(op, "tensorcore-sm90", knobs={"parallel_axes": "co", "h_inner": 1,
                                                "outer": "oh"})


@needs_nvcc
def test_export(tmp_path):
    art = built("dense-f16-bias-relu")
    path = art.export(tmp_path / "dense")
    meta = json.loads((path / "kernel.json").read_text())
    assert meta["kernel"] == art.kernel.name and meta["arch"] == "sm_90"
    assert meta["grid"] == list(art.kernel.grid) and meta["block"] == [32, 4, 1]
    assert meta["dynamic_shared_bytes"] == art.kernel.dynamic_shared_bytes > 0
    assert [p["role"] for p in meta["params"]] == ["A", "B", "bias", "out"]
    assert meta["params"][-1]["dtype"] == "float32"
    assert meta["launches"] == [{"kernel": art.kernel.name, "grid": meta["grid"],
                                 "block": meta["block"], "dynamic_shared_bytes":
                                 meta["dynamic_shared_bytes"],
                                 "args": [p["name"] for p in meta["params"]]}]
    assert meta["workspace"] == []
    images = meta["images"]
    assert (path / images["ptx"]["file"]).read_text().startswith("//")
    assert all((path / f).stat().st_size > 0 for f in images["cubin"].values())
    assert meta["format"] == "tsl-cuda-kernel/3" and meta["reference"]["op"] == "dense"


def test_estimate_and_benchmark():
    art = built("matmul-f16")
    est = art.estimate()
    assert 0 < est.seconds and est.flops == 2 * 512 * 256 * 512 and est.kind == "model"
    assert est.occupancy > 0 and "model on tensorcore-sm90" in str(est)
    assert est.upper_bound_seconds <= est.seconds
    row = art.benchmark()
    # Nothing measured cuBLAS here: no baseline, no ratio.
    assert row["kind"] == "model" and row["baseline"] is None and row["speedup"] is None
    assert "cuBLAS" not in str(row)
    assert row["ptx_ok"] == (codegen.nvcc() is not None)


def test_large_gemm_estimate_is_labelled_an_upper_bound_at_the_wmma_rate():
    """4096^3 fp16 on sm_90's warp-level path: the kernel issues WMMA, priced at its rate (half
    the wgmma peak), not at the wgmma peak; the instruction's roofline is printed as an upper
    bound. (The default build is the wgmma kernel: test_tensorcore_sm90.py.)"""
    art = tsl.build(tsl.ops.matmul(4096, 4096, 4096, dtype="float16"), "tensorcore-sm90",
                    wgmma=False)
    est = art.estimate()
    m = est.model
    assert m.instruction == "wmma" and m.instruction_rate == 0.5
    assert est.flops / est.upper_bound_seconds <= 0.5 * est.peak
    assert est.seconds > est.upper_bound_seconds
    assert "upper bound" in str(est) and "upper bound" in art.benchmark()["checks"]


def test_model_terms_follow_instruction_occupancy_and_bandwidth():
    from tsl.backends.cuda_tensorcore import model

    sm90 = tsl.load_machine("tensorcore-sm90")
    tile = model.Tile(block_m=128, block_n=128, block_k=32, k_steps=128, warps=4, warp_m=64,
                      warp_n=64, stages=2, blocks=1024, in_bytes=2, acc_bytes=4,
                      instruction="wmma")
    flops = 2.0 * 4096 ** 3

    def seconds(per_sm=1, **change):
        t = replace(tile, **change)
        return model.model(sm90, t, flops, flops, per_sm, 1e8, "float16").seconds

    assert seconds(instruction="wgmma") < seconds()              # the instruction's rate
    assert seconds(warps=1, warp_m=128, warp_n=128) > seconds()   # one warp: 1 of 4 schedulers
    assert seconds(per_sm=2) < seconds()                         # stalls hidden by a 2nd block
    assert seconds(block_m=64, warp_m=32, blocks=2048) > seconds()  # more L2 traffic per MAC
    with pytest.raises(tsl.TAMError, match="instruction_rate"):
        model.model(tsl.load_machine("tensorcore-sm80"), replace(tile, instruction="wgmma"),
                    flops, flops, 1, 1e8, "float16")


def _chosen(op, machine="tensorcore-sm80"):
    from tsl.backends.cuda_tensorcore import model

    s = tsl.schedule(op, machine)
    mod, occ = model.price(s)
    return s, model.tile_of(s, mod.instruction), mod, occ


def test_knob_search_prices_warps_by_the_back_ends_model():
    """The search's price of a schedule is this back end's model (not the generic model of
    staged tiles, which gives warps no throughput): for a large fp16 GEMM it picks a
    128 x 256 (or 256 x 128) block of 8 warps, each a 64 x 64 accumulator tile, pipelined."""
    from tsl.backends.cuda_tensorcore import model

    s, t, mod, occ = _chosen(tsl.ops.matmul(4096, 4096, 4096, dtype="float16"))
    assert {t.block_m, t.block_n} == {128, 256} and t.warps == 8, t
    assert (t.warp_m, t.warp_n) == (64, 64) and t.stages >= 2 and mod.instruction == "mma_sync"
    assert tsl.model.evaluate(s).seconds == pytest.approx(mod.seconds)
    # Blocks of one warp (the same accumulator tile): as many blocks as fit on an SM do not
    # make up for it (more L2 traffic per MAC, fewer warps per scheduler).
    one = record_fixed(s.op, s.machine, s.choice.fn, {
        **s.knob_values, "m_outer": 1, "n_outer": 1})
    assert model.price(one)[0].seconds > 1.5 * mod.seconds
    # Unpipelined, every k-step waits for its copy.
    flat = record_fixed(s.op, s.machine, s.choice.fn, {
        **s.knob_values, "stages": 1})
    assert model.price(flat)[0].exposed_cycles["copy wait"] > 0
    assert model.price(flat)[0].seconds > mod.seconds


@pytest.mark.parametrize("n,k", [(768, 768), (3072, 768), (768, 3072)])
def test_bert_dense_tiles_fill_the_sms(n, k):
    """Wave quantization is priced: a 128 x 256 tile would give a BERT-base dense 3 .. 12
    blocks on 108 SMs; the model picks tiles (and splits of the reduction) that give most SMs
    a block, and prices the large tile slower."""
    from tsl.backends.cuda_tensorcore import model

    op = tsl.ops.dense(128, n, k, dtype="float16")
    s, t, mod, occ = _chosen(op)
    sms = s.machine.cores()
    assert t.blocks >= sms * 2 // 3 and mod.waves <= 1, (t, mod.waves)
    big = record_fixed(op, s.machine, s.choice.fn, {
        **s.knob_values, "m_inner": 4, "n_inner": 4, "m_outer": 2, "n_outer": 4, "k_inner": 2,
        "split_k": 1})
    big_model = model.price(big)[0]
    assert big_model.waves * sms <= 12 and big_model.seconds > mod.seconds


def test_search_refuses_what_the_lowering_cannot_build():
    """Serial loops outside the grid and WMMA epilogue tiles over 48 KiB of static shared
    memory are refused by the back end's check, so the search never picks them."""
    op = tsl.ops.matmul(4096, 4096, 4096, dtype="float16")  # WMMA on sm_90's warp path
    knobs = {"k_inner": 2, "m_inner": 4, "m_outer": 2, "n_inner": 4, "n_outer": 4,
             "outer": "m", "stages": 2}
    s = record_fixed(op, tsl.load_machine("tensorcore-sm90"), tsl.schedules.schedule_gemm,
                     knobs)
    with pytest.raises(tsl.ScheduleError, match="static shared memory"):
        backend.check(s)
    conv = tsl.ops.conv2d(8, 64, 56, 56, 64, 3, 3, padding=1, layout="NHWC", dtype="float16")
    s = record_fixed(conv, tsl.load_machine("tensorcore-sm80"), tsl.schedules.schedule_conv2d,
                     {"parallel_axes": "co", "co_outer": 1, "co_inner": 2, "w_inner": 2,
                      "h_inner": 1, "ci_inner": 2, "reduce_rows": False, "stages": 2})
    with pytest.raises(tsl.ScheduleError, match="serially"):
        backend.check(s)


def test_suite():
    ops = backend.suite(quick=False)
    assert {op.name for op in ops} == {"matmul", "dense", "conv2d"}
    assert {op.dtype for op in ops} == {"float16", "bfloat16", "int8"}
    assert "128x768x768" in {op.shape_str for op in ops}
    assert 2 <= len(backend.suite(True)) <= 3


@pytest.mark.skipif(runtime.gpu_missing() is None, reason="a CUDA GPU is present")
def test_run_without_gpu_is_backend_unavailable():
    art = built("matmul-f16")
    with pytest.raises(tsl.BackendUnavailable, match="no CUDA GPU"):
        art.run(*art.op.random_inputs(0))


@needs_gxx
@pytest.mark.parametrize("name", [*SUITE, *CONV])
def test_numerics_emulated_on_the_cpu(name):
    """The CUDA kernel itself, run by g++ on the host (tests/wmma_emulator.py), against the
    NumPy reference; WMMA pointers and leading dimensions are checked against CUDA's rules."""
    ok, err = wmma_emulator.verify(built(name), seed=3)
    assert ok, err


@needs_gxx
def test_conv2d_emulated_with_several_warps():
    """Six warps (3 x 2 accumulator tiles) share the shared-memory tiles of the block."""
    op = tsl.ops.conv2d(2, 40, 14, 14, 72, 3, 3, stride=2, padding=1, layout="NHWC",
                        dtype="bfloat16")
    art = tsl.build(op, "tensorcore-sm90", knobs={"w_inner": 1, "co_inner": 1, "co_outer": 2})
    assert art.kernel.block == (32, 2, 1)
    ok, err = wmma_emulator.verify(art)
    assert ok, err


# A pipelined kernel whose k loop runs 7 times through 2 stages: cp.async.wait_group 1 in the
# loop, wait_group 0 after it, each followed by the barrier that publishes the warps' copies.
PIPELINED = {"m_inner": 2, "n_inner": 2, "m_outer": 2, "n_outer": 2, "k_inner": 2}


@cache
def pipelined():
    return tsl.build(tsl.ops.matmul(64, 64, 256, dtype="float16"), "tensorcore-sm90",
                     knobs=PIPELINED)


def _emulated_ok(art, source=None) -> bool:
    """False when the emulated kernel's result is wrong or the emulator reports an error."""
    try:
        return wmma_emulator.verify(art, seed=5, source=source)[0]
    except AssertionError:  # the emulator's error report (race, copies never waited for, ..)
        return False


@needs_gxx
def test_emulator_sees_a_missing_cp_async_wait():
    art = pipelined()
    assert _emulated_ok(art)
    src = art.source()
    assert len(wmma_emulator.WAIT.findall(src)) >= 2
    assert not _emulated_ok(art, wmma_emulator.WAIT.sub("", src))


@needs_gxx
@pytest.mark.parametrize("which", ["every", "in the loop", "after the loop"])
def test_emulator_sees_a_missing_barrier_after_the_wait(which):
    """Without the barrier after cp.async.wait_group, a warp reads tiles other warps copied
    before their copies are visible to it."""
    src = pipelined().source()
    barrier = re.compile(r"(tvm_builtin_ptx_cp_async_wait_group\w*\(\);)\s*__syncthreads\(\);")
    sites = list(barrier.finditer(src))
    assert len(sites) == 2
    keep = {"every": [], "in the loop": [1], "after the loop": [0]}[which]
    mutated, last = [], 0
    for n, m in enumerate(sites):
        mutated += [src[last:m.start()], m[0] if n in keep else m[1]]
        last = m.end()
    mutated = "".join(mutated + [src[last:]])
    assert not _emulated_ok(pipelined(), mutated)


@needs_gxx
def test_emulator_bounds_shared_memory_by_the_launch():
    """Launched with less dynamic shared memory than the kernel uses, the copies land outside
    it: an error, not a silent success."""
    art = copy.copy(pipelined())
    art.kernel = replace(art.kernel, dynamic_shared_bytes=art.kernel.dynamic_shared_bytes - 1024)
    with pytest.raises(AssertionError, match="outside shared memory"):
        wmma_emulator.verify(art)


@needs_gpu
@needs_nvcc
@pytest.mark.parametrize("name", [*SUITE, *CONV])
def test_numerics_on_gpu(name):
    art = built(name)
    ok, err = art.verify(seed=int(np.random.default_rng().integers(1 << 30)))
    assert ok, err


# -- sm_80: ldmatrix + mma.sync ------------------------------------------------------------------
# The fp16 / bf16 GEMM family on sm_80, on shapes that are not multiples of the tile (the core
# pads them), with the default knobs (pipelined: with one or two reduction steps the model
# would rightly pipeline nothing), 4 warps, and 8 warps of a 128x256 block tile through a
# 4-stage pipeline.
MMA = {
    "matmul-f16-ragged": (lambda: tsl.ops.matmul(72, 100, 80, dtype="float16"),
                          {"m_inner": 2, "n_inner": 2, "m_outer": 2, "n_outer": 2,
                           "k_inner": 2}),
    "dense-f16-bias-relu": (lambda: tsl.ops.dense(40, 96, 64, dtype="float16",
                                                  epilogue=tsl.ops.bias() + tsl.ops.relu()),
                            {"stages": 2}),
    "batch_matmul-bf16": (lambda: tsl.ops.batch_matmul(2, 48, 64, 96, dtype="bfloat16"),
                          {"stages": 2}),
    "matmul-bf16-128x256-8warps-4stages": (
        lambda: tsl.ops.matmul(128, 256, 160, dtype="bfloat16"),
        {"m_inner": 4, "n_inner": 4, "m_outer": 2, "n_outer": 4, "k_inner": 2, "stages": 4,
         "split_k": 1}),
    # int8 -> int32 on mma.sync.m16n8k32: B as [K, N] has no 8-bit ldmatrix.trans (each lane
    # gathers its bytes, tsl_lds4); B as [N, K] is loaded with ldmatrix like A.
    "matmul-s8-ragged": (lambda: tsl.ops.matmul(72, 100, 80, dtype="int8"),
                         {"m_inner": 2, "n_inner": 2, "m_outer": 2, "n_outer": 2,
                          "k_inner": 2}),
    "dense-s8-ragged": (lambda: tsl.ops.dense(40, 48, 96, dtype="int8"),
                        {"m_inner": 2, "n_inner": 2, "m_outer": 2, "n_outer": 2,
                         "k_inner": 2, "stages": 2}),
}


@cache
def built80(name: str):
    op, knobs = MMA[name]
    return tsl.build(op(), "tensorcore-sm80", knobs=knobs)


@pytest.mark.parametrize("name", MMA)
def test_mma_sync_source(name):
    """ldmatrix + mma.sync, no WMMA; the epilogue stores from the registers (no static shared
    tile, no barrier after the main loop), two fp32 per lane and store."""
    art = built80(name)
    src = art.source()
    mma = ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" if art.op.dtype == "int8"
           else "mma.sync.aligned.m16n8k16.row.col.f32")
    assert mma in src and "ldmatrix.sync.aligned" in src
    assert "nvcuda::wmma::mma_sync" not in src and art.kernel.static_shared_bytes == 0
    assert re.search(r"\*\((float|int)2\*\)\((C|out)_ptr \+", src)
    assert "cp.async" in src
    # B as [K, N] of 8-bit elements: gathered by the lanes (no ldmatrix.trans for b8)
    assert ("tsl_lds4(" in src) == (art.op.dtype == "int8" and art.op.name == "matmul")
    if "8warps" in name:
        assert art.kernel.block == (32, 8, 1)
        assert len(wmma_emulator.WAIT.findall(src)) >= 3   # wait_group 2, 1, 0: four stages


# Emulated (about 15 s each): every path once; batch_matmul-bf16 runs the 8-warp case's
# bf16 mma.sync and the ragged case's loads, its source is checked above.
EMULATED = ("matmul-f16-ragged", "dense-f16-bias-relu", "matmul-bf16-128x256-8warps-4stages",
            "matmul-s8-ragged", "dense-s8-ragged")


@needs_gxx
@pytest.mark.parametrize("name", EMULATED)
def test_mma_sync_numerics_emulated(name):
    """The kernel run lane by lane: ldmatrix, mma.sync and the shuffles exchange registers
    between the 32 threads of a warp as the PTX ISA lays them out."""
    art = built80(name)
    if art.op.dtype == "int8":  # full-range operands: every product and sum is exact
        xs = [x for x in art.op.random_inputs(7) if x.dtype == np.int8]
        assert len(xs) == 2 and all(x.min() == -128 and x.max() == 127 for x in xs)
    ok, err = wmma_emulator.verify(art, seed=7)
    assert ok and err == 0 if art.op.dtype == "int8" else ok, err


@needs_gxx
def test_int8_conv2d_on_sm80_issues_two_wmma_per_32_deep_step():
    """sm_80's int8 primitive is 32 deep (mma.sync m16n8k32); conv2d stays on WMMA, which is
    16 deep: two wmma.mma_sync per step, exact against NumPy (channels not a multiple of 32,
    stride 2)."""
    op = tsl.ops.conv2d(1, 24, 14, 14, 40, 3, 3, stride=2, padding=1, layout="NHWC",
                        dtype="int8")
    art = tsl.build(op, "tensorcore-sm80", knobs={"stages": 2})
    assert art.schedule.primitive.k == 32 and art.source().count("wmma::mma_sync") == 2
    ok, err = wmma_emulator.verify(art, seed=5)
    assert ok and err == 0, err


# Wrong lane mappings, each made in the generated CUDA: the emulator must fail them.
LANE_MUTATIONS = {
    # lanes 8-15 give the row addresses of lanes 0-7 (ldmatrix's second 8x8 matrix)
    "ldmatrix rows": lambda src: src.replace("(((int)threadIdx.x) & 15) * ",
                                             "(((int)threadIdx.x) & 7) * "),
    # the accumulator registers of the second n8 half of every mma swapped with the first
    "mma halves": lambda src: re.sub(r"(C_warp_ptr\s*\+\s*\(+[^;]*?) \+ 4\)", r"\1 + 0)",
                                     src, count=4),
}


@needs_gxx
@pytest.mark.parametrize("mutation", LANE_MUTATIONS)
def test_emulator_fails_a_wrong_lane_mapping(mutation):
    art = built80("matmul-f16-ragged")
    src = art.source()
    mutated = LANE_MUTATIONS[mutation](src)
    assert mutated != src
    assert not _emulated_ok(art, mutated)


# -- bank conflicts, from the generated CUDA -----------------------------------------------------
_CP_DST = re.compile(r"ptx_cp_async_legacy_(?:pred_)?c[ag]_16_(\d+)_\d+\(buf_dyn_shmem_ptr, "
                     r"(.+?), \w+_ptr, ")
_LDMATRIX = re.compile(r"unsigned int addr = __cvta_generic_to_shared\(\(&\(\(\(([\w ]+?)\*\)"
                       r"buf_dyn_shmem_ptr\)\[(.+)\]\)\) \+ (.+)\);$", re.M)
_CSE = re.compile(r"int (cse_v\d+) = (.+);$", re.M)
_ELEM = {"half": 2, "nv_bfloat16": 2, "signed char": 1, "char": 1}
_cse: dict[str, str] = {}


def _index_fn(expr: str):
    """A C index expression of the kernel as a Python function of (lane, env)."""
    while "cse_v" in expr:  # values TVM named once: substituted
        expr = re.sub(r"\bcse_v\d+\b", lambda m: f"({_cse[m[0]]})", expr)
    py = (expr.replace("((int)threadIdx.x)", "tx").replace("((int)threadIdx.y)", "ty")
          .replace("((int)blockIdx.x)", "bx").replace("/", "//"))
    names = sorted(set(re.findall(r"\b[a-z_]\w*\b", py)) - {"tx"})
    code = compile(py, "<index>", "eval")
    return names, lambda tx, env: eval(code, {}, {**env, "tx": tx})  # noqa: S307


def bank_conflicts(source: str, warps: int, samples: int = 24) -> dict[str, int]:
    """Extra shared-memory wavefronts of the kernel's 16-byte cp.async stores and ldmatrix row
    reads, from the index expressions in its CUDA source: each quarter warp (8 lanes; for
    ldmatrix the 8 row addresses of one 8x8 matrix) is one wavefront when its 16-byte chunks
    fall in 8 different bank groups (addr / 16 % 8); every chunk more in one group is a
    conflict. Evaluated for every lane over sampled warps, blocks and loop counters."""
    import random

    rng = random.Random(0)
    _cse.clear()
    _cse.update(_CSE.findall(source))
    found = {"cp.async": [(int(m[1]), m[2]) for m in _CP_DST.finditer(source)],
             "ldmatrix": [(_ELEM[m[1]], f"({m[2]}) + ({m[3]})")
                          for m in _LDMATRIX.finditer(source)]}
    total = {}
    for kind, sites in found.items():
        assert sites, f"no {kind} in the kernel"
        n = 0
        for elem, expr in sites:
            names, index = _index_fn(expr)
            for _ in range(samples):
                env = {v: (rng.randrange(warps) if v == "ty" else rng.randrange(4))
                       for v in names}
                chunks = [index(tx, env) * elem // 16 for tx in range(32)]
                for q in range(4):
                    distinct = set(chunks[8 * q:8 * q + 8])
                    groups = [c % 8 for c in distinct]
                    n += max(groups.count(g) for g in groups) - 1
        total[kind] = n
    return total


@pytest.mark.parametrize("name", ["matmul-bf16-128x256-8warps-4stages", "matmul-f16-ragged"])
def test_swizzled_shared_tiles_have_no_bank_conflicts(name):
    """Tiles whose rows are a power of two of 32+ elements are swizzled (fixed knobs here:
    rows of 32, 128 and 256 elements; the default knobs of a small operator may give rows of
    16 or 96, which stay unswizzled, see lowering.finalize)."""
    art = built80(name)
    warps = art.kernel.block[1]
    assert bank_conflicts(art.source(), warps) == {"cp.async": 0, "ldmatrix": 0}
    # The same kernel without the swizzle's XOR: row-major stores of whole rows stay free of
    # conflicts, the ldmatrix reads down a column of 16-byte blocks do not.
    plain = bank_conflicts(art.source().replace("^", "| 0 *"), warps)
    assert plain["ldmatrix"] > 0


# -- split reductions (split-K) -----------------------------------------------------------------
# K split in whole steps: a ragged dense with bias + relu in 4 parts (K = 200 of 256 padded:
# the last part is mostly padding), and an exact int8 GEMM without an epilogue in 2 parts.
SPLIT = {
    "dense-f16-bias-relu-split4": (
        lambda: tsl.ops.dense(72, 200, 40, dtype="float16",
                              epilogue=tsl.ops.bias() + tsl.ops.relu()),
        {"m_inner": 2, "n_inner": 1, "m_outer": 2, "n_outer": 1, "k_inner": 2, "split_k": 4,
         "stages": 2, "outer": "n"}),
    "matmul-s8-split2": (
        lambda: tsl.ops.matmul(48, 64, 200, dtype="int8"),
        {"m_inner": 1, "n_inner": 2, "m_outer": 1, "n_outer": 2, "k_inner": 1, "split_k": 2,
         "stages": 2, "outer": "m"}),
}


@needs_gxx
@needs_nvcc
@pytest.mark.parametrize("name", SPLIT)
def test_split_reduction_emulated_and_assembled(name):
    """Split-K: the GEMM kernel writes each part's partial sums to a workspace, a second
    kernel adds them in order and applies the epilogue once; both run in the emulator (the
    workspace poisoned with NaN / 0x7F bytes) and match NumPy, and ptxas spills nothing in
    either."""
    op, knobs = SPLIT[name]
    art = tsl.build(op(), "tensorcore-sm80", knobs=knobs)
    parts = knobs["split_k"]
    gemm, (total,) = art.kernel, art.kernel.after  # launched in this order
    (work, dtype, elements), = gemm.workspace
    big = art.ctx.op
    assert elements == parts * big.output.shape[0] * big.output.shape[1]
    assert dtype == big.acc_dtype and work in dict(gemm.params) and work in dict(total.params)
    assert art.schedule.split_parts == parts and gemm.grid[0] % parts == 0
    ok, err = wmma_emulator.verify(art, seed=11)
    assert ok and (err == 0 if op().dtype == "int8" else err < 1e-5), err
    ok, summary = art.check("sm_80")
    assert ok, summary
    functions = art.resources("sm_80")["functions"]
    assert set(functions) == {gemm.name, total.name}
    assert all(f["spill_bytes"] == 0 for f in functions.values()), functions


def test_search_splits_the_reduction_where_the_model_says_it_pays():
    """BERT-base's FFN output (128 x 768, K = 3072): 12 output tiles of 64 x 128 in 8 parts
    fill the SMs, and the model prices the partial sums' traffic and the second kernel (its
    launch gap) below the unsplit kernel's time; for K = 768 the gap costs more than the
    split saves, and the search keeps the reduction whole."""
    from tsl.backends.cuda_tensorcore import model

    s, t, mod, occ = _chosen(tsl.ops.dense(128, 3072, 768, dtype="float16"))
    assert s.split_parts > 1 and mod.parts == s.split_parts and mod.sum_gap_seconds > 0
    assert t.blocks >= s.machine.cores() * 2 // 3
    whole = tsl.schedule(s.op, s.machine, knobs={"split_k": 1})
    assert model.price(whole)[0].seconds > mod.seconds
    assert mod.sum_traffic_seconds > 0 and "split reduction: " in str(mod)
    short, *_ = _chosen(tsl.ops.dense(128, 768, 768, dtype="float16"))
    assert short.split_parts == 1
    split = tsl.schedule(short.op, short.machine, knobs={"split_k": 8})
    assert model.price(split)[0].seconds > model.price(short)[0].seconds
    # Machines that do not list splits have no such knob.
    assert "split_k" not in tsl.schedule(s.op, "tensorcore-sm90").space


@needs_gxx
def test_int8_tiles_read_by_ldmatrix_are_padded_free_of_bank_conflicts():
    """TVM's swizzle does not take 8-bit tiles: int8 rows of 128 bytes read by ldmatrix (A, and
    B given as [N, K]) are padded to 144, which puts the 8 rows of an ldmatrix in 8 bank
    groups; the model counts the padding, and the result is exact."""
    from tsl.backends.cuda_tensorcore import model

    art = tsl.build(tsl.ops.dense(40, 256, 48, dtype="int8"), "tensorcore-sm80",
                    knobs={"m_inner": 2, "n_inner": 2, "m_outer": 2, "n_outer": 2, "k_inner": 4,
                           "stages": 2, "split_k": 1, "outer": "n"})
    warps = art.kernel.block[1]
    assert bank_conflicts(art.source(), warps) == {"cp.async": 0, "ldmatrix": 0}
    assert model.price(art.schedule)[1].shared_bytes == art.kernel.shared_bytes
    plain = bank_conflicts(art.source().replace("* 144)", "* 128)"), warps)  # unpadded rows
    assert plain["ldmatrix"] > 0
    ok, err = wmma_emulator.verify(art, seed=4)
    assert ok and err == 0, err
