"""The sm_90a path: fp16 / bf16 GEMMs (matmul, dense; bias and relu epilogues) as a
warp-specialized TMA + wgmma kernel (hopper_kernel.py), built through TVM's TIRx pipeline.

Selected by the back end for a machine whose arch is sm_90 when `applies(schedule)`; every
other operator (int8, conv2d, batched, other epilogues, strides TMA cannot describe) keeps the
warp-level path, and so does a schedule function or knobs given to tsl.build (they describe
the warp-level kernel). `tsl.build(op, "tensorcore-sm90", wgmma=False)` asks for the
warp-level kernel on sm_90 too.

The plan is the shape's: TSL's GEMM schedule tiles for a warp-level primitive (16x16x16), and
a wgmma kernel's block tile is a multiple of a warpgroup's 64 rows, so the block tile is the
largest of BLOCKS that still gives every SM a tile (the smallest when none does), 64 k per
stage, and as many stages as shared memory holds (at most 6). Edge tiles need no padding: TMA
fills what lies outside the tensor with zeros and the epilogue's stores are predicated.

Numerics: TVM emits the CUDA, nvcc / ptxas assemble it for sm_90a; without an sm_90 GPU the
kernel cannot run here (the CPU emulator knows WMMA and mma.sync, not wgmma or TMA), so its
results are unverified until a GPU runs it. Its layout numbers are checked against the PTX ISA
in tests/test_tensorcore_sm90.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from ...errors import BackendUnavailable, LoweringError
from ...model import Estimate
from . import codegen, export, model
from . import hopper_layout as L
from .runtime import TensorCoreArtifact, gpu_missing, roofline_estimate

ARCH = "sm_90a"  # wgmma and setmaxnreg exist only in the arch-specific target
BLOCKS = ((128, 256), (128, 128), (64, 128), (64, 64))  # (BM, BN), best first
MAX_STAGES = 6
PRODUCER_THREADS = 128  # one warpgroup; one of its threads issues the TMA copies
BARRIER_BYTES = 16  # per stage: its full and empty mbarriers (in the dynamic shared memory)
INSTRUCTIONS = {"wgmma.mma_async": r"wgmma\.mma_async", "cp.async.bulk.tensor":
                r"cp\.async\.bulk\.tensor", "mbarrier": r"mbarrier\.", "setmaxnreg": r"setmaxnreg"}


@dataclass(frozen=True)
class Plan:
    m: int
    n: int
    k: int
    dtype: str
    b_k_major: bool  # B given as [N, K] (dense weights, matmul(transpose_b=True))
    bias: bool
    relu: bool
    block_m: int
    block_n: int
    stages: int

    @property
    def tiles(self) -> int:
        return math.ceil(self.m / self.block_m) * math.ceil(self.n / self.block_n)

    @property
    def threads(self) -> int:
        return PRODUCER_THREADS + 128 * (self.block_m // L.WGMMA_M)

    @property
    def stage_bytes(self) -> int:
        return (self.block_m + self.block_n) * L.BLOCK_K * 2

    @property
    def shared_bytes(self) -> int:
        """The kernel's dynamic shared memory: tiles and barriers of every stage."""
        return self.stages * (self.stage_bytes + BARRIER_BYTES)


def applies(schedule) -> bool:
    """Whether `schedule`'s operator and machine take the sm_90a wgmma kernel."""
    op, m = schedule.op, schedule.machine
    if m.params.arch != "sm_90" or op.name not in ("matmul", "dense"):
        return False
    if op.dtype not in ("float16", "bfloat16") or op.acc_dtype != "float32":
        return False
    kinds = [s.kind for s in op.epilogue.steps]
    if kinds not in ([], ["bias"], ["relu"], ["bias", "relu"]) or op.epilogue.out_dtype:
        return False
    M, N, K = op.params["shape"]
    # TMA: global row strides are multiples of 16 bytes
    return K % 8 == 0 and (op.params["transpose_b"] or N % 8 == 0)


def plan(op, machine) -> Plan:
    M, N, K = op.params["shape"]
    sms = machine.cores()
    bm, bn = next(((bm, bn) for bm, bn in BLOCKS
                   if math.ceil(M / bm) * math.ceil(N / bn) >= sms), BLOCKS[-1])
    smem = machine.levels("scratchpad")[0].capacity
    kinds = [s.kind for s in op.epilogue.steps]
    stages = min(MAX_STAGES, smem // ((bm + bn) * L.BLOCK_K * 2 + BARRIER_BYTES),
                 max(2, math.ceil(K / L.BLOCK_K)))
    return Plan(M, N, K, op.dtype, bool(op.params["transpose_b"]), "bias" in kinds,
                "relu" in kinds, bm, bn, stages)


def build(schedule) -> "HopperArtifact":
    p = plan(schedule.op, schedule.machine)
    mod, source = generate(p, schedule.machine)
    return HopperArtifact(schedule, p, mod, source)


def generate(p: Plan, machine):
    """(TIRx IRModule, CUDA source) of plan `p`."""
    import tvm

    from . import hopper_kernel

    try:
        mod = tvm.IRModule({"main": hopper_kernel.kernel_func(p)})
        tgt = tvm.target.Target({"kind": "cuda", "arch": ARCH})
        ex = tvm.compile(mod, target=tgt, tir_pipeline="tirx")
        source = ex.mod.imports[0].inspect_source()
    except Exception as e:  # noqa: BLE001 - TVM's error classes vary by pass
        from ...lower import _first_line

        raise LoweringError(f"sm_90a wgmma kernel for {machine.name} failed to generate: "
                            f"{_first_line(e)}") from e
    return mod, source


class HopperArtifact(TensorCoreArtifact):
    """A TensorCoreArtifact whose kernel is the TIRx wgmma one: same PTX / resources / export
    / estimate surface, `arch` sm_90a, tensor maps instead of A and B pointers."""

    def __init__(self, schedule, p: Plan, mod, source: str):
        kernel = codegen.Kernel(
            "main_kernel", source, (p.tiles, 1, 1), (p.threads, 1, 1),
            p.shared_bytes, 0, 0,
            tuple([("A_map", "CUtensorMap"), ("B_map", "CUtensorMap")]
                  + ([("bias_ptr", "float32")] if p.bias else []) + [("out_ptr", "float32")]))
        super().__init__(schedule, None, kernel)
        self.plan = p
        self._mod = mod
        codegen.check_fits(kernel, schedule.machine)

    @property
    def arch(self) -> str:
        return ARCH

    def _compile(self, arch: str | None = None) -> tuple[str, bytes, dict]:
        """sm_90 means sm_90a here (wgmma and setmaxnreg exist only there); another arch
        cannot run this kernel: LoweringError."""
        if arch not in (None, "sm_90", ARCH):
            raise LoweringError(f"{self.op} was built as an sm_90a wgmma kernel, which {arch} "
                                f"cannot run: build it for that machine instead "
                                f"(tsl.build(op, 'tensorcore-sm80'), or wgmma=False)")
        return super()._compile(ARCH)

    @property
    def mod(self):
        """The TIRx module (host part encodes the tensor maps, device part is the kernel)."""
        return self._mod

    @cached_property
    def pipelined(self) -> bool:
        return True

    def prepare(self, arrays) -> list[np.ndarray]:
        return [np.ascontiguousarray(x) for x in self.check_inputs(arrays)]

    def instructions(self, arch: str | None = None) -> dict[str, int]:
        text = self.ptx(arch)
        return {name: len(re.findall(pat, text)) for name, pat in INSTRUCTIONS.items()}

    def check(self, arch: str | None = None) -> tuple[bool, str]:
        """(ok, summary): the PTX has wgmma.mma_async and TMA copies, ptxas spills nothing and
        the resources fit the machine."""
        ins, res = self.instructions(arch), self.resources(arch)
        problems = ([] if ins["wgmma.mma_async"] else ["no wgmma.mma_async"]) + (
            [] if ins["cp.async.bulk.tensor"] else ["no TMA copy (cp.async.bulk.tensor)"]) + (
            [f"{res['spill_bytes']} B of register spills"] if res["spill_bytes"] else []) + (
            [] if res["fits"] else ["resources exceed the machine"])
        p = self.plan
        summary = (f"wgmma.mma_async x{ins['wgmma.mma_async']} (m64n{p.block_n}k16), "
                   f"cp.async.bulk.tensor x{ins['cp.async.bulk.tensor']}; block "
                   f"{p.block_m}x{p.block_n}x{L.BLOCK_K}, {p.stages} stages; "
                   f"{res['registers']} regs, {res['shared_bytes']} B shared, "
                   f"{res['spill_bytes']} B spills ({arch or self.arch})")
        return not problems, summary + "".join(f"; FAIL: {p}" for p in problems)

    def export(self, path) -> Path:
        """kernel.cu, PTX and cubin for sm_90a, and kernel.json (export.py) with the
        parameters in order (two CUtensorMaps, then bias and out pointers) and `tensor_maps`,
        what cuTensorMapEncodeTiled needs for each map (tma_launch.py launches it)."""
        ptx, cubin, rep = self._compile()
        op = self.op
        by_name = {t.name: t for t in list(op.inputs) + [op.output]}
        tensor_of = {"A_map": "A", "B_map": "B", "bias_ptr": "bias", "out_ptr": "out"}
        params = []
        for name, kind in self.kernel.params:
            t = by_name[tensor_of[name]]
            params.append({"name": name, "dtype": t.dtype, "shape": list(t.shape),
                           "real_shape": list(t.shape), "role": t.role,
                           "kind": "tensormap" if kind == "CUtensorMap" else "pointer",
                           "tensor": t.name})
        return export.write(path, self, ptx, cubin, rep, params,
                            tensor_maps=L.tensor_maps(self.plan),
                            numerics="unverified without an sm_90 GPU")

    def _execute(self, packed):
        """On an sm_90 GPU, through TVM's own runtime: its host code encodes the tensor maps
        and launches the kernel."""
        why = gpu_missing()
        import tvm

        if why is None and not tvm.runtime.enabled("cuda"):
            why = "TVM was built without a CUDA runtime here"
        if why:
            raise BackendUnavailable(f"cannot run {self.op} on {self.machine.name}: {why}. The "
                                     f"kernel still builds here: see .source(), .ptx(), "
                                     f".export(path) and .estimate()")
        dev = tvm.cuda(0)
        ex = tvm.compile(self._mod, target=tvm.target.Target({"kind": "cuda", "arch": ARCH}),
                         tir_pipeline="tirx")
        args = [tvm.runtime.tensor(x, dev) for x in packed]
        out = tvm.runtime.empty(self.op.output.shape, self.op.output.dtype, dev)
        ex(*args, out)
        return out.numpy()

    # -- cost -------------------------------------------------------------------------------
    def estimate(self) -> Estimate:
        """The back end's model (model.py) with this kernel's tile and instruction, wgmma:
        per k-step the consumer warpgroups read (64 + BN) x 64 operands each from shared
        memory (expressed as 4 warps of 16 x BN/4 per warpgroup)."""
        m, p, k = self.machine, self.plan, self.kernel
        try:
            regs, src = self.resources()["registers"], "ptxas"
        except BackendUnavailable:
            regs, src = 168, "launch bound"  # what ptxas gives 384 threads
        occ = model.occupancy(m, p.threads, regs, k.shared_bytes, src)
        consumers = p.block_m // L.WGMMA_M
        tile = model.Tile(block_m=p.block_m, block_n=p.block_n, block_k=L.BLOCK_K,
                          k_steps=math.ceil(p.k / L.BLOCK_K), warps=4 * consumers,
                          warp_m=16, warp_n=p.block_n // 4, stages=p.stages, blocks=p.tiles,
                          in_bytes=2, acc_bytes=4, instruction="wgmma")
        hbm = self._hbm(occ.blocks_per_sm * m.cores())
        padded = 2.0 * math.ceil(p.m / p.block_m) * p.block_m * math.ceil(
            p.n / p.block_n) * p.block_n * math.ceil(p.k / L.BLOCK_K) * L.BLOCK_K
        mod = model.model(m, tile, 2.0 * self.op.macs, padded, occ.blocks_per_sm, hbm, p.dtype)
        return roofline_estimate(m, self.op.macs, mod, occ)

    def _hbm(self, resident: int) -> int:
        """HBM bytes: a wave of `resident` tiles (tile index m-fastest) reads the A row
        panels and B column panels it touches once (L2 keeps them for the wave)."""
        p = self.plan
        rows, cols = math.ceil(p.m / p.block_m), math.ceil(p.n / p.block_n)
        a, b = p.m * p.k * 2, p.k * p.n * 2
        waves = math.ceil(rows * cols / resident)
        per_wave = min(rows, resident) * a / rows + min(cols, math.ceil(resident / rows)) * b / cols
        return int(max(a + b, waves * per_wave) + p.m * p.n * 4 + (p.n * 4 if p.bias else 0))
