"""What `tsl.build(family, target)` returns: micro-kernels and the table that picks them.

`run(*arrays)` reads the symbol's value from the arrays' shapes, checks every shape against
the operator at that value, and runs the table's plan: each call's inputs are cut (along the
chunk dims) or zero-padded to its kernel's value, its output cropped, and the pieces joined.
The kernels are the back end's own artifacts, so every back end that builds the family's
operator builds the family, with nothing of this module copied into it.
"""

from __future__ import annotations

from functools import lru_cache, partial
from types import SimpleNamespace

import numpy as np

from ..artifact import Artifact
from ..errors import InputError
from . import plan
from .shape import Dims, value_of


class DynamicArtifact:
    def __init__(self, family, dims: Dims, kernels: list, tab: plan.Table):
        self.family, self.dims, self.kernels, self.table = family, dims, kernels, tab
        self._at = lru_cache(maxsize=512)(lambda v: family.at(**{dims.symbol.name: v}))

    @property
    def target(self) -> str:
        return next(k.artifact.target for k in self.kernels if k.artifact is not None)

    def op_at(self, value: int):
        """The concrete operator at the symbol's `value`."""
        return self._at(self.dims.symbol.check(value))

    def dispatch(self) -> str:
        """Ranges of the symbol -> the micro-kernel run there, its knobs and the model's time."""
        return plan.describe(self.table, self.kernels, self.dims.symbol.name)

    def pieces(self, value: int) -> list[tuple[int, int]]:
        """(kernel index, values covered) of each call that runs `value`."""
        return plan.pieces(self.table, self.kernels, self.dims.symbol.check(value))

    def estimate_seconds(self, value: int) -> float:
        """The model's time of the plan at `value` (kernel calls and their overhead)."""
        return self.table.price(self.dims.symbol.check(value))

    def run(self, *arrays: np.ndarray) -> np.ndarray:
        """NumPy in (the operator's inputs at any value of the symbol), NumPy out."""
        return self._run(list(arrays), range(len(self.dims.inputs)),
                         lambda k, xs: self.kernels[k].artifact.run(*xs))

    def bind(self, **constants) -> "DynamicBound":
        """Constants (weights, bias) padded and packed once for every kernel the table uses;
        `f(*the other inputs)` runs at any value. A constant must not follow the symbol."""
        return DynamicBound(self, constants)

    def verify(self, seed: int = 1, **values) -> tuple[bool, float]:
        """Run at `values` (e.g. m=37) on random inputs against the NumPy reference."""
        op = self.family.at(**values)
        xs = op.random_inputs(seed)
        return op.check(self.run(*xs), op.reference(*xs))

    # -- the plan's execution ----------------------------------------------------------------
    def _checked(self, arrays, positions) -> tuple[int, list[np.ndarray]]:
        full = [None] * len(self.dims.inputs)
        for i, x in zip(positions, arrays):
            full[i] = x
        probe = self.dims.probe[0]
        if probe not in positions:
            raise InputError(f"{self.family}: input {probe} (which sets "
                             f"{self.dims.symbol.name}) must be passed per call")
        v = value_of(self.family, self.dims, full)
        op = self._at(v)
        want = [op.inputs[i] for i in positions]
        # The static artifact's checks (count, shape, dtype) against the operator at v.
        return v, Artifact.check_inputs(SimpleNamespace(op=op), arrays, want)

    def _run(self, arrays, positions, call) -> np.ndarray:
        positions = list(positions)
        v, arrays = self._checked(arrays, positions)
        return self._execute(v, arrays, positions, call)

    def _execute(self, v: int, arrays, positions, call) -> np.ndarray:
        """The plan at value v on checked `arrays` (the inputs at `positions`)."""
        outs, start = [], 0
        for k, take in plan.pieces(self.table, self.kernels, v):
            xs = [self._piece(x, i, start, take) for x, i in zip(arrays, positions)]
            if self.kernels[k].blocks:  # run-time extents: the kernel pads to its block itself
                outs.append(call(k, xs))
                start += take
                continue
            y = call(k, self._padded(xs, positions, self.kernels[k].value, take))
            outs.append(self._crop(y, take))
            start += take
        if len(outs) == 1:
            return outs[0]
        return np.concatenate(outs, axis=self.dims.chunk_dim(None))

    def _piece(self, x, i, start, take):
        """Input `i`'s part for values start..start+take (all of it where it does not follow
        the symbol, or where the plan is one padded call)."""
        if not self.dims.varies(i) or self.dims.chunk_axis is None:
            return x
        d = self.dims.chunk_dim(i)
        return x[(slice(None),) * d + (slice(start, start + take),)]

    def _padded(self, xs, positions, value, take):
        big, small = self._at(value), self._at(take)
        out = []
        for x, i in zip(xs, positions):
            tb = big.inputs[i].shape
            if x.shape != tb:
                x = np.pad(x, [(0, b - a) for a, b in zip(small.inputs[i].shape, tb)])
            out.append(x)
        return out

    def _crop(self, y, take):
        want = self._at(take).output.shape
        if y.shape == want:
            return y
        return y[tuple(slice(0, n) for n in want)]


class DynamicBound:
    """`DynamicArtifact.bind`: every used kernel's `Bound`, and the plan over the free inputs.

    The checks and the plan depend only on the inputs' shapes and dtypes, so both are made
    on the first call with each and looked up after (`_seen`: at most one entry per value):
    the table walk and the checks against the operator at the value cost ~18 us a call, half
    a 35 us call at M=1. A value run by one kernel with run-time rows calls its bound kernel
    at that value directly (`SymbolicBound.run_at`)."""

    def __init__(self, art: DynamicArtifact, constants: dict):
        self.art = art
        ins = art.family.upper().inputs
        names = {t.name: i for i, t in enumerate(ins)} | {t.role: i for i, t in enumerate(ins)}
        moving = [k for k in constants if k in names and art.dims.varies(names[k])]
        if moving:
            raise InputError(f"{art.family}: {', '.join(moving)} follow "
                             f"{art.dims.symbol.name}; bind only inputs whose shape does not")
        self.bounds = {k: art.kernels[k].artifact.bind(**constants)
                       for k in sorted(art.table.used())}
        self.free = [i for i in range(len(ins)) if i not in
                     {names[k] for k in constants}]
        self.prep_seconds = sum(b.prep_seconds for b in self.bounds.values())
        self._seen: dict[tuple, object] = {}  # the inputs' (shape, dtype)s -> their run

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        xs = [x if type(x) is np.ndarray else np.asarray(x) for x in arrays]
        key = tuple([(x.shape, x.dtype) for x in xs])
        run = self._seen.get(key)
        if run is None:
            run = self._seen[key] = self._run_for(xs)
        return run(xs)

    def _run_for(self, xs: list):
        """The run of inputs shaped as `xs` (checked here: a typed error for bad ones)."""
        art = self.art
        v, _ = art._checked(xs, self.free)
        (k, _), *more = plan.pieces(art.table, art.kernels, v)
        if not more and art.kernels[k].blocks:
            return partial(self.bounds[k].run_at, v)
        return partial(art._execute, v, positions=self.free,
                       call=lambda k, xs: self.bounds[k](*xs))
