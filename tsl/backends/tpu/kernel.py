"""The default TPU artifact: the schedule as a Mosaic kernel (Pallas TPU) inside a StableHLO
program a TPU runs, its numerics here in Pallas interpret mode, its export, and its estimate."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...artifact import Artifact
from ...primitives.schedule import Schedule
from . import codegen, model, mosaic
from .plan import Plan, conv_plan, gemm_plan
from ...model import Estimate
from .runtime import to_hlo


def kernel_plan(schedule: Schedule, ctx) -> Plan:
    """The Mosaic kernel of a lowered schedule: GEMMs from the scheduled TIR, conv2d by the
    TPU's conv mapping of the schedule's tiles."""
    if schedule.op.name == "conv2d":
        return conv_plan(schedule, int(schedule.machine.params.tiling[0]))
    return gemm_plan(codegen.compact(ctx.sch.mod), ctx.op, schedule.op)


class MosaicArtifact(Artifact):
    """A Mosaic kernel for a TPU TAM. `hlo()` is the StableHLO module with the kernel as a
    `tpu_custom_call` (what a TPU host runs), `kernel()` the Mosaic kernel itself, `run` the
    same kernel body in Pallas interpret mode on this machine's CPU, `export` both."""

    target = "tpu"
    emitter = "mosaic"

    def __init__(self, schedule: Schedule, ctx, plan: Plan):
        super().__init__(schedule, ctx)
        self.plan = plan
        self.vmem_limit = int(schedule.machine.params.vmem_scoped_bytes)
        self._exported: dict = {}
        self._run = None

    def _fn(self, interpret: bool):
        return mosaic.program(self.plan, self.op, self.ctx.op, self.vmem_limit, interpret)

    def exported(self, platform: str = "tpu"):
        """`jax.export.Exported` for "tpu" (the Mosaic kernel) or "cpu" (its interpret twin)."""
        if platform not in self._exported:
            if platform not in ("tpu", "cpu"):
                raise ValueError(f"platform must be 'tpu' or 'cpu', got {platform!r}")
            self._exported[platform] = mosaic.exported(self._fn(platform == "cpu"), self.op,
                                                       platform)
        return self._exported[platform]

    def hlo(self, dialect: str = "stablehlo") -> str:
        """The TPU program: StableHLO text with the tpu_custom_call, or classic HLO text."""
        text = self.exported("tpu").mlir_module()
        if dialect == "stablehlo":
            return text
        if dialect == "hlo":
            return to_hlo(text)
        raise ValueError(f"dialect must be 'stablehlo' or 'hlo', got {dialect!r}")

    def source(self) -> str:
        return self.hlo()

    def kernel(self) -> str:
        """The Mosaic kernel (decoded from the tpu_custom_call): `iteration_bounds` is the grid,
        `window_bounds` the block of each operand, memrefs in `#tpu.memory_space<vmem>` the
        VMEM blocks and scratch, `dimension_semantics` per grid axis."""
        return mosaic.mosaic_text(self.hlo())

    def prepare(self, arrays) -> list[np.ndarray]:
        """The checked arrays as they are: the program pads (and crops) inside itself, since a
        TPU host runs the exported program on the user's arrays."""
        return self.check_inputs(arrays)

    def _execute(self, packed: list[np.ndarray]) -> np.ndarray:
        """The kernel in Pallas interpret mode on XLA:CPU (numerics only)."""
        if self._run is None:
            import jax

            self._run = jax.jit(self._fn(True))
        return np.asarray(self._run(*packed))

    def export(self, path) -> dict:
        """Write the serialized `jax.export.Exported` for platform "tpu" to `path` and its
        interpret-mode twin for "cpu" next to it (`<stem>.cpu<suffix>`). Returns both paths.
        On a TPU host: `jax.export.deserialize(open(path, "rb").read()).call(*arrays)`."""
        path = Path(path)
        cpu = path.with_name(f"{path.stem}.cpu{path.suffix}")
        path.write_bytes(mosaic.serialize(self.exported("tpu")))
        cpu.write_bytes(mosaic.serialize(self.exported("cpu")))
        return {"tpu": path, "cpu": cpu}

    def estimate(self) -> Estimate:
        """The shared cost model's price of this kernel (`tsl.model.evaluate` with the TPU's
        detail, `model.program`): the same number the knob choice used."""
        return model.price(self.schedule, self.plan)

    def benchmark(self) -> dict:
        est = self.estimate()
        _, pub = model.public_pallas(self.schedule)
        _, xla = model.xla_model(self.schedule)
        return {"seconds": est.seconds, "estimated": True,
                "rate": 2 * self.op.macs / est.seconds,
                "pct_peak": est.pct_peak, "utilization": est.mxu_utilization,
                "notes": f"model; MXU util {100 * est.mxu_utilization:.0f}%, {est.steps} steps, "
                         f"bound by {est.bound}; vs public Pallas 512/1024 blocks (same model) "
                         f"{pub.seconds / est.seconds:.2f}x",
                "baseline": "XLA (same model)", "baseline_seconds": xla.seconds,
                "speedup": xla.seconds / est.seconds,
                "baseline2": "public Pallas blocks (same model)",
                "baseline2_seconds": pub.seconds, "speedup2": pub.seconds / est.seconds}


def check_plan(plan: Plan, s: Schedule) -> None:
    """The kernel's VMEM (blocks double-buffered, scratch) within the scoped budget, and its
    grid within the steps the model walks."""
    from ...errors import ScheduleError

    model.check_steps(plan, s.op)
    budget = int(s.machine.params.vmem_scoped_bytes)
    used, parts = plan.vmem_bytes()
    if used > budget:
        raise ScheduleError(f"the Mosaic kernel of {s.op} needs {used:,} bytes of VMEM "
                            f"({'; '.join(parts)}) but {s.machine.name} gives a kernel "
                            f"{budget:,} (vmem_scoped_bytes): {used - budget:,} bytes over; use "
                            f"smaller tiles or fewer stages")
