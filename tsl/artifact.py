"""What `tsl.build` returns: an object that runs, shows its code and estimates its cost.

Every back end's artifact derives from `Artifact`, which owns what is the same everywhere:
checking the user's arrays against the operator, padding them to the scheduled shapes, packing
them into the layouts `pack` chose, and cropping the result.
"""

from __future__ import annotations

import numpy as np

from .errors import InputError
from .lower import LowerContext
from .ops.operator import Operator, np_dtype
from .primitives.schedule import Schedule
from .tam.machine import Machine


class Artifact:
    target: str = ""

    def __init__(self, schedule: Schedule, ctx: LowerContext):
        self.schedule = schedule
        self.ctx = ctx

    @property
    def op(self) -> Operator:
        return self.schedule.op

    @property
    def machine(self) -> Machine:
        return self.schedule.machine

    # -- what every back end implements ------------------------------------------------------
    def run(self, *arrays: np.ndarray) -> np.ndarray:
        """NumPy in (the operator's input order and layouts), NumPy out."""
        return self.op.crop_output(self._execute(self.prepare(arrays)))

    def _execute(self, packed: list[np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def source(self) -> str:
        raise NotImplementedError

    def estimate(self):
        raise NotImplementedError

    def benchmark(self) -> dict:
        """One row of `python -m tsl.bench`: `seconds`, `rate` (operations per second),
        `pct_peak`, `notes`, `estimated` (True where the seconds are the model's, not a timing)
        and, where a baseline was timed or priced, `baseline`, `baseline_seconds`, `speedup`."""
        raise NotImplementedError(f"{type(self).__name__} has no benchmark row")

    def export(self, path):
        """Write what a host of the target loads (Tensor Cores: the CUDA kernel and its launch
        description; TPU: the serialized `jax.export`) at `path`; returns what it wrote."""
        raise NotImplementedError(f"the {self.target or type(self).__name__} artifact has no "
                                  f"export: use .source() for its code")

    # -- shared ------------------------------------------------------------------------------
    @property
    def mod(self):
        """The scheduled TIR as a TVM IRModule (before the back end's code generation):
        `tvm.compile(art.mod, target=...)` builds it. Its `main` takes the operands as
        `prepare` gives them: padded to the schedule's tiles, weights in the packed layout
        (`ctx.layouts`), plus the compensation argument on an unsigned-A machine."""
        return self.ctx.sch.mod

    def tir(self) -> str:
        """The scheduled TIR (before the back end's code generation), as text."""
        return self.mod.script()

    def check_inputs(self, arrays) -> list[np.ndarray]:
        ins = self.op.inputs
        if len(arrays) != len(ins):
            raise InputError(f"{self.op} takes {len(ins)} arrays "
                             f"({', '.join(t.name for t in ins)}), got {len(arrays)}")
        out = []
        for t, x in zip(ins, arrays):
            x = np.asarray(x)
            if x.shape != t.shape:
                raise InputError(f"{self.op}: input {t.name} must have shape {t.shape}, got "
                                 f"{x.shape}")
            if x.dtype != np_dtype(t.dtype):
                raise InputError(f"{self.op}: input {t.name} must be {t.dtype}, got {x.dtype}; "
                                 f"convert it with .astype(...) first")
            out.append(x)
        return out

    def prepare(self, arrays) -> list[np.ndarray]:
        """Checked, padded and packed inputs, ready for the kernel."""
        xs = self.op.pad_inputs(self.ctx.op, self.check_inputs(arrays))
        if self.ctx.unsigned_a:
            xs.append(self.ctx.op.compensation(xs[self.ctx.input_index("B")]))
        if self.ctx.b_dtype:
            ib = self.ctx.input_index("B")
            xs[ib] = xs[ib].astype(np_dtype(self.ctx.b_dtype))
        for idx, lay in self.ctx.layouts.items():
            xs[idx] = lay.apply(xs[idx])
        return [np.ascontiguousarray(x) for x in xs]

    def verify(self, seed: int = 1) -> tuple[bool, float]:
        """Run on random inputs and compare with the NumPy reference: (ok, error)."""
        xs = self.op.random_inputs(seed)
        return self.op.check(self.run(*xs), self.op.reference(*xs))
