"""Running a TPU artifact on XLA's CPU client (jaxlib), and its performance estimate from the TAM.

No TPU is needed: XLA:CPU executes the emitted program for numerics (its timing says nothing
about a TPU, so nothing here measures time); the estimate is a roofline of the schedule on the
machine file. jax/jaxlib is optional: without it an artifact still has its StableHLO text.
"""

from __future__ import annotations

import math
import re

import numpy as np

from ...artifact import Artifact
from ...errors import BackendUnavailable, LoweringError, ScheduleError
from ...model import Estimate, Transfer, TransferKind, evaluate
from ...ops.operator import Operator
from ...primitives.schedule import Schedule
from ...tam.machine import dtype_bytes
from . import codegen

INSTALL_HINT = 'pip install -e ".[tpu]" (or pip install "jax[cpu]")'


def _jax():
    try:
        import jax
        import jax.extend  # noqa: F401 - registers jax.extend.backend
        from jaxlib import xla_client
    except ImportError as e:
        raise BackendUnavailable(f"running or converting XLA programs needs jax and jaxlib, "
                                 f"which cannot be imported here ({e}); install them with "
                                 f"{INSTALL_HINT}") from None
    return jax, xla_client


def to_hlo(stablehlo: str) -> str:
    """Classic HLO text of a StableHLO module, by XLA's own converter."""
    _, xc = _jax()
    return xc._xla.mlir.mlir_module_to_xla_computation(stablehlo).as_hlo_text()


class Program:
    """A StableHLO module compiled for XLA:CPU. XLA does not check layouts when it runs: a
    buffer in another layout than the parameter's is silently reinterpreted. So the layouts
    the entry declares are read back from the compiled executable, inputs are placed in them,
    and any disagreement between the three is an error."""

    def __init__(self, text: str):
        jax, xc = _jax()
        self._jax = jax
        be = jax.extend.backend.get_backend("cpu")
        self.device = be.local_devices()[0]
        try:
            self.exe = be.compile_and_load(text, xc.DeviceList((self.device,)),
                                           xc.CompileOptions())
        except Exception as e:  # noqa: BLE001 - XLA raises its own runtime errors
            raise LoweringError(f"XLA rejected the emitted program: {e}") from e
        self.layouts = [_minor_to_major(lay) for lay in self.exe.get_parameter_layouts()]
        declared = declared_layouts(text)
        if declared != self.layouts:
            raise LoweringError(f"the program declares parameter layouts {declared} but XLA "
                                f"compiled it for {self.layouts}")

    def __call__(self, arrays) -> np.ndarray:
        from jax.experimental.layout import Format, Layout
        from jax.sharding import SingleDeviceSharding

        bufs = []
        for i, (x, m2m) in enumerate(zip(arrays, self.layouts)):
            major = tuple(reversed(m2m))
            b = self._jax.device_put(x, Format(Layout(major_to_minor=major),
                                               SingleDeviceSharding(self.device)))
            if tuple(b.format.layout.major_to_minor) != major:
                raise LoweringError(f"input {i} was placed in layout {b.format.layout}, not the "
                                    f"{m2m} (minor to major) the program declares")
            bufs.append(b)
        outs = self.exe.execute_sharded(bufs).disassemble_into_single_device_arrays()
        return np.asarray(outs[0][0])

    def cost(self) -> dict:
        """XLA's cost analysis; note that it counts the body of a while loop once."""
        return dict(self.exe.cost_analysis())


def _minor_to_major(layout) -> tuple[int, ...]:
    return tuple(int(d) for d in re.findall(r"\d+", str(layout).split(":")[0]))


def declared_layouts(text: str) -> list[tuple[int, ...]]:
    """The minor-to-major layouts `main`'s parameters declare (mhlo.layout_mode)."""
    head = next(ln for ln in text.splitlines() if "@main(" in ln)
    params = head.split("@main(", 1)[1].split(") ->", 1)[0]
    return [tuple(int(d) for d in re.findall(r"\d+", m))
            for m in re.findall(r'layout_mode = "\{([\d,]*)\}"', params)]


# -- the estimate ---------------------------------------------------------------------------------
def _bytes(op: Operator, role: str) -> int:
    t = op.output if role == "out" else op.input(role)
    return math.ceil(math.prod(t.shape) * dtype_bytes(t.dtype))


def vmem_footprint(s: Schedule) -> tuple[int, list[str]]:
    """Bytes of VMEM the schedule needs: every staged tile times its pipeline depth, plus the
    double-buffered output block the accumulator tile is written through."""
    used, parts = 0, []
    for st in s.stages:
        if st.level.role == "global":
            continue
        used += st.bytes * st.at.stages
        parts.append(f"{st.operand} tile {st.bytes:,} B x{st.at.stages} in {st.level.name}")
        if st.operand == "C":
            out = math.ceil(st.elements * dtype_bytes(s.op.out_dtype)) * 2
            used += out
            parts.append(f"output block {out // 2:,} B x2")
    return used, parts


def check_vmem(s: Schedule) -> None:
    budget = int(s.machine.params.vmem_scoped_bytes)
    used, parts = vmem_footprint(s)
    if budget and used > budget:
        raise ScheduleError(f"schedule of {s.op} needs {used:,} bytes of VMEM ({'; '.join(parts)}) "
                            f"but {s.machine.name} gives a kernel {budget:,}: "
                            f"{used - budget:,} bytes over; use smaller tiles or fewer stages")


def estimate(s: Schedule, big: Operator, structure: codegen.Structure) -> Estimate:
    """The cost model's estimate of the while-loop program (`tsl.model.evaluate` of the
    schedule's staged tiles, not the Mosaic kernel the back end registers): their HBM traffic
    with the schedule's reuse, plus what the program moves besides them (the padding passes,
    the bias), with the MXU passes, dot trips and VMEM use as detail."""
    p, hbm = s.primitive, s.machine.memory[0]

    def once(what: str, nbytes: int) -> Transfer:
        return Transfer(kind=TransferKind.PASS, what=what, level=hbm.name, parent=hbm.name,
                        fills=1, bytes=nbytes, bandwidth=hbm.bandwidth,
                        shared_bandwidth=hbm.bandwidth)

    extra = [once("padding pass", src + dst) for src, dst in structure.pads]
    if big.epilogue.has_bias:
        extra.append(once("bias", _bytes(big, "bias")))
    vmem, parts = vmem_footprint(s)
    return evaluate(s, extra=extra, notes=parts, tiles=True, detail={
        "mxu_passes": big.macs // (p.m * p.n * p.k), "dot_trips": structure.dot_trips,
        "flops": 2 * big.macs, "vmem_bytes": vmem,
        "vmem_budget": int(s.machine.params.vmem_scoped_bytes)})


class TPUArtifact(Artifact):
    """The portable while-loop program of the schedule (emitter="stablehlo"): StableHLO/HLO
    text, execution on XLA:CPU, a roofline estimate."""

    target = "tpu"
    emitter = "stablehlo"

    def __init__(self, schedule: Schedule, ctx):
        super().__init__(schedule, ctx)
        func = codegen.compact(ctx.sch.mod)
        self.text, self.structure = codegen.program(func, self.op.inputs, self.op.output)
        self._kernel_text, _ = codegen.program(func, self.op.inputs, self.op.output,
                                               entry="padded")
        self._program: Program | None = None

    def hlo(self, dialect: str = "stablehlo") -> str:
        """The program as StableHLO text (needs nothing) or classic HLO text (needs jaxlib)."""
        if dialect == "stablehlo":
            return self.text
        if dialect == "hlo":
            return to_hlo(self.text)
        raise ValueError(f"dialect must be 'stablehlo' or 'hlo', got {dialect!r}")

    def source(self) -> str:
        return self.hlo()

    def program(self) -> Program:
        """The kernel compiled for XLA:CPU; its `main` takes the padded operator's inputs."""
        if self._program is None:
            self._program = Program(self._kernel_text)
        return self._program

    def _execute(self, packed: list[np.ndarray]) -> np.ndarray:
        return self.program()(packed)

    def estimate(self) -> Estimate:
        return estimate(self.schedule, self.ctx.op, self.structure)

    def benchmark(self) -> dict:
        from .model import xla_model

        est = self.estimate()
        _, base = xla_model(self.schedule)
        return {"seconds": est.seconds, "estimated": True,
                "rate": 2 * self.op.macs / est.seconds,
                "pct_peak": est.pct_peak, "utilization": est.utilization,
                "notes": f"model; MXU utilization {100 * est.utilization:.0f}%",
                "baseline": "XLA (same model)", "baseline_seconds": base.seconds,
                "speedup": base.seconds / est.seconds}
