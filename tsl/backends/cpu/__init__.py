"""The CPU back end: LLVM for the host CPU (x86 AVX2 / AVX-512, AArch64 NEON), micro-kernels of
the instruction kinds its machine file names (vector FMA, 4-way int8 dot, 16-bit pair madd,
2x2x8 int8 matrix multiply, bf16 pair dot)."""

from __future__ import annotations

from dataclasses import dataclass

from ...backend import Backend, Options
from ...lower import lower
from . import codegen, host, rates, suite
from .hostmachine import detect
from .lowering import CPULowering
from .runtime import CPUArtifact
from .machine import CPUParams


@dataclass(frozen=True)
class CPUOptions(Options):
    """`cross`: compile for a machine file this host cannot run (run it with `emulate()`)."""

    cross: bool = False


class CPUBackend(Backend):
    name = "cpu"
    default_machine = "x86-avx2"  # what `target="cpu"` means is decided by `default()`
    Options = CPUOptions
    Params = CPUParams
    host_detected = True

    def default(self):
        """The built-in machine that best fits this host, with this host's rates
        (`tsl.backends.cpu.detect`; TSL_CPU forces one, TSL_PROBE=0 skips the probe)."""
        return detect()

    def for_host(self, machine):
        if host.missing(machine):
            return machine
        return rates.for_host(host.specialize(machine, host.info()), host.info())

    def unavailable(self, machine, options: CPUOptions | None = None) -> str | None:
        if options is not None and options.cross:
            return None
        lacks = host.missing(machine)
        return codegen.unavailable_message(machine, lacks) if lacks else None

    def _build(self, schedule, options: CPUOptions) -> CPUArtifact:
        ctx = lower(schedule, CPULowering(schedule.machine, schedule.primitive))
        return CPUArtifact(schedule, ctx,
                           codegen.compile_module(ctx.sch.mod, schedule.machine, options.cross),
                           options.cross)

    def relax_layouts(self, machine) -> tuple:
        """NCHW, and NHWC: the conv kernel with channels on the vector lanes stores an NHWC
        tile as it is, where NCHW transposes it at the store (benchmarks/README.md "nhwc42")."""
        return ("NCHW", "NHWC")

    def relax_tir_pipeline(self, machine) -> str:
        """tsl's CPU pipeline (`codegen.PIPELINE`): TVM's default plus the accumulator tiles on
        the stack and the weight prefetch of `lowering._prefetch_weights`; under TVM's default
        a model's kernels lose both (BERT-base's encoder layer ran 16% slower)."""
        codegen.register_pipeline()
        return codegen.PIPELINE

    def build_symbolic(self, schedule, blocks: dict):
        """A kernel of `schedule` whose axes in `blocks` have run-time extents, multiples of
        their blocks (`tsl.dynamic.symbolic`)."""
        from .symbolic import SymbolicCPUKernel

        return SymbolicCPUKernel(schedule, blocks)

    def measure(self, art: CPUArtifact, rounds: int = 5):
        """The time of a run on random inputs (an `Estimate` of kind "measured"): the best of
        `rounds` short timings, since other processes only ever add time (on a loaded
        2-core host one descheduled worker thread stalls a whole parallel call)."""
        from ...model import Estimate

        xs = art.op.random_inputs(0)
        best = min(art.time(*xs, number=3, repeat=1) for _ in range(rounds))
        return Estimate(best, kind="measured",
                        machine=art.machine.name, macs=art.op.macs,
                        peak_macs_per_s=(art.machine.peak(art.op.dtype) or 0) / 2)

    def tvm_target(self, machine):
        """The host's LLVM CPU with the machine file's vector features (what tsl's kernels are
        compiled with). A model compiled for the host runs in this process's TVM thread pool,
        which TVM sizes to half the logical CPUs on x86 (it assumes two threads per core): on a
        host without SMT that is half its cores, so the pool is sized to the machine's cores
        here, as tsl's own artifacts do when they run (`runtime.set_threads`)."""
        from .runtime import set_threads

        set_threads(machine.cores())
        return codegen.target(machine)

    def suite(self, quick: bool) -> list:
        return suite.suite(quick)


backend = CPUBackend()
