"""Running a VTA program in the simulator, and its cost report."""

from __future__ import annotations

import numpy as np

from ...artifact import Artifact
from ...model import Estimate
from ...ops.operator import np_dtype
from .codegen import DRAM_ALIGN, Program
from .simulator import DRAM, Simulator
from .timing import MODULES, Stats, run_pipeline


def simulated_estimate(stats: Stats, schedule, assumptions: dict) -> Estimate:
    """The cycle model's count as the shared `Estimate` (kind "simulated"); the simulator's
    counters (`stats`: uops, DRAM bytes per buffer, busy cycles per module) and the cycle
    model's assumptions are its detail."""
    st = stats
    m = schedule.machine
    moved = {k: r + st.bytes_written[k] for k, r in st.bytes_read.items()
             if r or st.bytes_written[k]}
    busy = {mod: st.busy[mod] / st.clock_hz for mod in MODULES}
    return Estimate(seconds=st.seconds, kind="simulated", machine=m.name, clock_hz=st.clock_hz,
                    bound=max(busy, key=busy.get), macs=schedule.op.macs,
                    padded_macs=st.macs, peak_macs_per_s=(m.peak(schedule.op.dtype) or 0) / 2,
                    compute_seconds=busy["compute"], traffic=moved, level_seconds=busy,
                    pipelined=True,
                    notes=[f"uops: GEMM {st.gemm_uops:,}, reset {st.reset_uops:,}, "
                           f"ALU {st.alu_uops:,}",
                           "busy: " + ", ".join(f"{mod} {st.busy[mod]:,} cycles "
                                                f"({100 * st.busy[mod] / max(st.cycles, 1):.0f}%)"
                                                for mod in MODULES),
                           "instructions: " + ", ".join(f"{k} {v}"
                                                        for k, v in st.insn_counts.items()),
                           "model: " + ", ".join(f"{k}={v}" for k, v in assumptions.items())],
                    detail={"stats": st, "assumptions": assumptions})


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
        return _unpack(self.out_layout, self.simulate(packed), self.ctx.op.output.shape)

    def unpack_output(self, y: np.ndarray) -> np.ndarray:
        """`simulate`'s blocked output as `run` returns it (the operator's layout and shape)."""
        return self.op.crop_output(_unpack(self.out_layout, y, self.ctx.op.output.shape))

    def simulate(self, packed) -> np.ndarray:
        """One run on inputs as `prepare` gives them (padded, in VTA's blocked layouts); the
        output as the program stores it (the padded output in `out_layout`), so that a next
        layer can read it as it is (`tsl.relax.vta_run`: no NCHW round trip between layers)."""
        prog = self._program
        dram = DRAM()
        args = {t.name: x for t, x in zip(self.ctx.op.inputs, packed)}
        for name, (addr, nbytes) in prog.dram.items():
            got = dram.alloc(args.get(name), nbytes=nbytes, align=DRAM_ALIGN)
            assert got == addr, f"DRAM plan and allocation disagree for {name}"
        Simulator(prog.config).run(prog.insns, prog.uops, dram)
        out = self.ctx.op.output
        addr, nbytes = prog.dram[out.name]
        return dram.read(addr, nbytes, np_dtype(out.dtype), self.out_layout.shape(out.shape))

    def estimate(self) -> Estimate:
        """Cycles of the program under the cycle model of `timing.py` (no data needed: the
        timing of a VTA program does not depend on the values)."""
        if self._estimate is None:
            cfg = self._program.config
            names = ("dram_bytes_per_cycle", "bus_bytes", "dma_latency", "gemm_ii", "alu_ii",
                     "pipeline_fill", "clock_hz")
            self._estimate = simulated_estimate(run_pipeline(self._program.insns, cfg),
                                                self.schedule,
                                                {n: getattr(cfg, n) for n in names})
        return self._estimate

    def benchmark(self) -> dict:
        """Simulated cycles of this program and of the classic VTA tile configuration of the
        same operator (vta.md §6 layers), under the same cycle model."""
        from . import classic

        est = self.estimate()
        row = {"cycles": est.cycles, "seconds": est.seconds, "rate": 2 * self.op.macs / est.seconds,
               "pct_peak": est.pct_peak, "baseline": "classic VTA tiles", "baseline_cycles": None,
               "speedup": None}
        base = classic.knobs(self.op, self.machine)
        if base is not None:
            row["baseline_cycles"] = classic.build(self.op, self.machine,
                                                   base).estimate().cycles
            row["speedup"] = row["baseline_cycles"] / row["cycles"]
        return row


def _unpack(lay, y: np.ndarray, shape) -> np.ndarray:
    """The inverse of `Blocked.apply`: a packed array back to `shape`."""
    names = []
    for d in range(len(shape)):
        names += [(d, "o"), (d, "i")] if d in lay.blocks else [(d, "o")]
    return np.ascontiguousarray(y.transpose([lay.order.index(n) for n in names])).reshape(shape)
