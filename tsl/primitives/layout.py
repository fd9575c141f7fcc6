"""Blocked layouts: how `pack` stores an operand, as one object that gives both the TIR index
map (for `transform_layout`) and the NumPy transform the artifact applies to user arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Blocked:
    """`order` lists the stored dimensions outer to inner as (dim, part): part "o" is
    index // block (the whole index for an unsplit dim), part "i" is index % block.

    ``Blocked({1: 16}, ((1, "o"), (0, "o"), (1, "i")))`` stores B[k, n] as B[n//16, k, n%16].
    """

    blocks: dict
    order: tuple

    def index_map(self, *idx):
        out = []
        for d, part in self.order:
            b = self.blocks.get(d)
            out.append(idx[d] if b is None else (idx[d] // b if part == "o" else idx[d] % b))
        return tuple(out)

    def shape(self, shape) -> tuple[int, ...]:
        return tuple((shape[d] if d not in self.blocks else
                      (shape[d] // self.blocks[d] if part == "o" else self.blocks[d]))
                     for d, part in self.order)

    def apply(self, x: np.ndarray) -> np.ndarray:
        """Pack a NumPy array (dims divisible by their blocks: the operator is padded first)."""
        return np.ascontiguousarray(self.view(x))

    def view(self, x: np.ndarray) -> np.ndarray:
        """`apply` as a strided view of x (no copy): what a caller assigns into a buffer of
        the packed shape it already has."""
        split_shape, names = [], []
        for d, n in enumerate(x.shape):
            if d in self.blocks:
                split_shape += [n // self.blocks[d], self.blocks[d]]
                names += [(d, "o"), (d, "i")]
            else:
                split_shape.append(n)
                names.append((d, "o"))
        return x.reshape(split_shape).transpose([names.index(o) for o in self.order])

    def is_identity(self) -> bool:
        return not self.blocks and [d for d, _ in self.order] == sorted(d for d, _ in self.order)
