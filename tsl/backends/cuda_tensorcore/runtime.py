"""The Tensor Core artifact: CUDA source, PTX and resources, export, estimate, and running
through CuPy where there is an NVIDIA GPU.

`CupyKernel` launches an exported kernel from its directory (cubin or PTX + kernel.json) with
nothing but NumPy and CuPy; `benchmarks/tensorcore_cupy.py` verifies and times such directories
on a GPU machine without tsl or TVM (export.py: what kernel.json tells it).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from ...artifact import Artifact
from ...errors import BackendUnavailable, LoweringError
from ...model import Estimate
from ...ops.operator import np_dtype
from . import codegen, export, model

INSTRUCTIONS = {"wmma.mma": r"wmma\.mma\.sync", "mma.sync": r"(?<![\w.])mma\.sync\.aligned",
                "wmma.load": r"wmma\.load", "ldmatrix": r"ldmatrix",
                "cp.async": r"cp\.async\.c[ag]",
                # a fragment load through a generic address: LD + MOVM in SASS, not LDSM
                "wmma.load generic": r"wmma\.load\.[ab]\.sync\.aligned\.\w+\.m\d+n\d+k\d+"
                                     r"\.(?!shared)"}


def gpu_missing() -> str | None:
    """Why kernels cannot run here (None when CuPy sees a CUDA GPU)."""
    try:
        import cupy
    except ImportError:
        return "no CUDA GPU runtime: CuPy is not installed (pip install cupy-cuda12x)"
    try:
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return None
    except Exception:  # noqa: BLE001 - CuPy raises CUDARuntimeError without a driver
        pass
    return "no CUDA GPU on this machine (CuPy finds no device)"


class CupyKernel:
    """A kernel loaded from an export directory, launched with CuPy arrays or NumPy arrays."""

    def __init__(self, path: str | Path):
        import cupy

        path = Path(path)
        self.meta = json.loads((path / "kernel.json").read_text())
        arch = f"sm_{cupy.cuda.Device().compute_capability}"
        images = self.meta["images"]
        image = path / images["cubin"].get(arch, images["ptx"]["file"])
        self.function = cupy.RawModule(path=str(image)).get_function(self.meta["kernel"])
        dyn = self.meta["dynamic_shared_bytes"]
        if dyn > 48 * 1024:
            self.function.max_dynamic_shared_size_bytes = dyn

    def output(self):
        import cupy

        out = self.meta["params"][-1]
        return cupy.empty(tuple(out["shape"]), dtype=np_dtype(out["dtype"]))

    def __call__(self, *args) -> None:
        """Launch on device arrays: the inputs, then the output (in `params` order)."""
        m = self.meta
        self.function(tuple(m["grid"]), tuple(m["block"]), args,
                      shared_mem=m["dynamic_shared_bytes"])


@dataclass
class Roofline:
    """The kernel's modelled time (`model.Model`, kind "model") with its on-chip footprint and
    occupancy: the detail of this back end's `Estimate`. `seconds` is the model;
    `upper_bound_seconds` the emitted instruction's roofline (a rate from it is an upper
    bound)."""

    machine: str
    flops: float
    padded_flops: float
    peak: float  # operations per second for the operator's dtype
    bandwidth: float  # HBM bytes per second
    hbm_bytes: int
    blocks: int
    threads: int
    shared_bytes: int
    registers: int
    registers_from: str  # "ptxas" or "fragments" (an estimate without nvcc)
    blocks_per_sm: int
    sms: int
    max_warps: int
    model: model.Model
    kind: str = "model"

    @property
    def waves(self) -> float:
        return self.model.waves

    @property
    def wave_efficiency(self) -> float:
        return self.model.wave_efficiency

    @property
    def compute_seconds(self) -> float:
        return self.model.cycles / self.model.clock_hz

    @property
    def memory_seconds(self) -> float:
        return self.hbm_bytes / self.bandwidth

    @property
    def seconds(self) -> float:
        return self.model.seconds

    @property
    def upper_bound_seconds(self) -> float:
        return self.model.upper_bound_seconds

    @property
    def occupancy(self) -> float:
        return self.blocks_per_sm * self.threads / 32 / self.max_warps

    def __str__(self) -> str:
        return "\n".join([
            str(self.model),
            f"  HBM {self.memory_seconds * 1e6:.1f} us ({self.hbm_bytes / 1e6:.1f} MB at "
            f"{self.bandwidth / 1e12:.2f} TB/s: each wave reads the panels it tiles once)",
            f"  per block: {self.threads} threads, {self.shared_bytes / 1024:.1f} KiB shared, "
            f"{self.registers} registers/thread ({self.registers_from}); {self.blocks_per_sm} "
            f"block(s)/SM, occupancy {100 * self.occupancy:.0f}%"])


class TensorCoreArtifact(Artifact):
    target = "cuda_tensorcore"

    def __init__(self, schedule, ctx, kernel: codegen.Kernel):
        super().__init__(schedule, ctx)
        self.kernel = kernel
        self._compiled: dict[str, tuple] = {}

    @property
    def arch(self) -> str:
        return self.machine.params["arch"]

    # -- code -------------------------------------------------------------------------------
    def source(self) -> str:
        """The CUDA C++ source TVM generated."""
        return self.kernel.source

    def _compile(self, arch: str | None = None) -> tuple[str, bytes, dict]:
        arch = arch or self.arch
        if arch not in self._compiled:
            self._compiled[arch] = codegen.compile_cuda(self.kernel.source, arch)
        return self._compiled[arch]

    def ptx(self, arch: str | None = None) -> str:
        """PTX for `arch` (default: the machine's) through nvcc; BackendUnavailable without."""
        return self._compile(arch)[0]

    def resources(self, arch: str | None = None) -> dict:
        """ptxas' report (registers, static shared bytes, spills) with the launch's dynamic
        shared memory and whether it all fits the machine."""
        rep = dict(self._compile(arch)[2])
        k, m = self.kernel, self.machine
        threads = math.prod(k.block)
        rep.update(dynamic_shared_bytes=k.dynamic_shared_bytes, threads=threads,
                   shared_bytes=k.dynamic_shared_bytes + rep["static_shared_bytes"])
        rep["fits"] = (rep["registers"] <= m.params["max_registers_per_thread"]
                       and rep["registers"] * threads <= m.params["registers_per_sm"]
                       and rep["shared_bytes"] <= m.levels("scratchpad")[0].capacity)
        return rep

    def instructions(self, arch: str | None = None) -> dict[str, int]:
        """How often each Tensor Core / async-copy instruction occurs in the PTX."""
        text = self.ptx(arch)
        return {name: len(re.findall(pat, text)) for name, pat in INSTRUCTIONS.items()}

    @cached_property
    def pipelined(self) -> bool:
        return (any(lp.stages > 1 for lp in self.schedule.loops)
                and bool(self.machine.params.get("cp_async")))

    def check(self, arch: str | None = None) -> tuple[bool, str]:
        """(ok, summary): the PTX has the mma instructions (and cp.async when pipelined), every
        fragment load reads shared memory as such, ptxas spills nothing and its resources fit
        the machine."""
        ins, res = self.instructions(arch), self.resources(arch)
        mma = ins["wmma.mma"] + ins["mma.sync"]
        problems = ([] if mma else ["no Tensor Core instruction"]) + (
            ["no cp.async in a pipelined kernel"] if self.pipelined and not ins["cp.async"]
            else []) + (
            [f"{ins['wmma.load generic']} fragment loads through generic addresses"]
            if ins["wmma.load generic"] else []) + (
            [f"{res['spill_bytes']} B of register spills"] if res["spill_bytes"] else []) + (
            [] if res["fits"] else ["resources exceed the machine"])
        loads = (f"mma.sync x{ins['mma.sync']}, ldmatrix x{ins['ldmatrix']}" if ins["mma.sync"]
                 else f"wmma.mma x{ins['wmma.mma']}, wmma.load x{ins['wmma.load']}")
        summary = (f"{loads}, cp.async x{ins['cp.async']}; {res['registers']} regs, "
                   f"{res['shared_bytes']} B "
                   f"shared, {res['spill_bytes']} B spills ({arch or self.arch})")
        return not problems, summary + "".join(f"; FAIL: {p}" for p in problems)

    def export(self, path) -> Path:
        """Write kernel.cu, the PTX, a cubin for every architecture it assembles for, and
        kernel.json with everything CuPy's RawModule needs to launch it (name, grid, block,
        dynamic shared memory, parameters in order with shapes and dtypes) and to check it
        (the reference operator): see export.py."""
        ptx, cubin, rep = self._compile()
        big = self.ctx.op
        tensors = list(big.inputs) + [big.output]
        # The output is the kernel's last parameter: "out" after an epilogue, else "C".
        names = [n for n, _ in self.kernel.params]
        if names[:-1] != [f"{t.name}_ptr" for t in big.inputs] or len(names) != len(tensors):
            raise LoweringError(f"kernel parameters {self.kernel.params} are not the operator's "
                                f"tensors {[t.name for t in tensors]} in order")
        # Each parameter is its operator tensor zero-padded at the end of every axis.
        if self.ctx.layouts or self.ctx.unsigned_a or self.ctx.b_dtype:
            raise LoweringError(f"{self.op}: the export describes each input as the operator's "
                                f"tensor zero-padded; this kernel's inputs are transformed "
                                f"further (layouts, compensation or a B dtype)")
        real = {t.role: t for t in list(self.op.inputs) + [self.op.output]}
        params = [{"name": name, "dtype": t.dtype, "shape": list(t.shape), "role": t.role,
                   "kind": "pointer", "tensor": t.name, "real_shape": list(real[t.role].shape)}
                  for (name, _), t in zip(self.kernel.params, tensors)]
        return export.write(path, self, ptx, cubin, rep, params)

    # -- running ----------------------------------------------------------------------------
    def _execute(self, packed):
        why = gpu_missing()
        if why:
            raise BackendUnavailable(f"cannot run {self.op} on {self.machine.name}: {why}. The "
                                     f"kernel still builds here: see .source(), .ptx(), "
                                     f".export(path) and .estimate()")
        import tempfile

        import cupy

        with tempfile.TemporaryDirectory() as tmp:
            kern = CupyKernel(self.export(tmp))
        args = [cupy.asarray(x) for x in packed]
        out = kern.output()
        kern(*args, out)
        return cupy.asnumpy(out)

    # -- cost -------------------------------------------------------------------------------
    def estimate(self) -> Estimate:
        m, k = self.machine, self.kernel
        big = self.ctx.op
        threads = math.prod(k.block)
        try:
            regs, src = self.resources()["registers"], "ptxas"
        except BackendUnavailable:
            regs, src = k.fragment_bytes // 128 + 32, "fragments"
        per_block = k.dynamic_shared_bytes + k.static_shared_bytes + 1024  # 1 KiB reserved
        by_smem = int(m.params["smem_per_sm"]) // per_block
        by_regs = int(m.params["registers_per_sm"]) // max(regs * threads, 1)
        by_warps = int(m.params["max_warps_per_sm"]) // max(threads // 32, 1)
        per_sm = max(min(by_smem, by_regs, by_warps), 1)
        hbm = self._hbm_bytes(per_sm * m.cores())
        flops, padded = 2.0 * self.op.macs, 2.0 * big.macs
        mod = model.model(m, model.tile_of(self.schedule, k), flops, padded, per_sm, hbm,
                          big.dtype)
        r = Roofline(m.name, flops, padded, m.peak(big.dtype),
                     float(m.params["hbm_bytes_per_s"]), hbm, math.prod(k.grid), threads,
                     k.dynamic_shared_bytes + k.static_shared_bytes, regs, src, per_sm,
                     m.cores(), int(m.params["max_warps_per_sm"]), mod)
        return Estimate(r.seconds, kind="model", machine=m.name, clock_hz=m.clock_hz,
                        bound=mod.limiter, macs=self.op.macs, padded_macs=big.macs,
                        peak_macs_per_s=r.peak / 2, compute_seconds=r.compute_seconds,
                        traffic={"hbm": r.hbm_bytes}, level_seconds={"hbm": r.memory_seconds},
                        detail={"roofline": r, "model": mod, "flops": r.flops, "peak": r.peak,
                                "upper_bound_seconds": r.upper_bound_seconds,
                                "occupancy": r.occupancy, "registers": r.registers,
                                "shared_bytes": r.shared_bytes, "blocks_per_sm": r.blocks_per_sm,
                                "waves": r.waves})

    def _hbm_bytes(self, resident: int) -> int:
        """Blocks run in waves of `resident` (SMs x blocks per SM) in launch order; the L2
        cache lets a wave read each A row-panel and B column-panel it touches once."""
        s, big = self.schedule, self.ctx.op
        ext = s.padded_extents()
        block = {a: 1 for a in ext}
        core = next((i for i, lp in enumerate(s.loops) if lp.parallel
                     and s.machine.compute_level(lp.parallel).role == "core"), -1)
        for lp in s.loops[core + 1:]:
            for part in lp.parts or (lp,):
                block[part.axes[0]] *= part.extent
        cols = math.prod(ext[a] // block[a] for a in ext if s.role_of(a) == "n")
        rows = math.prod(ext[a] // block[a] for a in ext if s.role_of(a) in ("m", "b"))
        size = {t.role: math.prod(t.shape) * np.dtype(np_dtype(t.dtype)).itemsize
                for t in list(big.inputs) + [big.output]}
        waves = math.ceil(rows * cols / resident)
        per_wave = (min(rows, math.ceil(resident / cols)) * size["A"] / rows
                    + min(cols, resident) * size["B"] / cols)
        reread = size["A"] * cols + size["B"] * rows
        once = size["A"] + size["B"]
        return int(max(once, min(reread, waves * per_wave)) + size["out"] + size.get("bias", 0))

    def benchmark(self) -> dict:
        """Without a GPU: the model's time (no baseline: nothing was measured to compare
        with), its upper bound, and the PTX checks."""
        est = self.estimate()
        try:
            ok, checks = self.check()
        except BackendUnavailable as e:
            ok, checks = False, f"not compiled: {e}"
        up = est.flops / est.upper_bound_seconds
        return {"seconds": est.seconds, "rate": est.flops / est.seconds,
                "pct_peak": 100 * est.flops / est.seconds / est.peak, "kind": "model",
                "upper_bound_rate": up, "baseline": None, "speedup": None, "ptx_ok": ok,
                "checks": f"model, limited by {est.model.limiter}; upper bound "
                          f"{up / 1e12:.0f} TFLOP/s ({est.model.instruction} roofline); {checks}",
                "estimated": True}
