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
    """The kernels of an export directory (one; a split reduction's two), launched in order
    with CuPy arrays or NumPy arrays."""

    def __init__(self, path: str | Path):
        import cupy

        path = Path(path)
        self.meta = json.loads((path / "kernel.json").read_text())
        arch = f"sm_{cupy.cuda.Device().compute_capability}"
        images = self.meta["images"]
        image = path / images["cubin"].get(arch, images["ptx"]["file"])
        module = cupy.RawModule(path=str(image))
        self.launches = []
        for launch in self.meta["launches"]:
            function = module.get_function(launch["kernel"])
            if launch["dynamic_shared_bytes"] > 48 * 1024:
                function.max_dynamic_shared_size_bytes = launch["dynamic_shared_bytes"]
            self.launches.append((function, launch))

    def output(self):
        import cupy

        out = self.meta["params"][-1]
        return cupy.empty(tuple(out["shape"]), dtype=np_dtype(out["dtype"]))

    def __call__(self, *args) -> None:
        """Launch on device arrays: the inputs, then the output (in `params` order); the
        workspaces are allocated here."""
        import cupy

        named = {p["name"]: a for p, a in zip(self.meta["params"], args, strict=True)}
        named.update((w["name"], cupy.empty(w["elements"], dtype=np_dtype(w["dtype"])))
                     for w in self.meta["workspace"])
        for function, launch in self.launches:
            function(tuple(launch["grid"]), tuple(launch["block"]),
                     tuple(named[a] for a in launch["args"]),
                     shared_mem=launch["dynamic_shared_bytes"])


@dataclass
class Roofline:
    """The kernel's modelled time (`model.Model`, kind "model") with its occupancy: the detail
    of this back end's `Estimate`. `seconds` is the model; `upper_bound_seconds` the emitted
    instruction's roofline (a rate from it is an upper bound)."""

    model: model.Model
    occupancy: model.Occupancy
    bandwidth: float  # HBM bytes per second
    kind: str = "model"

    @property
    def seconds(self) -> float:
        return self.model.seconds

    @property
    def upper_bound_seconds(self) -> float:
        return self.model.upper_bound_seconds

    def __str__(self) -> str:
        o = self.occupancy
        return "\n".join([
            str(self.model),
            f"  HBM {self.model.hbm_seconds * 1e6:.1f} us (at {self.bandwidth / 1e12:.2f} TB/s: "
            f"each wave reads the panels it tiles once)",
            f"  per block: {o.threads} threads, {o.shared_bytes / 1024:.1f} KiB shared, "
            f"{o.registers} registers/thread ({o.registers_from}); {o.blocks_per_sm} "
            f"block(s)/SM (limited by {o.limited_by}), occupancy {100 * o.fraction:.0f}%"])


def roofline_estimate(machine, macs: int, mod: model.Model, occ: model.Occupancy) -> Estimate:
    """The `Estimate` (kind "model") of a kernel modelled as `mod` with occupancy `occ`."""
    bw = float(machine.params.hbm_bytes_per_s)
    r = Roofline(mod, occ, bw)
    return Estimate(mod.seconds, kind="model", machine=machine.name, clock_hz=machine.clock_hz,
                    bound=mod.limiter, macs=macs, padded_macs=int(mod.padded_flops / 2),
                    peak_macs_per_s=mod.peak / 2,
                    compute_seconds=mod.cycles / mod.clock_hz,
                    traffic={"hbm": int(mod.hbm_seconds * bw)},
                    level_seconds={"hbm": mod.hbm_seconds},
                    detail={"roofline": r, "model": mod, "flops": mod.flops, "peak": mod.peak,
                            "upper_bound_seconds": mod.upper_bound_seconds,
                            "occupancy": occ.fraction, "registers": occ.registers,
                            "shared_bytes": occ.shared_bytes,
                            "blocks_per_sm": occ.blocks_per_sm, "waves": mod.waves})


class TensorCoreArtifact(Artifact):
    target = "cuda_tensorcore"

    def __init__(self, schedule, ctx, kernel: codegen.Kernel):
        super().__init__(schedule, ctx)
        self.kernel = kernel
        self._compiled: dict[str, tuple] = {}

    @property
    def arch(self) -> str:
        return self.machine.params.arch

    # -- code -------------------------------------------------------------------------------
    def source(self) -> str:
        """The CUDA C++ source TVM generated."""
        return self.kernel.source

    def _compile(self, arch: str | None = None) -> tuple[str, bytes, dict]:
        arch = arch or self.arch
        if arch not in self._compiled:
            self._compiled[arch] = codegen.compile_cuda(self.kernel.source, arch,
                                                          self.kernel.name)
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
        rep["fits"] = (rep["registers"] <= m.params.max_registers_per_thread
                       and rep["registers"] * threads <= m.params.registers_per_sm
                       and rep["shared_bytes"] <= m.levels("scratchpad")[0].capacity)
        return rep

    def instructions(self, arch: str | None = None) -> dict[str, int]:
        """How often each Tensor Core / async-copy instruction occurs in the PTX."""
        text = self.ptx(arch)
        return {name: len(re.findall(pat, text)) for name, pat in INSTRUCTIONS.items()}

    @cached_property
    def pipelined(self) -> bool:
        return (any(lp.stages > 1 for lp in self.schedule.loops)
                and bool(self.machine.params.cp_async))

    def check(self, arch: str | None = None) -> tuple[bool, str]:
        """(ok, summary): the PTX has the mma instructions (and cp.async when pipelined), every
        fragment load reads shared memory as such, ptxas spills nothing, no kernel has a stack
        frame (local memory) and its resources fit the machine."""
        ins, res = self.instructions(arch), self.resources(arch)
        mma = ins["wmma.mma"] + ins["mma.sync"]
        problems = ([] if mma else ["no Tensor Core instruction"]) + (
            ["no cp.async in a pipelined kernel"] if self.pipelined and not ins["cp.async"]
            else []) + (
            [f"{ins['wmma.load generic']} fragment loads through generic addresses"]
            if ins["wmma.load generic"] else []) + (
            [f"{res['spill_bytes']} B of register spills"] if res["spill_bytes"] else []) + (
            [f"{res['stack_bytes']} B of local memory (a stack frame: registers indexed at "
             f"run time)"] if res["stack_bytes"] else []) + (
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
        # The function's arguments, as its kernels name them: the output last, "out" after an
        # epilogue, else "C" (a split reduction's GEMM kernel takes a workspace instead).
        names = [f"{p.name}_ptr" for p in self.mod["main"].params]
        if names[:-1] != [f"{t.name}_ptr" for t in big.inputs] or len(names) != len(tensors):
            raise LoweringError(f"the function's parameters {names} are not the operator's "
                                f"tensors {[t.name for t in tensors]} in order")
        # Each parameter is its operator tensor zero-padded at the end of every axis.
        if self.ctx.layouts or self.ctx.unsigned_a or self.ctx.b_dtype:
            raise LoweringError(f"{self.op}: the export describes each input as the operator's "
                                f"tensor zero-padded; this kernel's inputs are transformed "
                                f"further (layouts, compensation or a B dtype)")
        real = {t.role: t for t in list(self.op.inputs) + [self.op.output]}
        params = [{"name": name, "dtype": t.dtype, "shape": list(t.shape), "role": t.role,
                   "kind": "pointer", "tensor": t.name, "real_shape": list(real[t.role].shape)}
                  for name, t in zip(names, tensors)]
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
        """The back end's model (model.price) with this kernel's instruction, shared memory
        and ptxas' registers (the model's count without nvcc): the price the knob search
        gave its schedule, with what the compiler reports in place of the model's guesses."""
        m, k = self.machine, self.kernel
        try:
            regs = self.resources()["registers"]
        except BackendUnavailable:
            regs = None
        mod, occ = model.price(self.schedule, model.instruction_of(k.source), regs,
                               k.shared_bytes)
        return roofline_estimate(m, self.op.macs, mod, occ)

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
