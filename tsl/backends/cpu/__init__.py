"""The CPU back end: LLVM for the host CPU (x86 AVX2 / AVX-512, AArch64 NEON), micro-kernels of
the instruction kinds its machine file names (vector FMA, 4-way int8 dot, 16-bit pair madd)."""

from __future__ import annotations

from ...backend import Backend
from ...lower import lower
from ...tam import host
from . import codegen, suite
from .lowering import CPULowering
from .runtime import CPUArtifact


class CPUBackend(Backend):
    name = "cpu"
    default_machine = "x86-avx2"  # what `target="cpu"` means is decided by `default()`

    def default(self):
        """The built-in machine that best fits this host (`tsl.tam.detect`; TSL_CPU forces
        one)."""
        return host.detect()

    def for_host(self, machine):
        return machine if host.missing(machine) else host.specialize(machine, host.info())

    def unavailable(self, machine, cross: bool = False, **options) -> str | None:
        if cross:
            return None
        lacks = host.missing(machine)
        return codegen.unavailable_message(machine, lacks) if lacks else None

    def build(self, schedule, cross: bool = False, **options) -> CPUArtifact:
        ctx = lower(schedule, CPULowering(schedule.machine, schedule.primitive))
        return CPUArtifact(schedule, ctx,
                           codegen.compile_module(ctx.sch.mod, schedule.machine, cross), cross)

    def bench_suite(self, quick: bool) -> list:
        return suite.suite(quick)


backend = CPUBackend()
