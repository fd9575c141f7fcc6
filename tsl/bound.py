"""`Artifact.bind`: an artifact with its constant operands padded and packed once.

`art.run(a, w)` pads and packs every operand on every call: dense 128x3072x768 + bias read
4.9 ms as a kernel and 15.6 ms through `run`, most of it the weight's packing, which a model
does once. `f = art.bind(B=w)` does that work now (timed: `prep_seconds`), and `f(a)` pays per
call only what a caller must: the activations' padding and packing and the output's cropping.
"""

from __future__ import annotations

import time

import numpy as np

from .errors import InputError


class Bound:
    def __init__(self, art, constants: dict):
        self.art = art
        ins = art.op.inputs
        names = {t.name: i for i, t in enumerate(ins)} | {t.role: i for i, t in enumerate(ins)}
        unknown = [k for k in constants if k not in names]
        if unknown:
            raise InputError(f"{art.op}: no input named {', '.join(unknown)} to bind; its inputs "
                             f"are {', '.join(t.name for t in ins)}")
        t0 = time.perf_counter()
        idx = {names[k]: x for k, x in constants.items()}
        checked = art.check_inputs(list(idx.values()), [ins[i] for i in idx])
        # An artifact that prepares or runs its inputs its own way (Hopper's TMA kernels take
        # them unpadded, the TPU kernel runs under JAX) gets the checked constants back
        # through its own `run` on every call: correct, with nothing to save.
        self.own_way = art.runs_own_way()
        self.constants = dict(zip(idx, checked))
        self.padded = {} if self.own_way else {i: art._pad(i, x)
                                               for i, x in self.constants.items()}
        self.packed = {i: art._pack(i, x) for i, x in self.padded.items()}
        self.free = [i for i in range(len(ins)) if i not in idx]
        b = art.ctx.input_index("B") if art.ctx.unsigned_a else None
        self.comp = art._compensation(self.padded) if b in self.padded else None
        self.prep_seconds = time.perf_counter() - t0

    @property
    def inputs(self):
        """The tensors `__call__` takes, in order."""
        return [self.art.op.inputs[i] for i in self.free]

    def prepare(self, arrays) -> list[np.ndarray]:
        """The kernel's arguments for the free inputs `arrays` (padded, packed per call)."""
        art = self.art
        xs = dict(self.padded)
        xs.update({i: art._pad(i, x) for i, x in
                   zip(self.free, art.check_inputs(arrays, self.inputs))})
        packed = {**self.packed, **{i: art._pack(i, xs[i]) for i in self.free}}
        comp = self.comp if self.comp is not None else art._compensation(
            [xs[i] for i in range(len(xs))])
        return [packed[i] for i in range(len(packed))] + comp

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        if self.own_way:
            xs = dict(self.constants)
            xs.update(zip(self.free, arrays))
            return self.art.run(*[xs[i] for i in range(len(self.art.op.inputs))])
        return self.art.op.crop_output(self.art._execute(self.prepare(arrays)))
