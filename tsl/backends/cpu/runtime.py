"""Running, timing and estimating a CPU artifact."""

from __future__ import annotations

import os
import time
from functools import cache

import numpy as np

from ...artifact import Artifact
from ...ops.operator import np_dtype
from ...timing import SETTLE_SECONDS, realtime


@cache
def set_threads(n: int) -> None:
    """TVM's pool started with 1 of 2 cores here; size it to the machine's core count, once:
    every reconfiguration starts new worker threads."""
    import tvm_ffi

    os.environ["TVM_NUM_THREADS"] = str(n)
    tvm_ffi.get_global_func("runtime.config_threadpool")(0, n)


class CPUArtifact(Artifact):
    target = "cpu"

    def __init__(self, schedule, ctx, executable, cross: bool = False):
        super().__init__(schedule, ctx)
        self.executable = executable
        self.cross = cross
        self.emulated = False

    def emulate(self) -> "CPUArtifact":
        """Run this cross-compiled artifact under QEMU from now on (`run`, `verify`): the
        numerics of code this host cannot execute. Timing stays unavailable."""
        from . import emulator

        why = emulator.unavailable(self.machine)
        if why:
            from ...errors import BackendUnavailable

            raise BackendUnavailable(f"cannot emulate {self.machine.name} here: {why}")
        self.emulated = True
        return self

    def _runnable(self) -> None:
        if self.cross:
            from ...errors import BackendUnavailable

            raise BackendUnavailable(f"this artifact was cross-compiled for {self.machine.name} "
                                     f"({self.machine.params.mtriple}); export it, "
                                     f"run it under QEMU with `.emulate()`, or build it without "
                                     f"cross=True on such a host to time it")

    def kernel(self):
        """The compiled kernel's entry, linked once: `Executable.__call__` links the module
        again on every call (`jit()` walks its import tree, ~8 us, as much as a small kernel)."""
        ex = self.executable
        if getattr(self, "_linked", (None,))[0] is not ex:
            self._linked = (ex, ex.jit().main)
        return self._linked[1]

    def resident(self) -> bool:
        """Whether bound functions keep their arguments as TVM tensors (`Bound`): not when
        the kernel runs under QEMU or cannot run here (those go through `_execute`)."""
        return not (self.emulated or self.cross)

    def device_empty(self, shape, dtype: str):
        """An uninitialised TVM tensor on this host (TVM's allocator aligns it)."""
        import tvm

        return tvm.runtime.empty(tuple(shape), dtype, tvm.cpu(0))

    def device_tensor(self, x: np.ndarray):
        """A TVM tensor holding a copy of `x` (aligned, unlike NumPy's own buffer)."""
        import tvm

        return tvm.runtime.tensor(np.ascontiguousarray(x), tvm.cpu(0))

    def run_resident(self, args) -> None:
        """One kernel call on TVM tensors (the output last), nothing copied."""
        self._runnable()
        set_threads(self.machine.cores())
        self.kernel()(*args)

    def _tensors(self, packed):
        out = self.ctx.op.output
        return [self.device_tensor(x) for x in packed] + [self.device_empty(out.shape,
                                                                             out.dtype)]

    def _execute(self, packed):
        if self.emulated:
            from . import emulator

            out = self.ctx.op.output
            return emulator.run(self.executable.mod, self.machine, list(packed),
                                np.empty(out.shape, np_dtype(out.dtype)))
        args = self._tensors(packed)
        self.run_resident(args)
        return args[-1].numpy()

    def time(self, *arrays, number: int = 5, repeat: int = 5) -> float:
        """Median seconds of one kernel call (inputs already padded and packed)."""
        import tvm

        self._runnable()
        set_threads(self.machine.cores())
        args = self._tensors(self.prepare(arrays))
        f = self.executable.jit().time_evaluator("main", tvm.cpu(0), number=number,
                                                 repeat=repeat)
        with realtime():
            return float(f(*args).median)

    def benchmark(self, rounds: int = 3, peers=None) -> dict:
        """The median user-level time over `rounds` (what a caller pays per call with the
        constant operands bound once: activation padding, packing and output cropping
        included; `Artifact.user_time`), the kernel's own time and the one-time weight
        preparation apart (a settle pause before each timed region), its rate and share of
        the machine's peak, and with `peers` (a function of the operator returning
        {peer name: {"rate": ops per second, ...}}, each peer timed alone: see
        `tsl.bench.alone.cpu_peers`) the ratio of its op rate to each peer's."""
        peer_rows = peers(self.op) if peers else {}
        xs = self.op.random_inputs(7)
        kernel, user, prep = [], [], []
        for _ in range(rounds):
            time.sleep(SETTLE_SECONDS)
            kernel.append(self.time(*xs, number=3, repeat=3))
            time.sleep(SETTLE_SECONDS)
            with realtime():
                u = self.user_time(xs, repeat=5)
            user.append(u["user_seconds"])
            prep.append(u["weight_prep_seconds"])
        # The row's time is what a caller pays per call (weights bound once, see `user_time`).
        sec = float(np.median(user))
        rate = 2 * self.op.macs / sec
        peak = self.machine.peak(self.op.dtype)
        out = {"seconds": sec, "samples": user, "rate": rate,
               "pct_peak": 100 * rate / peak if peak else 0.0,
               "kernel_seconds": float(np.median(kernel)), "kernel_samples": kernel,
               "weight_prep_seconds": float(np.median(prep)), "bound_inputs": u["bound_inputs"],
               "baseline": None, "speedup": None}
        if peer_rows:
            base = next(iter(peer_rows))
            out.update(baseline=base, baseline_rate=peer_rows[base]["rate"],
                       speedup=rate / peer_rows[base]["rate"],
                       peers={name: {**p, "ratio": rate / p["rate"]}
                              for name, p in peer_rows.items()})
        return out

    def peer_spec(self) -> dict:
        """What a process timing this operator's peers needs (`peers.spec`), with the work of
        one call (2 x MACs) so that rates come back."""
        from .peers import spec

        return {**spec(self.op), "work": 2 * self.op.macs}

    def source(self, kind: str = "ll") -> str:
        """LLVM IR ("ll") or assembly ("asm") of the kernel."""
        return self.executable.mod.inspect_source(kind)

    def estimate(self):
        """The cost model's `Estimate` of this schedule (no measurement: see `time`), with
        the compulsory DRAM traffic (every input read once, the output written once)."""
        from ...model import evaluate

        big = self.ctx.op
        dram = sum(int(np.prod(t.shape)) * np.dtype(np_dtype(t.dtype)).itemsize
                   for t in list(big.inputs) + [big.output])
        return evaluate(self.schedule, detail={"compulsory_dram_bytes": dram})
