"""The CPU back end: LLVM for the host, fp32/bf16 FMA micro-kernels and int8 VNNI."""

from __future__ import annotations

from ...backend import Backend
from ...lower import lower
from . import codegen, suite
from .lowering import CPULowering
from .runtime import CPUArtifact


class CPUBackend(Backend):
    name = "cpu"
    default_machine = "x86-avx512"

    def unavailable(self, machine) -> str | None:
        missing = codegen.missing_features(machine.params.get("require", []))
        return f"host lacks {missing}" if missing else None

    def build(self, schedule, **options) -> CPUArtifact:
        ctx = lower(schedule, CPULowering(schedule.machine, schedule.primitive))
        return CPUArtifact(schedule, ctx, codegen.compile_module(ctx.sch.mod, schedule.machine))

    def measure(self, art: CPUArtifact):
        """The median time of a run on random inputs (an `Estimate` of kind "measured")."""
        from ...model import Estimate

        return Estimate(art.time(*art.op.random_inputs(0)), kind="measured",
                        machine=art.machine.name, macs=art.op.macs,
                        peak_macs_per_s=(art.machine.peak(art.op.dtype) or 0) / 2)

    def suite(self, quick: bool) -> list:
        return suite.suite(quick)


backend = CPUBackend()
