"""The Tensor Core back end: WMMA m16n16k16 (fp16/bf16 -> fp32, int8 -> int32) through TVM's CUDA
code generator, shared-memory staging with cp.async pipelining, PTX/cubin through nvcc. Where
the machine file sets `mma_sync` (sm_80) the fp16/bf16 GEMMs use ldmatrix + mma.sync m16n8k16
from swizzled shared memory, the int8 GEMMs mma.sync m16n8k32 (lowering.py); on sm_90 the
fp16/bf16 GEMMs of the default schedule are a TMA + wgmma kernel for sm_90a (hopper.py).

Building needs no GPU (nor nvcc: the CUDA source is TVM's); `.ptx()`, `.resources()` and
`.export()` need nvcc; `.run()` needs an NVIDIA GPU and CuPy.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...backend import Backend, Options
from ...errors import ScheduleError
from ...lower import lower
from ...workloads import BERT_BASE
from ...ops import bias, conv2d, dense, matmul, relu
from . import codegen, hopper, model
from .lowering import TensorCoreLowering
from .runtime import TensorCoreArtifact
from .machine import TensorCoreParams


@dataclass(frozen=True)
class TensorCoreOptions(Options):
    """`wgmma`: on sm_90, build fp16/bf16 GEMMs as the TMA + wgmma kernel (hopper.py) in place
    of the default schedule (a schedule function or knobs given to tsl.build are built as
    written: `schedule.as_written`)."""

    wgmma: bool = True


class TensorCoreBackend(Backend):
    name = "cuda_tensorcore"
    default_machine = "tensorcore-sm90"
    Options = TensorCoreOptions
    Params = TensorCoreParams

    def unavailable(self, machine, options: TensorCoreOptions | None = None) -> str | None:
        return None  # CUDA source is generated without a GPU; nvcc is checked where needed

    def relax_options(self, machine) -> dict:
        """The warp-level kernel inside a Relax model: the sm_90a wgmma one is a TIRx function
        whose host part encodes TMA descriptors, which Relax's lowering does not take."""
        return {"wgmma": False}

    def _build(self, schedule, options: TensorCoreOptions) -> TensorCoreArtifact:
        """The TMA + wgmma kernel where `options.wgmma` and it applies, else the WMMA /
        mma.sync lowering of the schedule (`TensorCoreOptions`)."""
        if options.wgmma and not schedule.as_written and hopper.applies(schedule):
            return hopper.build(schedule)
        ctx = lower(schedule, TensorCoreLowering(schedule.machine, schedule.primitive))
        return TensorCoreArtifact(schedule, ctx, codegen.generate(ctx.sch.mod, schedule.machine))

    def check(self, schedule) -> None:
        """Refuse (ScheduleError) what the lowering cannot build: serial loops outside the
        grid, a split reduction outside the mma.sync path, a block with more threads than a
        block may have, a WMMA epilogue tile over the static shared memory limit, or a block
        the model's registers per thread would not let onto an SM at all."""
        m = schedule.machine
        loops = schedule.loops
        first = next((i for i, lp in enumerate(loops) if lp.parallel), len(loops))
        serial = [lp.name for lp in loops[:first] if lp.extent > 1]
        if serial:  # the lowering refuses it too (_bind_parallel), after minutes of work
            raise ScheduleError(f"{schedule.op} on {m.name}: loops {serial} run serially "
                                f"outside the thread blocks; one kernel needs them in the grid: "
                                f"make them parallel over the core level too (for the default "
                                f"conv2d schedule: knob parallel_axes='n_oh_co')")
        t = model.tile_of(schedule, model.planned_instruction(m, schedule.op))
        if schedule.split_parts > 1 and t.instruction != "mma_sync":
            raise ScheduleError(f"{schedule.op} on {m.name}: a split reduction is built for "
                                f"the ldmatrix + mma.sync kernels only (this one issues "
                                f"{t.instruction}); do not split the reduction")
        threads = 32 * t.warps
        if threads > int(m.params.max_threads_per_block):
            raise ScheduleError(f"{schedule.op} on {m.name}: {t.warps} warps per block "
                                f"({threads} threads) exceed the {m.params.max_threads_per_block}"
                                f" a block may have; use smaller m_outer / n_outer")
        static = model.epilogue_shared_bytes(t)
        if static > model.STATIC_SHARED_MAX:
            raise ScheduleError(f"{schedule.op} on {m.name}: the WMMA epilogue's shared tile "
                                f"({static} B over {t.warps} warps) exceeds the "
                                f"{model.STATIC_SHARED_MAX} B of static shared memory a kernel "
                                f"may have; use fewer warps (m_outer / n_outer)")
        regs = model.registers(t)
        if regs * threads > int(m.params.registers_per_sm):
            raise ScheduleError(f"{schedule.op} on {m.name}: {threads} threads x {regs} "
                                f"registers (modelled) exceed the SM's "
                                f"{m.params.registers_per_sm}; use fewer warps or smaller "
                                f"accumulator tiles")

    def tvm_target(self, machine):
        """cuda with the machine's arch, an llvm host."""
        import tvm

        return tvm.target.Target({"kind": "cuda", "arch": machine.params.arch},
                                 host={"kind": "llvm"})

    def suite(self, quick: bool) -> list:
        """fp16 GEMMs (large, and BERT-base's at sequence 128), bf16 and int8 GEMMs, a ResNet
        3x3 conv2d in NHWC."""
        bert = [dense(m, k, n, dtype="float16", epilogue=bias() + relu() if n == 3072 else None)
                for m, n, k in (BERT_BASE[name] for name in
                                ("attention_out", "ffn_in", "ffn_out", "qkv"))]
        if quick:
            return [matmul(4096, 4096, 4096, dtype="float16"), bert[1],
                    conv2d(8, 64, 56, 56, 64, 3, 3, padding=1, layout="NHWC", dtype="float16")]
        return ([matmul(n, n, n, dtype="float16") for n in (4096, 8192)] + bert
                + [matmul(4096, 4096, 4096, dtype="bfloat16"),
                   matmul(4096, 4096, 4096, dtype="int8"),
                   conv2d(8, 64, 56, 56, 64, 3, 3, padding=1, layout="NHWC", dtype="float16")])


backend = TensorCoreBackend()
