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

    def check_inputs(self, arrays, tensors=None) -> list[np.ndarray]:
        """`arrays` as NumPy, checked against `tensors` (default: all the operator's inputs)."""
        ins = self.op.inputs if tensors is None else tensors
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

    def _pad(self, i: int, x: np.ndarray) -> np.ndarray:
        t, tb = self.op.inputs[i], self.ctx.op.inputs[i]
        return x if t.shape == tb.shape else np.pad(x, [(0, b - a) for a, b in
                                                        zip(t.shape, tb.shape)])

    def _pack(self, i: int, x: np.ndarray) -> np.ndarray:
        """Input `i`, padded, in the dtype and layout the kernel reads."""
        x = x.astype(np_dtype(self.ctx.input_dtype(i)), copy=False)
        if i in self.ctx.layouts:
            x = self.ctx.layouts[i].apply(x)
        return np.ascontiguousarray(x)

    def _compensation(self, padded: list) -> list[np.ndarray]:
        """The unsigned-A machine's extra argument, from the padded B (none elsewhere)."""
        if not self.ctx.unsigned_a:
            return []
        return [self.ctx.op.compensation(padded[self.ctx.input_index("B")])]

    def prepare(self, arrays) -> list[np.ndarray]:
        """Checked, padded and packed inputs, ready for the kernel."""
        xs = [self._pad(i, x) for i, x in enumerate(self.check_inputs(arrays))]
        return [self._pack(i, x) for i, x in enumerate(xs)] + self._compensation(xs)

    def constants(self) -> list[str]:
        """The inputs a model fixes once (weights, bias, scale): dense's and conv2d's B (A of
        a matmul whose B is an activation, `activation_b`) and the epilogue's per-channel
        operands; matmul's B, residuals and A come per call."""
        per_call = {"A", "residual"} | ({"B"} if self.op.name in ("matmul", "batch_matmul")
                                        else set())
        if self.op.params.get("activation_b"):
            per_call -= {"A"}  # A holds a 1x1 conv's weights, B its activation
        return [t.name for t in self.op.inputs if t.role not in per_call]

    def user_time(self, arrays, repeat: int = 7) -> dict:
        """What a caller pays per call (`bind` of `constants()`, then the median of `repeat`
        calls on the other inputs: their padding and packing and the output's cropping
        included) and the one-time weight preparation, apart. Where the back end keeps
        tensors resident (`Bound.resident`) the inputs are its tensors already, in the
        operator's own layout, and the output lands in one (`out=`): no host copies timed."""
        names = self.constants()
        consts = {t.name: x for t, x in zip(self.op.inputs, arrays) if t.name in names}
        f = self.bind(**consts)
        free = [x for t, x in zip(self.op.inputs, arrays) if t.name not in names]
        out = None
        if f.resident is not None:
            free = [self.device_tensor(x) for x in free]
            out = self.device_empty(self.op.output.shape, self.op.output.dtype)
        ts = call_times(lambda: f(*free, out=out), repeat)
        return {"user_samples": ts, "user_seconds": float(np.median(ts)),
                "weight_prep_seconds": f.prep_seconds, "bound_inputs": names,
                "resident": f.resident is not None}

    def runs_own_way(self) -> bool:
        """True when this artifact's class prepares or runs its inputs its own way (overrides
        `prepare` or `run`): `bind` then has nothing to pad or pack once."""
        cls = type(self)
        return cls.prepare is not Artifact.prepare or cls.run is not Artifact.run

    def bind(self, **constants) -> "Bound":
        """Constant operands (weights, bias: by tensor name or role) padded and packed once;
        returns `f` with `f(*the other inputs, in order)` = `run(...)` of them all. The
        inference pattern: `run` pads and packs every operand on every call."""
        from .bound import Bound

        return Bound(self, constants)

    def verify(self, seed: int = 1) -> tuple[bool, float]:
        """Run on random inputs and compare with the NumPy reference: (ok, error)."""
        xs = self.op.random_inputs(seed)
        return self.op.check(self.run(*xs), self.op.reference(*xs))


# Calls before a per-call timing: after a pause, the first calls of a bound CPU conv read up
# to 40% slower than the tenth (1x64x56x56 3x3: 1.75, 1.45, ... then 1.31 ms) while NumPy's
# per-call input and output copies fault their pages in; a caller in a loop pays the latter.
WARMUP_CALLS = 10


def call_times(fn, repeat: int, warmup: int = WARMUP_CALLS) -> list[float]:
    """Seconds of each of `repeat` single calls of `fn`, after `warmup` untimed ones."""
    import time

    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts
