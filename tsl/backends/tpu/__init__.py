"""The TPU back end: TPU v4 / v5e TAMs; the schedule as a Mosaic kernel (Pallas TPU: grid,
BlockSpecs, VMEM scratch, dimension semantics) inside the StableHLO a TPU runs, run here in
Pallas interpret mode and exported with jax.export (default, `emitter="mosaic"`); the portable
while-loop StableHLO program that runs on any XLA (`emitter="stablehlo"`); the kernel's detail
for the shared cost model (`model`: registered with `tsl.model`, so the knob choice and the
artifact's estimate price the same kernel)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...backend import Backend, Options
from ...errors import ScheduleError, TSLError, LoweringError
from ...lower import lower
from ...workloads import BERT_BASE, RESNET18
from ...ops import bias, conv2d, dense, matmul, relu
from .lowering import TPULowering
from . import model  # noqa: F401 - registers the kernel's price with tsl.model
from .kernel import MosaicArtifact, check_plan, kernel_plan
from .plan import schedule_plan
from .runtime import TPUArtifact, check_vmem
from .machine import TPUParams

EMITTERS = ("mosaic", "stablehlo")


@dataclass(frozen=True)
class TPUOptions(Options):
    """`emitter="mosaic"`: the Mosaic kernel (MosaicArtifact); `"stablehlo"`: the while-loop
    program of the schedule's tiles (TPUArtifact)."""

    emitter: str = "mosaic"

    def __post_init__(self):
        if self.emitter not in EMITTERS:
            raise ScheduleError(f"emitter={self.emitter!r}: the TPU back end emits {EMITTERS}")


class TPUBackend(Backend):
    name = "tpu"
    default_machine = "tpu-v5e"
    Options = TPUOptions
    Params = TPUParams

    def unavailable(self, machine, options: TPUOptions | None = None) -> str | None:
        return None  # emitting needs no jax; running says what to install

    def check(self, schedule) -> None:
        """Limits beyond the TAM, for the model's knob search: the arrays within HBM, the
        schedule's tiles and the kernel it becomes within the scoped VMEM budget, the kernel's
        grid within what the model walks (`model.MAX_STEPS`)."""
        schedule.op.epilogue.require(("bias", "relu", "shift", "clip"), "the TPU back end")
        check_tensorized(schedule)
        check_hbm(schedule)
        check_vmem(schedule)
        check_plan(schedule_plan(schedule, int(schedule.machine.params.tiling[0])), schedule)

    def _build(self, schedule, options: TPUOptions):
        """The artifact of the emitter `options.emitter` names (`TPUOptions`)."""
        emitter = options.emitter
        schedule.op.epilogue.require(("bias", "relu", "shift", "clip"), "the TPU back end")
        check_tensorized(schedule)
        check_hbm(schedule)
        if emitter == "stablehlo":
            schedule = while_loop_schedule(schedule)
        ctx = lower(schedule, TPULowering(schedule.machine))
        try:
            if emitter == "stablehlo":
                return TPUArtifact(schedule, ctx)
            plan = kernel_plan(schedule, ctx)
        except TSLError:
            raise
        except Exception as e:  # noqa: BLE001 - TVM's errors have no common base worth naming
            raise LoweringError(f"the TPU {emitter} emitter failed on {schedule.op}: "
                                f"{str(e).strip().splitlines()[-1][:300]}") from e
        check_plan(plan, schedule)
        return MosaicArtifact(schedule, ctx, plan)

    def suite(self, quick: bool) -> list:
        bf16 = dict(dtype="bfloat16", acc_dtype="float32")
        if quick:
            return [matmul(512, 512, 512, **bf16), dense(128, 768, 768, **bf16),
                    matmul(256, 256, 512, dtype="int8")]
        return [matmul(1024, 1024, 1024, **bf16), matmul(2048, 2048, 2048, **bf16),
                matmul(4096, 4096, 4096, **bf16),
                # BERT-base GEMMs at sequence length 128: attention projections, FFN in/out, QKV
                *(matmul(*BERT_BASE[k], **bf16)
                  for k in ("attention_out", "ffn_in", "ffn_out", "qkv")),
                dense(128, 768, 3072, epilogue=bias() + relu(), **bf16),
                matmul(1024, 1024, 1024, dtype="int8"),
                conv2d(1, 128, 58, 58, 128, 3, 3, layout="NHWC", **bf16)] + \
            [conv2d(1, c, hw, hw, k, r, r, stride=st, padding=p, layout="NHWC", **bf16)
             for hw, c, k, r, p, st in RESNET18]


def check_tensorized(s) -> None:
    if not any(lp.tensorized for lp in s.loops):
        raise ScheduleError(f"schedule of {s.op} on {s.machine.name} maps no loop nest onto "
                            f"the MXU; call s.tensorize(<the primitive's loop>) in the schedule "
                            f"function")


def while_loop_schedule(s):
    """`s` if the while-loop emitter can express it (tiles within VMEM, see
    `check_while_loop_nest`); where the model chose its knobs, else the model's best candidate
    it can (knobs the Mosaic kernel's price does not depend on, such as the conv's loop
    order, may differ); else the ScheduleError saying why."""
    def ok(x):
        check_vmem(x)
        check_while_loop_nest(x)
    try:
        ok(s)
        return s
    except ScheduleError:
        choice = getattr(s, "choice", None)
        for c in choice.candidates if choice is not None else ():
            try:
                ok(c.schedule)
                return c.schedule
            except ScheduleError:
                continue
        raise


def check_while_loop_nest(s) -> None:
    """The while-loop emitter zeroes the accumulator tile at the first reduction loop, so every
    loop between the accumulator's staging and the reduction must have one iteration."""
    c_at = next((st.at for st in s.stages if st.operand == "C"), None)
    if c_at is None:
        return
    between = []
    for lp in s.loops[s.loops.index(c_at) + 1:]:
        if any(s.role_of(a) == "k" for a in lp.axes):
            break
        if lp.extent > 1:
            between.append(lp.name)
    if between:
        raise ScheduleError(f"emitter='stablehlo' cannot split the accumulator tile of {s.op} "
                            f"over loops {between} between its staging ({c_at.name}) and the "
                            f"reduction; build with the default emitter (the Mosaic kernel), or "
                            f"give those loops one iteration (e.g. h_inner=1)")


def check_hbm(schedule) -> None:
    """The operator's arrays (inputs, output and their padded copies) within the chip's HBM."""
    from ...tam.machine import dtype_bytes

    op, big = schedule.op, schedule.op.padded(schedule.padded_extents())
    hbm = schedule.machine.levels("global", "A")[0]

    def nbytes(ts):
        return sum(math.ceil(math.prod(t.shape) * dtype_bytes(t.dtype)) for t in ts)
    need = nbytes(op.inputs) + nbytes([op.output])
    if big is not op:
        need += nbytes(big.inputs) + nbytes([big.output])
    if need > hbm.capacity:
        raise ScheduleError(f"{op} needs {need:,} bytes of HBM for its arrays (inputs, output"
                            f"{' and their padded copies' if big is not op else ''}) but "
                            f"{schedule.machine.name}'s {hbm.name} holds {hbm.capacity:,} bytes "
                            f"(machine file): split the operator or use a chip with more HBM")


backend = TPUBackend()
