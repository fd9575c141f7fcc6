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

    def _padded_to(self, i: int, x: np.ndarray, v: int) -> np.ndarray:
        want = self._shape(self.ctx.op.inputs[i].shape, self.in_dims[i], v)
        if x.ndim != len(want) or any(a > b for a, b in zip(x.shape, want)):
            raise InputError(f"{self.op}: input {self.op.inputs[i].name} of shape {x.shape} "
                             f"does not fit the kernel's {want}")
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
        self.executable(*args, *[padded(v, self.blocks[a]) // self.blocks[a]
                                 for a in sorted(self.blocks)])
        # the operator's own extents: padded columns and rows cropped
        want = tuple(v if d in self.out_dims else n for d, n in enumerate(self.op.output.shape))
        y = np.from_dlpack(args[-1])
        return np.array(y[tuple(slice(0, w) for w in want)])


class Staging:
    """Per-call arguments without allocations: one TVM tensor per staged free input (read by
    the kernel as given: no layout or dtype change) and for the output, grown to the largest
    value seen, and each value's arguments contiguous views of its first bytes in the padded
    shape. A fresh 2048x3072 output tensor per call, and a copy of the input into a new one,
    cost page faults the static artifact's resident tensors (`tsl.bound.Resident`) never pay."""

    def __init__(self, kernel: SymbolicCPUKernel, free: list[int]):
        self.kernel = kernel
        ins = kernel.op.inputs
        self.staged = [i for i in free if i not in kernel.ctx.layouts
                       and kernel.ctx.input_dtype(i) == ins[i].dtype]
        big = kernel.ctx.op.inputs  # the kernel's shapes: constant dims padded as recorded
        self.slots = [(big[i].shape, kernel.in_dims[i], ins[i].dtype) for i in self.staged]
        out = kernel.ctx.op.output
        self.slots.append((out.shape, kernel.out_dims, out.dtype))
        self.bases: list = [None] * len(self.slots)
        self.views: dict[tuple, tuple[list, list]] = {}

    def at(self, v: int) -> tuple[list, list]:
        """(TVM views, NumPy views) of the staged inputs and the output at value v."""
        k = self.kernel
        key = tuple(padded(v, k.blocks[a]) for a in sorted(k.blocks))
        if key not in self.views:
            shapes = [k._shape(shape, dims, v) for shape, dims, _ in self.slots]
            for n, ((_, _, dtype), shape) in enumerate(zip(self.slots, shapes)):
                size = int(np.prod(shape))
                if self.bases[n] is None or self.bases[n].shape[0] < size:
                    self.bases[n] = k.device_empty((size,), dtype)
                    self.views.clear()  # views of the old tensor would keep it alive
            tv = [b._create_view(shape) for b, shape in zip(self.bases, shapes)]
            self.views[key] = (tv, [np.from_dlpack(t) for t in tv])
        return self.views[key]

    def stage(self, i: int, dst: np.ndarray, x: np.ndarray) -> None:
        """Input i's x into the corner of dst, the rest of dst zero (padding the kernel
        reads)."""
        if x.ndim != dst.ndim or any(a > b for a, b in zip(x.shape, dst.shape)):
            raise InputError(f"{self.kernel.op}: input {self.kernel.op.inputs[i].name} of "
                             f"shape {x.shape} does not fit the kernel's {dst.shape}")
        dst[tuple(slice(0, n) for n in x.shape)] = x
        for d, (n, m) in enumerate(zip(x.shape, dst.shape)):
            if n < m:
                dst[(slice(None),) * d + (slice(n, None),)] = 0


class SymbolicBound:
    """Constants padded and packed once (as `tsl.bound.Bound`); the rest padded per call."""

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
        tv, nv = self.staging.at(v)
        staged = dict(zip(self.staging.staged, zip(tv, nv)))
        xs, packed = {}, dict(self.packed)
        for i, x in full.items():
            if i in staged:
                self.staging.stage(i, staged[i][1], np.asarray(x))
                xs[i], packed[i] = staged[i][1], staged[i][0]
            else:
                xs[i] = k._padded_to(i, np.asarray(x), v)
                packed[i] = k._pack(i, xs[i])
        comp = self.comp
        if comp is None:
            comp = k._compensation([{**self.padded, **xs}[i] for i in range(len(packed))])
        return k.call([packed[i] for i in range(len(packed))] + comp, v, tv[-1])
