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

    # -- shared ------------------------------------------------------------------------------
    def tir(self) -> str:
        """The scheduled TIR (before the back end's code generation)."""
        return self.ctx.sch.mod.script()

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
