"""A CPU kernel whose symbolic extents are run-time arguments (`tsl.dynamic.symbolic`).

Built from a schedule recorded at one value; runs at any value, padding each axis that
follows the symbol only to the schedule's block of it. Packing (weights in the primitive's
layout, the unsigned-A compensation) is the static artifact's, from `Artifact`; only the
shapes differ.
"""

from __future__ import annotations

import time

import numpy as np

from ...dynamic.symbolic import dim_axes, lower_symbolic, padded
from ...errors import InputError
from ...ops.operator import np_dtype
from . import codegen
from .lowering import CPULowering
from .runtime import CPUArtifact, set_threads


class SymbolicCPUKernel(CPUArtifact):
    """`blocks`: axis -> block of each axis that follows the symbol."""

    def __init__(self, schedule, blocks: dict[str, int]):
        lowering = CPULowering(schedule.machine, schedule.primitive)
        ctx = lower_symbolic(schedule, lowering, blocks)
        # Compiled on first use: inside a Relax model (tsl.relax) TVM compiles the kernel with
        # the rest of the graph, and this module is never run.
        super().__init__(schedule, ctx, None)
        self.blocks = dict(blocks)
        *self.in_dims, self.out_dims = dim_axes(schedule.op, blocks)

    @property
    def executable(self):
        if self._executable is None:
            self._executable = codegen.compile_module(self.ctx.sch.mod, self.machine)
        return self._executable

    @executable.setter
    def executable(self, module) -> None:
        self._executable = module

    def _shape(self, static: tuple, dims: dict, v: int) -> tuple:
        """A tensor's kernel shape at value v: its symbolic dims padded to their blocks."""
        return tuple(padded(v, self.blocks[dims[d]]) if d in dims else n
                     for d, n in enumerate(static))

    def check_fits(self, i: int, x: np.ndarray, want: tuple) -> None:
        """Input i's x must fit the kernel's padded shape `want` (no dim larger)."""
        if x.ndim != len(want) or any(a > b for a, b in zip(x.shape, want)):
            raise InputError(f"{self.op}: input {self.op.inputs[i].name} of shape {x.shape} "
                             f"does not fit the kernel's {tuple(want)}")

    def _padded_to(self, i: int, x: np.ndarray, v: int) -> np.ndarray:
        want = self._shape(self.ctx.op.inputs[i].shape, self.in_dims[i], v)
        self.check_fits(i, x, want)
        return x if x.shape == want else np.pad(x, [(0, b - a) for a, b in zip(x.shape, want)])

    def value_of(self, arrays) -> int:
        i = next(n for n, d in enumerate(self.in_dims) if d and arrays[n] is not None)
        return np.shape(arrays[i])[next(iter(self.in_dims[i]))]

    def run(self, *arrays: np.ndarray) -> np.ndarray:
        """The operator's inputs at any value (shapes are checked by the caller,
        `DynamicArtifact`), NumPy out."""
        return self.bind()(*arrays)

    def bind(self, **constants) -> "SymbolicBound":
        return SymbolicBound(self, constants)


class Staging:
    """Per-call arguments without allocations: one TVM tensor per free input (in the dtype
    and layout the kernel reads) and for the output, grown to the largest value seen, and
    each value's arguments contiguous views of its first bytes in the padded shape. An input
    the kernel reads in another layout or dtype is padded into a NumPy buffer grown the same
    way and converted into its tensor by one assignment. A fresh 2048x3072 output tensor per
    call, and a copy of the input into a new one, cost page faults the static artifact's
    resident tensors (`tsl.bound.Resident`) never pay; a packed operand copied into a new
    tensor per call cost attention at s=1 0.1 ms, nine times its kernel.

    Everything a value's call needs but its inputs' data (views, argument list, row counts,
    the output's crop) is made on its first call (`Call`): the per-call Python it replaces
    (shapes padded, views looked up, the argument list built) cost ~15 us on 35-100 us calls."""

    def __init__(self, kernel: SymbolicCPUKernel, free: list[int], fixed: dict, comp):
        self.kernel = kernel
        ins, big = kernel.op.inputs, kernel.ctx.op.inputs  # big: constant dims padded
        self.free, self.fixed, self.comp = list(free), fixed, comp
        # per free input: (the kernel's layout, or None, and whether it needs a NumPy
        # buffer: a layout or a dtype change between the caller's array and the kernel's)
        self.convert = {i: (kernel.ctx.layouts.get(i), i in kernel.ctx.layouts
                            or kernel.ctx.input_dtype(i) != ins[i].dtype) for i in free}
        self.slots = [(big[i].shape, kernel.in_dims[i], kernel.ctx.input_dtype(i),
                       self.convert[i][0]) for i in free]
        out = kernel.ctx.op.output
        self.slots.append((out.shape, kernel.out_dims, out.dtype, None))
        self.bases: list = [None] * len(self.slots)
        self.scratch: dict[int, np.ndarray] = {}  # free input -> its NumPy buffer
        self.filled: dict[int, Fill] = {}  # free input -> the Fill that last wrote its buffer
        self.calls: dict[int, Call] = {}

    def at(self, v: int) -> "Call":
        """Value v's call (made on first use)."""
        c = self.calls.get(v)
        if c is None:
            c = self.calls[v] = self._make(v)
        return c

    def _make(self, v: int) -> "Call":
        k = self.kernel
        k._runnable()
        set_threads(k.machine.cores())
        shapes = [k._shape(shape, dims, v) for shape, dims, _, _ in self.slots]
        stored = [lay.shape(sh) if lay else sh
                  for (_, _, _, lay), sh in zip(self.slots, shapes)]
        for n, ((_, _, dtype, _), shape) in enumerate(zip(self.slots, stored)):
            size = int(np.prod(shape))
            if self.bases[n] is None or self.bases[n].shape[0] < size:
                self.bases[n] = k.device_empty((size,), dtype)
                self.calls.clear()  # views of the old tensor would keep it alive
        pads = {}
        for i, shape in zip(self.free, shapes):
            if self.convert[i][1]:
                size, dtype = int(np.prod(shape)), np_dtype(k.op.inputs[i].dtype)
                if i not in self.scratch or self.scratch[i].size < size:
                    self.scratch[i] = np.empty(size, dtype)
                    self.calls.clear()
                pads[i] = self.scratch[i][:size].reshape(shape)
        tv = [b._create_view(shape) for b, shape in zip(self.bases, stored)]
        arrays = [np.from_dlpack(t) for t in tv]
        inputs = []
        for n, i in enumerate(self.free):
            lay = self.convert[i][0]
            dst = pads.get(i, arrays[n])
            given = tuple(v if d in k.in_dims[i] else m
                          for d, m in enumerate(k.op.inputs[i].shape))
            into = (arrays[n], lay) if i in pads else None
            inputs.append(Fill(i, given, dst, into, self.filled))
        tensors = dict(self.fixed) | {i: tv[n] for n, i in enumerate(self.free)}
        # a free B's compensation: a slot its call fills (`Call.comp_at`)
        comp = [None] if self.comp is None else list(self.comp)
        args = [tensors[i] for i in range(len(tensors))] + comp
        want = tuple(v if d in k.out_dims else n for d, n in enumerate(k.op.output.shape))
        counts = [padded(v, k.blocks[a]) // k.blocks[a] for a in sorted(k.blocks)]
        return Call(k, inputs, args + [tv[-1]] + counts,
                    arrays[-1][tuple(slice(0, w) for w in want)], self.comp is None)


class Fill:
    """A free input's staging at one value: x (of shape `given`) into the kernel's padded
    buffer `dst`, zeros past it (padding the kernel reads), and where the kernel reads
    another layout or dtype, `into` = (its tensor's view, the layout or None) packed from
    dst, or from x itself where nothing pads.

    The buffer is shared by every value's call (`Staging`), so its zeros past x are written
    only where another value's call (`filled`: input -> the Fill that wrote it last) may
    have written there. A layout is packed as the static artifact packs (`Layout.apply`: a
    contiguous copy, then assigned): the strided view assigned into the tensor ran attention
    at s = 1-16 at 1.19-1.36x the static call in three of five processes, 0.84-0.92x in the
    other two (where the buffers landed); packed so, 0.82-0.94x in all five (Zen 4; dyn44)."""

    def __init__(self, i: int, given: tuple, dst: np.ndarray, into, filled: dict):
        self.i, self.given, self.dst, self.into, self.filled = i, given, dst, into, filled
        self.region = tuple(slice(0, m) for m in given)
        self.past = [(slice(None),) * d + (slice(m, None),)
                     for d, (m, big) in enumerate(zip(given, dst.shape)) if m < big]
        # nothing pads x: packed from it, without the pass through dst
        self.direct = into is not None and not self.past

    def __call__(self, x: np.ndarray) -> None:
        if self.direct:
            self._pack(x)
            return
        self.dst[self.region] = x
        if self.filled.get(self.i) is not self:
            for z in self.past:
                self.dst[z] = 0
            self.filled[self.i] = self
        if self.into is not None:
            self._pack(self.dst)

    def _pack(self, x: np.ndarray) -> None:
        tensor, lay = self.into
        tensor[...] = lay.apply(x) if lay else x


class Call:
    """One value's kernel call: the inputs staged, the linked kernel called on the prepared
    argument list, the output cropped into a fresh NumPy array."""

    def __init__(self, kernel, inputs: list[Fill], args: list, out: np.ndarray,
                 comp_per_call: bool):
        self.kernel, self.inputs, self.args, self.out = kernel, inputs, args, out
        self.fn = kernel.kernel()
        # the unsigned-A compensation of a free B, computed from it per call (its slot
        # follows the tensors)
        self.comp_at = len(kernel.op.inputs) if comp_per_call else None

    def check(self, arrays) -> None:
        """Each x must have its input's shape at this value (`Fill.given`)."""
        for f, x in zip(self.inputs, arrays):
            if x.shape != f.given:
                raise InputError(f"{self.kernel.op}: input {self.kernel.op.inputs[f.i].name} "
                                 f"of shape {x.shape} does not match the kernel's {f.given} "
                                 f"at this value")

    def __call__(self, arrays, padded_constants: dict) -> np.ndarray:
        for f, x in zip(self.inputs, arrays):
            f(x)
        if self.comp_at is not None:
            xs = padded_constants | {f.i: x if f.direct else f.dst
                                     for f, x in zip(self.inputs, arrays)}
            (c,) = self.kernel._compensation([xs[i] for i in range(len(xs))])
            self.args[self.comp_at] = self.kernel.device_tensor(c)
        self.fn(*self.args)
        return np.array(self.out)


class SymbolicBound:
    """Constants padded and packed once (as `tsl.bound.Bound`); the rest staged per call."""

    def __init__(self, kernel: SymbolicCPUKernel, constants: dict):
        t0 = time.perf_counter()
        self.kernel = kernel
        ins = kernel.op.inputs
        names = {t.name: i for i, t in enumerate(ins)} | {t.role: i for i, t in enumerate(ins)}
        idx = {names[k]: np.asarray(x) for k, x in constants.items()}
        self.padded = {i: kernel._padded_to(i, x, 0) for i, x in idx.items()}
        # Packed constants live as TVM tensors from here on: copying a 3072x768 weight into a
        # new tensor on every call cost 1.5 ms, eight times the kernel at M = 1.
        packed = {i: kernel.device_tensor(kernel._pack(i, x)) for i, x in self.padded.items()}
        self.free = [i for i in range(len(ins)) if i not in idx]
        comp = None
        if not kernel.ctx.unsigned_a:
            comp = []
        elif kernel.ctx.input_index("B") in self.padded:
            comp = [kernel.device_tensor(c) for c in kernel._compensation(
                [self.padded.get(i) for i in range(len(ins))])]
        self.staging = Staging(kernel, self.free, packed, comp)
        self.prep_seconds = time.perf_counter() - t0

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        """The free inputs at any value (each shape checked against the value the first
        input that follows the symbol gives)."""
        k = self.kernel
        xs = [np.asarray(x) for x in arrays]
        full = dict(zip(self.free, xs))
        c = self.staging.at(k.value_of([full.get(i) for i in range(len(k.op.inputs))]))
        c.check(xs)
        return c(xs, self.padded)

    def run_at(self, v: int, arrays: list) -> np.ndarray:
        """The call at value v on free inputs the caller checked (`DynamicBound`)."""
        return self.staging.at(v)(arrays, self.padded)
