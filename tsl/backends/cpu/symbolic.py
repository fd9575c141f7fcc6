"""A CPU kernel whose row count is a run-time argument (`tsl.dynamic.symbolic`).

Built from a schedule recorded at one value; runs at any number of rows, padding them only
to the schedule's row block. Packing (weights in the primitive's layout, the unsigned-A
compensation) is the static artifact's, from `Artifact`; only the shapes differ.
"""

from __future__ import annotations

import time

import numpy as np

from ...dynamic.symbolic import blocks, lower_symbolic
from ...errors import InputError
from . import codegen
from .lowering import CPULowering
from .runtime import CPUArtifact, set_threads


class SymbolicCPUKernel(CPUArtifact):
    """`row_dims[i]`: the dim of input i that holds the rows (None: no rows, e.g. weights);
    `out_dim`: the output's."""

    def __init__(self, schedule, block: int, row_dims, out_dim: int):
        lowering = CPULowering(schedule.machine, schedule.primitive)
        ctx = lower_symbolic(schedule, lowering, block)
        super().__init__(schedule, ctx, codegen.compile_module(ctx.sch.mod, schedule.machine))
        self.block, self.row_dims, self.out_dim = block, tuple(row_dims), out_dim

    def _padded_to(self, i: int, x: np.ndarray, rows: int) -> np.ndarray:
        """Input i zero-padded to the kernel's shape for `rows` padded rows."""
        want = list(self.ctx.op.inputs[i].shape)
        if self.row_dims[i] is not None:
            want[self.row_dims[i]] = rows
        if x.ndim != len(want) or any(a > b for a, b in zip(x.shape, want)):
            raise InputError(f"{self.op}: input {self.op.inputs[i].name} of shape {x.shape} "
                             f"does not fit the kernel's {tuple(want)}")
        return x if x.shape == tuple(want) else np.pad(x, [(0, b - a) for a, b in
                                                           zip(x.shape, want)])

    def rows_of(self, arrays) -> int:
        i = next(n for n, d in enumerate(self.row_dims) if d is not None)
        return np.shape(arrays[i])[self.row_dims[i]]

    def run(self, *arrays: np.ndarray) -> np.ndarray:
        """The operator's inputs at any row count (shapes are checked by the caller,
        `DynamicArtifact`), NumPy out."""
        return self.bind()(*arrays)

    def bind(self, **constants) -> "SymbolicBound":
        return SymbolicBound(self, constants)

    def call(self, packed: list[np.ndarray], rows: int) -> np.ndarray:
        import tvm

        self._runnable()
        set_threads(self.machine.cores())
        dev = tvm.cpu(0)
        n = blocks(rows, self.block)
        args = [tvm.runtime.tensor(x, dev) for x in packed]
        shape = list(self.ctx.op.output.shape)
        shape[self.out_dim] = n * self.block
        args.append(tvm.runtime.empty(tuple(shape), self.ctx.op.output.dtype, dev))
        self.executable(*args, n)
        want = list(self.op.output.shape)  # the operator's columns, not the padded ones
        want[self.out_dim] = rows
        y = args[-1].numpy()
        return y if y.shape == tuple(want) else np.ascontiguousarray(
            y[tuple(slice(0, w) for w in want)])


class SymbolicBound:
    """Constants padded and packed once (as `tsl.bound.Bound`); rows padded per call."""

    def __init__(self, kernel: SymbolicCPUKernel, constants: dict):
        t0 = time.perf_counter()
        self.kernel = kernel
        ins = kernel.op.inputs
        names = {t.name: i for i, t in enumerate(ins)} | {t.role: i for i, t in enumerate(ins)}
        idx = {names[k]: x for k, x in constants.items()}
        self.packed = {i: kernel._pack(i, kernel._padded_to(i, np.asarray(x), 0))
                       for i, x in idx.items()}
        self.padded = {i: kernel._padded_to(i, np.asarray(x), 0) for i, x in idx.items()}
        self.free = [i for i in range(len(ins)) if i not in idx]
        self.comp = None
        if kernel.ctx.unsigned_a and kernel.ctx.input_index("B") in self.padded:
            self.comp = kernel._compensation(
                [self.padded.get(i) for i in range(len(ins))])
        self.prep_seconds = time.perf_counter() - t0

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        k = self.kernel
        full = dict(zip(self.free, arrays))
        rows = k.rows_of([full.get(i) for i in range(len(k.op.inputs))])
        padded_rows = blocks(rows, k.block) * k.block
        xs = {i: k._padded_to(i, np.asarray(x), padded_rows) for i, x in full.items()}
        packed = {**self.packed, **{i: k._pack(i, x) for i, x in xs.items()}}
        comp = self.comp
        if comp is None:
            comp = k._compensation([{**self.padded, **xs}[i] for i in range(len(packed))])
        return k.call([packed[i] for i in range(len(packed))] + comp, rows)
