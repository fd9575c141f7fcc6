"""The sm_90a path (TMA + wgmma, cuda_tensorcore/hopper*.py).

No GPU here, and the CPU emulator knows WMMA / mma.sync, not wgmma or TMA: the kernel's
numerics are unverified until an sm_90 GPU runs it (benchmarks/tensorcore_cupy.py). What is
checked without one:

- every fp16 / bf16 GEMM of the default suite compiles for sm_90a; its PTX has wgmma.mma_async
  and cp.async.bulk.tensor, and ptxas (-arch=sm_90a -v) reports no spills;
- the layout logic: one pipeline stage is filled the way the TMA's 128-byte swizzle writes a
  box (the CUDA driver's description: 16-byte chunk c of box row r lands at chunk c ^ (r % 8))
  and read back through the kernel's wgmma descriptors (their LBO / SBO taken from the CUDA
  source TVM generated) by the PTX ISA's canonical layouts (address bits [4:7) ^= [7:10));
  the product over the stage's four k16 slices, scattered through the accumulator fragment
  map, must equal A @ B. A wrong offset, box or transpose fails it (tested).
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

import tsl
from tsl.backends.cuda_tensorcore import backend, hopper
from tsl.backends.cuda_tensorcore import hopper_layout as L

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("ptxas") is None,
                                reason="the CUDA toolkit (nvcc, ptxas) is not installed")

SUITE = [op for op in backend.suite(False)
         if op.name in ("matmul", "dense") and op.dtype in ("float16", "bfloat16")]


@pytest.fixture(scope="module")
def built(suite_built):
    return lambda op: suite_built(op, "tensorcore-sm90")


# -- dispatch -----------------------------------------------------------------------------------
def test_dispatch(built):
    assert isinstance(built(tsl.ops.matmul(256, 256, 128, dtype="bfloat16")),
                      hopper.HopperArtifact)
    small = tsl.ops.matmul(64, 64, 64, dtype="float16")
    assert not hopper.applies(tsl.schedule(small, "tensorcore-sm80"))
    assert not isinstance(tsl.build(small, "tensorcore-sm90", wgmma=False),
                          hopper.HopperArtifact)
    assert not isinstance(tsl.build(small, "tensorcore-sm90", knobs={"stages": 1}),
                          hopper.HopperArtifact)  # knobs describe the warp-level schedule
    for op in (tsl.ops.matmul(64, 64, 64, dtype="int8"),
               tsl.ops.matmul(64, 64, 60, dtype="float16")):  # K rows not 16-byte multiples
        assert not hopper.applies(tsl.schedule(op, "tensorcore-sm90"))


def test_plan_gives_every_sm_a_tile_when_it_can():
    sm90 = tsl.load_machine("tensorcore-sm90")
    big = hopper.plan(tsl.ops.matmul(4096, 4096, 4096, dtype="float16"), sm90)
    assert (big.block_m, big.block_n, big.stages) == (128, 256, 4) and big.tiles >= 132
    bert = hopper.plan(tsl.ops.dense(128, 768, 3072, dtype="float16"), sm90)
    assert (bert.block_m, bert.block_n) == (64, 64)  # the smallest: 96 tiles < 132 SMs
    assert bert.shared_bytes <= sm90.levels("scratchpad")[0].capacity


# -- compiled for sm_90a -----------------------------------------------------------------------
@needs_nvcc
@pytest.mark.parametrize("op", SUITE, ids=str)
def test_suite_gemm_compiles_for_sm90a_with_wgmma_and_tma(built, op):
    art = built(op)
    assert isinstance(art, hopper.HopperArtifact)
    ok, summary = art.check("sm_90")  # sm_90 means sm_90a for this kernel
    assert ok, summary
    ptx = art.ptx()
    assert "wgmma.mma_async.sync.aligned.m64n" in ptx
    assert "cp.async.bulk.tensor.2d" in ptx
    # ptxas' own report (compile_cuda runs `ptxas -v -arch=sm_90a` on this PTX)
    log = art.resources()["log"]
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert spills and spills.groups() == ("0", "0"), log
    assert "Used" in log and "sm_90a" in log


@needs_nvcc
def test_ragged_shape_compiles_with_predicated_stores(built):
    art = built(tsl.ops.dense(200, 72, 136, dtype="bfloat16", epilogue=tsl.ops.bias()
                              + tsl.ops.relu()))
    assert isinstance(art, hopper.HopperArtifact) and art.check()[0]
    assert "max(" in art.source() and "bias_ptr[" in art.source()
    with pytest.raises(tsl.LoweringError, match="sm_80 cannot run"):
        art.ptx("sm_80")


# -- layouts against the PTX ISA -----------------------------------------------------------------
def tma_write(smem: bytearray, dst: int, box: np.ndarray) -> None:
    """A 2-D TMA box of 128-byte rows written with CU_TENSOR_MAP_SWIZZLE_128B."""
    raw = box.view(np.uint8).reshape(box.shape[0], 128)
    for r in range(box.shape[0]):
        for c in range(8):
            off = dst + r * 128 + ((c ^ (r % 8)) * 16)
            smem[off:off + 16] = raw[r, c * 16:(c + 1) * 16].tobytes()


def isa_read(smem: bytearray, start: int, lbo: int, sbo: int, k_major: bool, mn: int):
    """The (mn x 16) operand a wgmma reads through a 128B-swizzle descriptor (canonical
    layouts of the PTX ISA, wgmma "Shared Memory Matrix Layout"): K-major, 8-row core groups
    SBO apart, rows 128 B apart, k contiguous; MN-major, 64-element column groups LBO apart,
    8-row k groups SBO apart, k rows 128 B apart, mn contiguous. Swizzle: bits [4:7) of the
    byte address are XORed with bits [7:10)."""
    out = np.zeros((mn, 16), np.float16)
    for i in range(mn):
        for k in range(16):
            if k_major:
                addr = start + (i // 8) * sbo + (i % 8) * 128 + k * 2
            else:
                addr = start + (i // 64) * lbo + (k // 8) * sbo + (k % 8) * 128 + (i % 64) * 2
            addr ^= ((addr >> 7) & 7) << 4
            out[i, k] = np.frombuffer(bytes(smem[addr:addr + 2]), np.float16)[0]
    return out


def source_descriptors(src: str) -> list[tuple[int, int, int]]:
    """(LBO, SBO, swizzle) of each descriptor the CUDA source encodes, in 16-byte units."""
    return [tuple(map(int, m)) for m in re.findall(
        r"ptx_wgmma_encode_matrix_descriptor\(\(&\(desc_[ab]_ptr\[0\]\)\), [^;]*?, "
        r"(\d+), (\d+), (\d+)\);", src)]


def emulate_stage(a, b, k_major, block_n, a_fields, b_fields):
    """C = A @ B over one 64-deep stage, through TMA writes, descriptor reads and the
    accumulator fragment map (2 consumer warpgroups)."""
    bm = a.shape[0]
    smem = bytearray(bm * 128 + block_n * 128)
    b0 = bm * 128
    tma_write(smem, 0, a)
    if k_major:
        tma_write(smem, b0, b.T.copy())  # [N, K]
    else:
        for off, n in L.b_boxes(block_n, False):
            tma_write(smem, b0 + off, b[:, n:n + 64].copy())
    c = np.zeros((bm, block_n))
    for wg in range(bm // 64):
        acc = np.zeros((64, block_n))
        for kk in range(4):
            da, db = L.a_descriptor(0, wg, kk), L.b_descriptor(b0, kk, k_major)
            ta = isa_read(smem, da.start, 16 * a_fields[0], 16 * a_fields[1], True, 64)
            tb = isa_read(smem, db.start, 16 * b_fields[0], 16 * b_fields[1], k_major, block_n)
            acc += ta.astype(np.float64) @ tb.astype(np.float64).T
        regs = np.zeros((128, block_n // 2))  # what each thread holds, then where it goes
        for t in range(128):
            for i in range(block_n // 2):
                r, col = L.accumulator(i, t % 32, t // 32)
                regs[t, i] = acc[r, col]
        for t in range(128):
            for i in range(block_n // 2):
                r, col = L.accumulator(i, t % 32, t // 32)
                c[wg * 64 + r, col] = regs[t, i]
    return c


def test_accumulator_map_is_the_isa_fragment_layout():
    seen = set()
    for t in range(128):
        lane, warp = t % 32, t // 32
        for i in range(64):
            # ISA figure "WGMMA .m64nNk16 register fragment layout for accumulator matrix D":
            # thread T of warp W holds rows 16W + T/4 and +8, column pairs 8j + 2(T%4)
            row = 16 * warp + lane // 4 + (8 if i % 4 >= 2 else 0)
            col = 8 * (i // 4) + 2 * (lane % 4) + (i % 2)
            assert L.accumulator(i, lane, warp) == (row, col)
            seen.add((row, col))
    assert len(seen) == 64 * 128


@pytest.mark.parametrize("k_major", [True, False], ids=["B[N,K]", "B[K,N]"])
def test_stage_layout_matches_the_isa(built, k_major):
    op = (tsl.ops.dense(128, 64, 128, dtype="float16") if k_major
          else tsl.ops.matmul(128, 128, 64, dtype="float16"))
    art = built(op)
    p = art.plan
    assert p.b_k_major == k_major
    descs = source_descriptors(art.source())
    assert descs, "no wgmma descriptor in the CUDA source"
    a_fields = next(d for d in descs if d[:2] == L.a_descriptor(0, 0, 0).encoded())[:2]
    b_fields = L.b_descriptor(0, 0, k_major).encoded()
    assert all(d[2] == L.SWIZZLE_128B for d in descs)
    assert b_fields in [d[:2] for d in descs]  # the kernel encodes what is emulated here
    maps = L.tensor_maps(p)
    assert maps[0]["box"] == [64, p.block_m] and maps[0]["swizzle"] == L.SWIZZLE_128B
    rng = np.random.default_rng(0)
    bn = 128
    a = rng.standard_normal((128, 64)).astype(np.float16)
    b = rng.standard_normal((64, bn)).astype(np.float16)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = emulate_stage(a, b, k_major, bn, a_fields, b_fields)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # the check can fail: a wrong stride-dimension offset, or the other B major-ness
    wrong = emulate_stage(a, b, k_major, bn, a_fields, (b_fields[0], b_fields[1] // 2))
    assert not np.allclose(wrong, want)
    if not k_major:
        swapped = emulate_stage(a, b, False, bn, a_fields, (b_fields[1], b_fields[0]))
        assert not np.allclose(swapped, want)


# -- model, export, running --------------------------------------------------------------------
def test_estimate_labels_the_large_gemm_an_upper_bound(built):
    art = built(tsl.ops.matmul(4096, 4096, 4096, dtype="float16"))
    est = art.estimate()
    assert est.kind == "model" and est.model.instruction == "wgmma"
    ub = est.flops / est.upper_bound_seconds
    assert est.flops / est.seconds <= ub <= est.peak
    bench = art.benchmark()
    assert bench["kind"] == "model" and bench["baseline"] is None and bench["speedup"] is None
    assert "upper bound" in bench["checks"] and "wgmma roofline" in bench["checks"]


@needs_nvcc
def test_export_describes_the_tensor_maps(built, tmp_path):
    import json

    art = built(tsl.ops.dense(128, 768, 768, dtype="float16"))
    meta = json.loads((art.export(tmp_path) / "kernel.json").read_text())
    assert meta["arch"] == "sm_90a" and meta["format"] == "tsl-cuda-kernel/3"
    assert list(meta["images"]["cubin"]) == ["sm_90a"]
    assert (tmp_path / meta["images"]["cubin"]["sm_90a"]).exists()
    # The GPU script loads the launcher from the export: it has no tsl to import.
    assert (tmp_path / meta["launcher"]).read_text().startswith('"""Launch an exported')
    assert [p["kind"] for p in meta["params"]] == ["tensormap", "tensormap", "pointer",
                                                  "pointer"]
    a, b = meta["tensor_maps"]
    assert a["dims"] == [768, 128] and a["strides_bytes"] == [1536] and a["box"] == [64, 64]
    assert b["dims"] == [768, 768] and b["box"] == [64, 64] and b["swizzle"] == 3
    assert meta["dynamic_shared_bytes"] == art.plan.shared_bytes


def test_tensor_maps_reach_the_driver_as_exported(built):
    """tma_launch (the GPU script's way to launch without TVM) passes kernel.json's tensor
    maps to cuTensorMapEncodeTiled and orders the kernel's arguments as its parameters."""
    import ctypes

    from tsl.backends.cuda_tensorcore import tma_launch

    art = built(tsl.ops.matmul(256, 256, 128, dtype="bfloat16"))
    specs = L.tensor_maps(art.plan)
    calls = []

    class Driver:
        def cuTensorMapEncodeTiled(self, tmap, dtype, rank, addr, dims, strides, box, elem, *rest):
            r = rank.value
            calls.append((dtype.value, addr.value, list(dims), list(strides)[:r - 1], list(box),
                          [x.value for x in rest]))
            assert tmap.value % 64 == 0
            return 0

    maps = {s["tensor"]: tma_launch.encode(s, 4096 * (i + 1), Driver())
            for i, s in enumerate(specs)}
    assert calls[0] == (9, 4096, [128, 256], [256], [64, art.plan.block_m], [0, 3, 0, 0])
    assert calls[1] == (9, 8192, [256, 128], [512], [64, 64], [0, 3, 0, 0])  # B [K, N]: n inner
    meta = {"params": [{"name": n, "kind": "tensormap" if k == "CUtensorMap" else "pointer",
                        "tensor": {"A_map": "A", "B_map": "B", "out_ptr": "out"}[n]}
                       for n, k in art.kernel.params]}
    args = tma_launch.arguments(meta, {"out": 77}, maps)
    assert args[:2] == [maps["A"], maps["B"]] and isinstance(args[2], ctypes.c_uint64)
    with pytest.raises(KeyError, match="out"):
        tma_launch.arguments(meta, {}, maps)


def test_run_without_gpu_is_backend_unavailable(built):
    art = built(tsl.ops.matmul(256, 256, 128, dtype="bfloat16"))
    if hopper.gpu_missing() is None:
        pytest.skip("a GPU is present: the run is the GPU script's")
    with pytest.raises(tsl.BackendUnavailable, match="unverified|cannot run"):
        art.run(*art.op.random_inputs(1))
