"""Where a family's symbol shows in its tensors, read off two concrete operators.

A family's operator is defined once (tsl.ops), so which input dims and which output dims grow
with the symbol is not restated here: it is found by building the family at two values and
comparing shapes. The same comparison says whether the symbol's values can be cut in chunks
(rows of a GEMM, images of a batch: output rows that depend on input rows only) or only padded
(a symbol in a reduction, or in several axes, or a window dim with a halo).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError, ScheduleError
from ..ops.sym import Family, Sym


@dataclass(frozen=True)
class Dims:
    """For each input (and the output): the dims whose extent follows the symbol."""

    symbol: Sym
    inputs: tuple[tuple[int, ...], ...]
    output: tuple[int, ...]
    chunk_axis: str | None  # the operator axis values can be cut along (None: pad only)
    axes: tuple[str, ...]  # the operator axes whose extent follows the symbol
    plain: bool  # every such axis, and every dim that follows, has extent == the value
    probe: tuple[int, int, int, int]  # (input, dim, its extent at the upper bound, per value)

    def varies(self, i: int) -> bool:
        return bool(self.inputs[i])

    def chunk_dim(self, i: int | None) -> int:
        """The dim of input `i` (None: the output) that a chunk cuts."""
        dims = self.output if i is None else self.inputs[i]
        return dims[0]


def _changed(a: tuple, b: tuple) -> tuple[int, ...]:
    return tuple(d for d, (x, y) in enumerate(zip(a, b)) if x != y)


def symbol_of(fam: Family) -> Sym:
    syms = list(fam.syms.values())
    if len(syms) != 1:
        raise ScheduleError(f"{fam}: a shape-generic build takes one symbolic dim, this family "
                            f"has {[str(s) for s in syms]}; bind the others with "
                            f"fam.at(...) or give them one symbol")
    return syms[0]


def dims_of(fam: Family) -> Dims:
    """Which dims follow the symbol; chunkable when it sets exactly one non-reduction axis of
    extent == the value, every tensor that changes changes in one dim of extent == the value,
    and a tile of one value touches one entry of that dim (no window halo)."""
    sym = symbol_of(fam)
    lo, hi = (max(1, sym.upper - 1), sym.upper) if sym.upper > 1 else (1, 1)
    a, b = fam.at(**{sym.name: lo}), fam.at(**{sym.name: hi})
    ins = tuple(_changed(x.shape, y.shape) for x, y in zip(a.inputs, b.inputs))
    out = _changed(a.output.shape, b.output.shape)
    axes = [ax for ax, bx in zip(a.axes, b.axes) if ax.extent != bx.extent]
    chunk = None
    if len(axes) == 1 and axes[0].role != "k" and len(out) == 1 \
            and all(len(d) <= 1 for d in ins) \
            and all(t.shape[d[0]] == lo for t, d in zip(a.inputs, ins) if d) \
            and a.output.shape[out[0]] == lo and _no_halo(a, axes[0].name):
        chunk = axes[0].name
    i = next((n for n, d in enumerate(ins) if d), None)
    if i is None:
        raise ScheduleError(f"{fam}: no input follows symbol {sym.name}")
    d = ins[i][0]
    up = b.inputs[i].shape[d]
    plain = all(ax.extent == lo for ax in axes) \
        and all(t.shape[k] == lo for t, dd in zip(a.inputs, ins) for k in dd) \
        and all(a.output.shape[k] == lo for k in out)
    return Dims(sym, ins, out, chunk, tuple(ax.name for ax in axes), plain,
                (i, d, up, max(1, up - a.inputs[i].shape[d])))


def _no_halo(op, axis: str) -> bool:
    """A tile of one step of `axis` reads one entry of A's dim along it (not a window)."""
    ext = {ax.name: (1 if ax.name == axis else ax.extent) for ax in op.axes}
    return all(t == 1 for ax, t, _ in op.tile_shape("A", ext) if ax == axis)


def value_of(fam: Family, dims: Dims, arrays) -> int:
    """The symbol's value the arrays are at, read from the probe dim (the caller checks every
    shape against the operator at that value)."""
    i, d, up, step = dims.probe
    x = np.asarray(arrays[i]) if i < len(arrays) else None
    if x is None or x.ndim <= d:
        raise InputError(f"{fam} takes {len(dims.inputs)} arrays of the operator's ranks; got "
                         f"{[np.shape(a) for a in arrays]}")
    v, rem = divmod(x.shape[d] - up, step)
    if rem:
        raise InputError(f"{fam}: input {i} has {x.shape[d]} along dim {d}, which no value of "
                         f"{dims.symbol.name} gives")
    return dims.symbol.check(int(dims.symbol.upper + v))
