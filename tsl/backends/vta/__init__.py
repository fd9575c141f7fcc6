"""The VTA back end: VTA's ISA, a bit-exact simulator with a cycle model, and a codegen from the
shared schedule's TIR to VTA programs. See docs/vta.md for the machine."""

from __future__ import annotations

from dataclasses import dataclass

from ...backend import Backend, Options
from ...errors import LoweringError
from ...lower import lower
from ...tam.capabilities import Capabilities
from . import codegen
from .lowering import VTALowering
from .runtime import VTAArtifact
from .machine import VTAParams


@dataclass(frozen=True)
class VTAOptions(Options):
    """`cthreads`: lay out virtual threads as TVM's cthread injection does (a copy of every
    tile per thread, each leaf for every thread in turn), and load each micro-op kernel on its
    own as TVM's runtime does, for the classic baseline (`classic.build`)."""

    cthreads: bool = False


class VTABackend(Backend):
    name = "vta"
    default_machine = "vta-1x16x16"
    bench_trials = 24
    simulated = True
    Options = VTAOptions
    Params = VTAParams
    # What the codegen's programs do with the DMA (codegen.generate's row_pitch, keep_tiles,
    # share_tiles), and the simulator's DMA taking a 2-D LOAD or STORE a burst per row.
    capabilities = Capabilities(serial_rows=True, row_pitch=True, keeps_tiles=True,
                                shares_tiles=True)

    def _build(self, schedule, options: VTAOptions) -> VTAArtifact:
        """The VTA program of `schedule` (`VTAOptions` says what `cthreads` changes)."""
        cthreads = options.cthreads
        op, machine = schedule.op, schedule.machine
        if op.dtype != "int8":
            raise LoweringError(f"{op}: VTA computes int8 x int8 -> int32 only; build the "
                                f"operator with dtype='int8'")
        op.epilogue.require(("bias", "residual", "relu", "shift", "clip"), "the VTA ALU")
        cfg = codegen.machine_config(machine)
        lowering = VTALowering(machine, schedule.primitive)
        ctx = lower(schedule, lowering)
        cap = self.capabilities
        program = codegen.generate(ctx.sch.mod["main"], ctx.op, cfg, row_pitch=cap.row_pitch,
                                   keep_tiles=cap.keeps_tiles,
                                   share_tiles=cap.shares_tiles and not cthreads,
                                   thread_major=not cthreads, batch_uops=not cthreads,
                                   split_tail=not cthreads)
        return VTAArtifact(schedule, ctx, program, {"out": lowering.blocked(ctx.op, "out")})

    def tvm_target(self, machine):
        """The host CPU's target (as the CPU back end gives it): a Relax model for VTA is
        compiled for the host, and its VTA layers run as calls of their programs
        (`tsl.relax.run_vta`)."""
        from ...backend import resolve_target

        be, host = resolve_target("cpu")
        return be.tvm_target(host)

    def relax_offload(self, machine) -> bool:
        """A Relax model's int8 layers run as calls of their VTA programs in the simulator."""
        return True

    def baseline(self, op, machine):
        """The classic TVM tiles of `op` (`classic.build`) where the table has the layer."""
        from . import classic

        return classic.build(op, machine) if classic.knobs(op, machine) is not None else None

    def measure(self, art: VTAArtifact):
        """Simulated cycles (an `Estimate` of kind "simulated"): what `tsl.tune` minimizes."""
        return art.estimate()

    def suite(self, quick: bool) -> list:
        """ResNet-18's C2-C11 (docs/vta.md §6) with VTA's requantization, and int8 GEMMs;
        quick: C11 and one small GEMM."""
        from . import classic

        layers = [classic.layer(name) for name in classic.TILES]
        gemms = [classic.gemm(*shape) for shape in ((1, 512, 1000), (64, 256, 256),
                                                    (256, 512, 512))]
        return [layers[-1], gemms[0]] if quick else layers + gemms


backend = VTABackend()
