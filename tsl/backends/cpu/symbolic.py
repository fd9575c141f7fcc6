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

    def call(self, packed: list, v: int, out) -> np.ndarray:
        """One call at value `v` on `packed` arguments: NumPy arrays (copied in) or TVM
        tensors (used as they are); `out`, a TVM tensor of the padded output's shape, takes
        the result. A fresh NumPy array comes back."""
        import tvm

        self._runnable()
        set_threads(self.machine.cores())
        dev = tvm.cpu(0)
        args = [tvm.runtime.tensor(x, dev) if isinstance(x, np.ndarray) else x for x in packed]
        args.append(out)
        self.kernel()(*args, *[padded(v, self.blocks[a]) // self.blocks[a]
                                 for a in sorted(self.blocks)])
        # the operator's own extents: padded columns and rows cropped
        want = tuple(v if d in self.out_dims else n for d, n in enumerate(self.op.output.shape))
        y = np.from_dlpack(args[-1])
        return np.array(y[tuple(slice(0, w) for w in want)])


class Staging:
    """Per-call arguments without allocations: one TVM tensor per free input (in the dtype
    and layout the kernel reads) and for the output, grown to the largest value seen, and
    each value's arguments contiguous views of its first bytes in the padded shape. An input
    the kernel reads in another layout or dtype is padded into a NumPy buffer grown the same
    way and converted into its tensor by one assignment. A fresh 2048x3072 output tensor per
    call, and a copy of the input into a new one, cost page faults the static artifact's
    resident tensors (`tsl.bound.Resident`) never pay; a packed operand copied into a new
    tensor per call cost attention at s=1 0.1 ms, nine times its kernel."""

    def __init__(self, kernel: SymbolicCPUKernel, free: list[int]):
        self.kernel = kernel
        ins, big = kernel.op.inputs, kernel.ctx.op.inputs  # big: constant dims padded
        self.free = list(free)
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
        self.views: dict[tuple, tuple[list, list, dict]] = {}

    def at(self, v: int) -> tuple[list, list, dict]:
        """(TVM views, NumPy views) of the free inputs, in the kernel's layout, and the
        output at value v, and {free input: its padded NumPy buffer} where it converts."""
        k = self.kernel
        key = tuple(padded(v, k.blocks[a]) for a in sorted(k.blocks))
        if key not in self.views:
            shapes = [k._shape(shape, dims, v) for shape, dims, _, _ in self.slots]
            stored = [lay.shape(sh) if lay else sh
                      for (_, _, _, lay), sh in zip(self.slots, shapes)]
            for n, ((_, _, dtype, _), shape) in enumerate(zip(self.slots, stored)):
                size = int(np.prod(shape))
                if self.bases[n] is None or self.bases[n].shape[0] < size:
                    self.bases[n] = k.device_empty((size,), dtype)
                    self.views.clear()  # views of the old tensor would keep it alive
            pads = {}
            for i, shape in zip(self.free, shapes):
                if self.convert[i][1]:
                    size, dtype = int(np.prod(shape)), np_dtype(k.op.inputs[i].dtype)
                    if i not in self.scratch or self.scratch[i].size < size:
                        self.scratch[i] = np.empty(size, dtype)
                        self.views.clear()
                    pads[i] = self.scratch[i][:size].reshape(shape)
            tv = [b._create_view(shape) for b, shape in zip(self.bases, stored)]
            self.views[key] = (tv, [np.from_dlpack(t) for t in tv], pads)
        return self.views[key]

    def stage(self, n: int, x: np.ndarray, views) -> np.ndarray:
        """The n-th free input's x padded into its argument (zeros past x: padding the
        kernel reads); returns it padded, as NumPy in the operator's dtype."""
        i = self.free[n]
        _, arrays, pads = views
        dst = pads.get(i, arrays[n])
        self.kernel.check_fits(i, x, dst.shape)
        dst[tuple(slice(0, m) for m in x.shape)] = x
        for d, (m, big) in enumerate(zip(x.shape, dst.shape)):
            if m < big:
                dst[(slice(None),) * d + (slice(m, None),)] = 0
        if i in pads:
            lay = self.convert[i][0]
            arrays[n][...] = lay.view(dst) if lay else dst
        return dst


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
        self.packed = {i: kernel.device_tensor(kernel._pack(i, x))
                       for i, x in self.padded.items()}
        self.free = [i for i in range(len(ins)) if i not in idx]
        self.comp = None
        if kernel.ctx.unsigned_a and kernel.ctx.input_index("B") in self.padded:
            self.comp = [kernel.device_tensor(c) for c in kernel._compensation(
                [self.padded.get(i) for i in range(len(ins))])]
        self.staging = Staging(kernel, self.free)
        self.prep_seconds = time.perf_counter() - t0

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        k = self.kernel
        full = dict(zip(self.free, arrays))
        v = k.value_of([full.get(i) for i in range(len(k.op.inputs))])
        views = self.staging.at(v)
        packed, xs = dict(self.packed), {}
        for n, i in enumerate(self.free):
            xs[i] = self.staging.stage(n, np.asarray(full[i]), views)
            packed[i] = views[0][n]
        comp = self.comp
        if comp is None:
            comp = k._compensation([{**self.padded, **xs}[i] for i in range(len(packed))])
        return k.call([packed[i] for i in range(len(packed))] + comp, v, views[0][-1])
