"""Running a VTA program in the simulator, and its cost report."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...artifact import Artifact
from ...errors import LoweringError
from ...ops.operator import np_dtype
from .codegen import DRAM_ALIGN, Program
from .simulator import DRAM, Simulator
from .timing import MODULES, Stats, run_pipeline


@dataclass
class Estimate:
    """Cycles of a program under the cycle model of `timing.py` (no data needed: the timing of
    a VTA program does not depend on the values), with the model's assumptions."""

    stats: Stats
    macs: int  # of the operator (before padding)
    peak_macs_per_cycle: float
    assumptions: dict

    @property
    def cycles(self) -> int:
        return self.stats.cycles

    @property
    def seconds(self) -> float:
        return self.stats.seconds

    @property
    def pct_peak(self) -> float:
        return 100.0 * self.macs / (self.cycles * self.peak_macs_per_cycle)

    def __str__(self) -> str:
        st = self.stats
        c = max(st.cycles, 1)
        moved = {k: (st.bytes_read[k], st.bytes_written[k]) for k in st.bytes_read
                 if st.bytes_read[k] or st.bytes_written[k]}
        return "\n".join([
            f"cycles {st.cycles:,} = {st.seconds * 1e3:.3f} ms at {st.clock_hz / 1e6:g} MHz; "
            f"{self.pct_peak:.1f}% of {self.peak_macs_per_cycle:g} MACs/cycle "
            f"({self.macs:,} MACs)",
            f"uops: GEMM {st.gemm_uops:,}, reset {st.reset_uops:,}, ALU {st.alu_uops:,}",
            "DRAM bytes (read/written): " + ", ".join(f"{k} {r:,}/{w:,}"
                                                     for k, (r, w) in moved.items()),
            "busy: " + ", ".join(f"{m} {st.busy[m]:,} ({100 * st.busy[m] / c:.0f}%)"
                                 for m in MODULES),
            "instructions: " + ", ".join(f"{k} {v}" for k, v in st.insn_counts.items()),
            "model: " + ", ".join(f"{k}={v}" for k, v in self.assumptions.items())])


class VTAArtifact(Artifact):
    target = "vta"

    def __init__(self, schedule, ctx, program: Program, layouts: dict):
        super().__init__(schedule, ctx)
        self._program = program
        self.out_layout = layouts["out"]
        self._estimate = None

    def program(self) -> Program:
        """The instruction stream (print it for one line per instruction; .words() gives the
        128-bit words)."""
        return self._program

    def source(self) -> str:
        return str(self._program)

    def _execute(self, packed):
        prog = self._program
        dram = DRAM()
        args = {t.name: x for t, x in zip(self.ctx.op.inputs, packed)}
        for name, (addr, nbytes) in prog.dram.items():
            got = dram.alloc(args.get(name), nbytes=nbytes, align=DRAM_ALIGN)
            assert got == addr, f"DRAM plan and allocation disagree for {name}"
        Simulator(prog.config).run(prog.insns, prog.uops, dram)
        out = self.ctx.op.output
        addr, nbytes = prog.dram[out.name]
        shape = self.out_layout.shape(out.shape)
        y = dram.read(addr, nbytes, np_dtype(out.dtype), shape)
        return _unpack(self.out_layout, y, out.shape)

    def estimate(self) -> Estimate:
        if self._estimate is None:
            cfg = self._program.config
            stats = run_pipeline(self._program.insns, cfg)
            p = self.schedule.primitive
            names = ("dram_bytes_per_cycle", "bus_bytes", "dma_latency", "gemm_ii", "alu_ii",
                     "pipeline_fill", "clock_hz")
            self._estimate = Estimate(stats, self.op.macs, p.macs_per_cycle,
                                      {n: getattr(cfg, n) for n in names})
        return self._estimate

    def benchmark(self, tune_trials: int = 24) -> dict:
        """Simulated cycles of the project's schedule and of the classic VTA tile configuration
        of the same operator (vta.md §6 layers), under the same cycle model. "Ours" is the
        better of the default knobs and a `tsl.tune` search of `tune_trials` programs over the
        same schedule's knobs; the tuned program is verified bit-exact before it counts."""
        from ... import tune
        from . import classic

        est = self.estimate()
        row = {"cycles": est.cycles, "default_cycles": est.cycles, "knobs": "default",
               "baseline": "classic VTA tiles", "baseline_cycles": None, "speedup": None}
        if tune_trials:
            result = tune.tune(self.op, self.machine, trials=tune_trials)
            if result.seconds < est.seconds:
                art = self._with(result.knobs)
                ok, err = art.verify(seed=5)
                if not ok:
                    raise LoweringError(f"{self.op}: tuned program {result.knobs} is wrong "
                                        f"(error {err})")
                est = art.estimate()
                row.update(cycles=est.cycles, knobs=result.knobs)
        row.update(seconds=est.seconds, rate=2 * self.op.macs / est.seconds,
                   pct_peak=est.pct_peak)
        base = classic.knobs(self.op, self.machine)
        if base is not None:
            row["baseline_cycles"] = self._with(base).estimate().cycles
            row["speedup"] = row["baseline_cycles"] / row["cycles"]
        row["notes"] = (f"default knobs {row['default_cycles']:,} cyc"
                        + ("" if row["knobs"] == "default" else f"; tuned {row['knobs']}"))
        return row

    def _with(self, knobs: dict) -> "VTAArtifact":
        """The same operator built with the same schedule function and other knob values."""
        from ...build import record
        from . import backend

        return backend.build(record(self.op, self.machine, knobs=knobs))


def _unpack(lay, y: np.ndarray, shape) -> np.ndarray:
    """The inverse of `Blocked.apply`: a packed array back to `shape`."""
    names = []
    for d in range(len(shape)):
        names += [(d, "o"), (d, "i")] if d in lay.blocks else [(d, "o")]
    return np.ascontiguousarray(y.transpose([lay.order.index(n) for n in names])).reshape(shape)
