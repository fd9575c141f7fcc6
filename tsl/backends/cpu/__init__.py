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

    def bench_suite(self, quick: bool) -> list:
        return suite.suite(quick)


backend = CPUBackend()
