"""benchmarks/tensorcore_cupy.py, the script that runs exported Tensor Core kernels on a GPU with
CuPy: its checks and image choice, and a rehearsal end to end with a stand-in CuPy that runs the
kernels on the CPU emulator (tests/gpu_standin), so its first run on a GPU works."""

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tsl
import wmma_emulator
from tsl.backends.cuda_tensorcore import codegen, export

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "tensorcore_cupy.py"
try:
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed: the script "
                                 "computes its references with torch")
spec = importlib.util.spec_from_file_location("tensorcore_cupy", SCRIPT)
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)

IMAGES = {"ptx": {"file": "kernel_sm_80.ptx", "isa": "9.0", "target": "sm_80"},
          "cubin": {a: f"kernel_{a}.cubin" for a in ("sm_80", "sm_86", "sm_89", "sm_90")}}


def test_image_follows_the_driver():
    assert script.choose_image(IMAGES, "sm_90", 13000)[0] == "kernel_sm_80.ptx"
    file, why = script.choose_image(IMAGES, "sm_90", 12040)      # a CUDA 12.4 driver
    assert file == "kernel_sm_90.cubin" and "cannot JIT PTX ISA 9.0 (needs 13.0)" in why
    assert script.choose_image(IMAGES, "sm_86", 13000, "cubin")[0] == "kernel_sm_86.cubin"
    with pytest.raises(RuntimeError, match="cubins only for"):
        script.choose_image(IMAGES, "sm_75", 12040)               # Turing: no cubin, old driver
    hopper = {"ptx": {"file": "k.ptx", "isa": "9.0", "target": "sm_90a"},
              "cubin": {"sm_90a": "k_sm_90a.cubin"}}
    assert script.choose_image(hopper, "sm_90", 12080)[0] == "k_sm_90a.cubin"
    with pytest.raises(RuntimeError):
        script.choose_image(hopper, "sm_100", 13000)              # wgmma code is sm_90 only


def test_cubins_for_every_architecture_the_ptx_assembles_for():
    assert export.cubin_archs("sm_80") == ["sm_80", "sm_86", "sm_89", "sm_90"]
    assert export.cubin_archs("sm_89") == ["sm_89", "sm_90"]
    assert export.cubin_archs("sm_90a") == ["sm_90a"]    # wgmma code: sm_90 only
    assert export.ptx_facts("//\n.version 9.0\n.target sm_80\n") == ("9.0", "sm_80")
    with pytest.raises(tsl.LoweringError, match="no .version"):
        export.ptx_facts("// not PTX")


def gemm_like(shape, k=4096, seed=0):
    """Values with a K=4096 GEMM's spread (uniform(-1, 1) inputs: a sum of K products of
    variance 1/9), drawn uniform (cheaper than normal; the spread is what matters)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * 2 - 1) * math.sqrt(3 * k) / 3


@needs_torch
def test_a_stale_tile_fails_the_check():
    """One 16x16 tile left from an earlier launch (other inputs) in a 4096^2 fp32 output: the
    old norm-wise 1e-2 criterion passed it; the element-wise tolerance does not."""
    ref = gemm_like((4096, 4096))
    abs_sum = torch.full_like(ref, 4096 / 4.0)    # sum_k |a_k b_k| ~ K E|a||b| = K / 4
    meta = {"reduction": 4096, "acc_dtype": "float32", "out_dtype": "float32"}
    tol = script.tolerance(meta, abs_sum, ref)
    out = ref * (1 + 2.0 ** -20)                   # fp32 accumulation in another order
    assert script.compare(out, ref, tol)["ok"]
    out[2048:2064, 1024:1040] = gemm_like((16, 16), seed=2)
    assert float(torch.linalg.norm(out - ref) / torch.linalg.norm(ref)) < 1e-2  # old check
    res = script.compare(out, ref, tol)
    assert not res["ok"] and 200 <= res["bad"] <= 256 and res["worst"] > 10
    out[2048:2064, 1024:1040] = math.nan       # never written (the poison stayed)
    assert script.compare(out, ref, tol)["bad"] == 256


@needs_torch
def test_tolerance_grows_with_k_and_is_exact_for_int8():
    ref, abs_sum = torch.ones(4), torch.ones(4)
    tol = [float(script.tolerance({"reduction": k, "acc_dtype": "float32",
                                   "out_dtype": "float32"}, abs_sum, ref)[0]) for k in (64, 4096)]
    assert 0 < tol[0] < tol[1] < 1e-4
    exact = script.tolerance({"reduction": 4096, "acc_dtype": "int32", "out_dtype": "int32"},
                             abs_sum, ref)
    assert float(exact.max()) == 0
    assert not script.compare(ref + 1, ref, exact)["ok"] and script.compare(ref, ref, exact)["ok"]


# -- the rehearsal ------------------------------------------------------------------------------
# Operators of each reference path (dense + bias + relu in bf16 with sizes that are no multiple
# of the tile, NHWC conv2d in fp16 with 3 -> 20 channels, an exact int8 GEMM), small enough for
# the emulator.
OPS = {"a_dense_bf16": lambda: tsl.ops.dense(100, 72, 50, dtype="bfloat16",
                                             epilogue=tsl.ops.bias() + tsl.ops.relu()),
       "c_conv_f16": lambda: tsl.ops.conv2d(2, 3, 9, 9, 20, 3, 3, padding=1, layout="NHWC",
                                            dtype="float16"),
       "e_matmul_s8": lambda: tsl.ops.matmul(64, 48, 96, dtype="int8"),
       "f_dense_f16_split": lambda: tsl.ops.dense(64, 200, 48, dtype="float16",
                                                  epilogue=tsl.ops.bias() + tsl.ops.relu())}
# A split reduction (two kernels and a workspace) in 4 parts of a K that 4 does not divide.
KNOBS = {"f_dense_f16_split": {"m_inner": 2, "n_inner": 1, "m_outer": 1, "n_outer": 1,
                               "k_inner": 2, "split_k": 4, "stages": 2, "outer": "n"}}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The kernels exported by tsl for sm_80 (one a split reduction: two kernels), and two
    broken copies between them: one whose entry name is wrong (it cannot load), one whose grid
    misses its last block (an output tile is never written)."""
    root = tmp_path_factory.mktemp("kernels")
    for name, op in OPS.items():
        tsl.build(op(), target="tensorcore-sm80", knobs=KNOBS.get(name)).export(root / name)
    conv = json.loads((root / "c_conv_f16" / "kernel.json").read_text())
    assert conv["format"] == script.FORMAT and conv["reference"]["reduction"] == 3 * 3 * 3
    assert [p["real_shape"] for p in conv["params"]] == [[2, 9, 9, 3], [3, 3, 3, 20],
                                                         [2, 9, 9, 20]]
    for arch, cubin in conv["images"]["cubin"].items():   # ptxas' ELF for sm_80 .. sm_90
        assert (root / "c_conv_f16" / cubin).read_bytes()[:4] == b"\x7fELF", arch
    bad_name = shutil.copytree(root / "a_dense_bf16", root / "b_wrong_entry")
    meta = json.loads((bad_name / "kernel.json").read_text())
    wrong = [launch | {"kernel": "no_such_kernel"} for launch in meta["launches"]]
    (bad_name / "kernel.json").write_text(json.dumps(meta | {"launches": wrong}))
    short = shutil.copytree(root / "a_dense_bf16", root / "d_grid_short")
    meta["launches"][0]["grid"][0] -= 1
    (short / "kernel.json").write_text(json.dumps(meta | {"operator": "dense short grid"}))
    return root


needs_tools = pytest.mark.skipif(codegen.nvcc() is None or not wmma_emulator.available(),
                                 reason="the export needs nvcc, the emulator g++")


def rehearse(root, *args, driver="12040"):
    env = dict(os.environ, TSL_STANDIN_DRIVER=driver, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "tests" / "gpu_standin"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, str(SCRIPT), "run", str(root), "--torch-device",
                          "cpu", "--repeat", "2", "--runs", "1", *args],
                         capture_output=True, text=True, env=env, timeout=600)
    print(res.stdout[-6000:], res.stderr[-3000:])
    return res


@needs_tools
@needs_torch
def test_rehearsal_on_the_emulator(exported):
    """Driver first; a CUDA 12.4 driver cannot JIT the `.version 9.0` PTX, so the sm_90 cubin is
    chosen; every good kernel verifies before and after timing, with events and a graph, and
    has a torch row of the same output dtype (conv2d: flagged, torch has none); the kernel
    that cannot load and the one that leaves a tile unwritten are reported, the run goes on
    past them, and the exit status says that not every kernel verified. (In one process here,
    to save the emulator's compilations; the next test runs the default, a process per
    kernel.)"""
    res = rehearse(exported, "--no-isolate")  # one process: the emulator compiles each once
    out = res.stdout
    assert res.returncode == 1
    assert out.index("nvidia-smi") < out.index("CUDA driver 12.4") < out.index("GPU 0:") \
        < out.index("a_dense_bf16:")
    rows = {line.split(" | ")[0].strip(): [c.strip() for c in line.split(" | ")]
            for line in out.splitlines() if " | " in line}
    for name in ("dense(100x50x72, bfloat16, bias+relu)", "conv2d(2x3x9x9x20x3x3, float16)",
                 "matmul(64x48x96, int8)", "dense(64x48x200, float16, bias+relu)"):
        row = rows[name]
        assert row[1] == "cubin sm_90" and row[2] == "ok/ok", row
        assert float(row[6]) > 0 and float(row[7]) > 0          # events and graph times
    assert rows["dense(100x50x72, bfloat16, bias+relu)"][9] == "torch.addmm (F.linear)+relu"
    assert rows["conv2d(2x3x9x9x20x3x3, float16)"][12].startswith("(")
    assert rows["matmul(64x48x96, int8)"][5] == "0"             # exact
    assert rows["b_wrong_entry"][2] == "ERROR" and "no_such_kernel" in rows["b_wrong_entry"][3]
    short = rows["dense short grid"]
    assert short[2] == "FAIL/FAIL" and short[3] == "inf"        # NaN poison left in a tile
    assert "4 of 6 kernels verified" in out


@needs_tools
@needs_torch
def test_rehearsal_exit_status_and_ptx(exported, tmp_path):
    """Each kernel in a process of its own (the default); with a CUDA 13 driver the PTX is
    JIT-compiled; all kernels verified: exit status 0."""
    kernels = shutil.copytree(exported / "e_matmul_s8", tmp_path / "kernels" / "e_matmul_s8")
    res = rehearse(kernels.parent, "--json", str(tmp_path / "rows.json"), driver="13000")
    assert res.returncode == 0 and "| ptx 9.0 |" in res.stdout
    assert "1 of 1 kernels verified" in res.stdout
    row, = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert row["verified"] and row["after"]["bad"] == 0 and row["graph_ms"] > 0
