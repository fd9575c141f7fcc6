"""Symbolic dimensions and operator families (issue #25, step 1).

`sym("m", upper=2048)` names a dimension known only at run time, with the upper bound every
back end needs to size buffers and pick micro-kernels. An operator built with one or more `Sym`
dims is a `Family`: it is not compiled by itself here; `family.at(m=100)` gives the concrete
`Operator` at one value (its TE, reference and checks are the static operator's), and the
family's `reference` / `random_inputs(m=...)` work at any value in range, so a dynamic artifact
can be verified at every M it will see.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import InputError, ScheduleError


@dataclass(frozen=True)
class Sym:
    """A dimension bound at run time: 1 <= value <= `upper`."""

    name: str
    upper: int

    def check(self, value) -> int:
        """`value` as an int, or an InputError naming this dim and its range."""
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) \
                or not 1 <= value <= self.upper:
            raise InputError(f"{self.name}={value!r}: must be an integer in [1, {self.upper}] "
                             f"(the upper bound given to tsl.ops.sym)")
        return int(value)

    def __str__(self) -> str:
        return f"{self.name}<={self.upper}"


def sym(name: str, upper: int | None = None) -> Sym:
    """A symbolic dimension; `upper` (a positive int) is required: buffers and the choice of
    micro-kernels are sized from it."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ScheduleError(f"sym(name={name!r}): the name must be an identifier such as 'm'")
    if upper is None:
        raise ScheduleError(f"sym({name!r}): give upper=<the largest value {name} takes>; "
                            f"a dimension without an upper bound cannot be scheduled")
    if not isinstance(upper, (int, np.integer)) or isinstance(upper, bool) or upper <= 0:
        raise ScheduleError(f"sym({name!r}, upper={upper!r}): upper must be a positive integer")
    return Sym(name, int(upper))


def syms_in(dims: dict) -> dict[str, Sym]:
    """The symbolic dims among `dims` (parameter name -> value), by symbol name; one symbol may
    stand for several parameters but its bound must then agree."""
    out: dict[str, Sym] = {}
    for v in dims.values():
        if isinstance(v, Sym):
            if v.name in out and out[v.name] != v:
                raise ScheduleError(f"symbol {v.name!r} used with two upper bounds: "
                                    f"{out[v.name].upper} and {v.upper}")
            out[v.name] = v
    return out


@dataclass(frozen=True)
class Family:
    """An operator with symbolic dims: one Operator per binding of its symbols.

    `make(**dims)` is the operator's own constructor with the symbols replaced by ints, so a
    family never re-implements an operator's definition."""

    name: str
    dims: dict            # parameter -> int | Sym, as the user passed them
    make: Callable = field(repr=False, compare=False)

    @property
    def syms(self) -> dict[str, Sym]:
        return syms_in(self.dims)

    def bind(self, **values) -> dict[str, int]:
        """Every symbol's value, checked against its bound; a missing or unknown one is an
        InputError naming it."""
        syms = self.syms
        unknown = sorted(set(values) - set(syms))
        missing = sorted(set(syms) - set(values))
        if unknown or missing:
            raise InputError(f"{self}: give a value for each of {sorted(syms)}"
                             + (f"; missing {missing}" if missing else "")
                             + (f"; unknown {unknown}" if unknown else ""))
        return {k: s.check(values[k]) for k, s in syms.items()}

    def at(self, **values):
        """The concrete Operator with each symbol bound (e.g. `fam.at(m=100)`)."""
        bound = self.bind(**values)
        return self.make(**{p: bound[v.name] if isinstance(v, Sym) else v
                            for p, v in self.dims.items()})

    def upper(self):
        """The operator at every symbol's upper bound (the largest buffers the family needs)."""
        return self.at(**{k: s.upper for k, s in self.syms.items()})

    def reference(self, *arrays: np.ndarray, **values) -> np.ndarray:
        return self.at(**values).reference(*arrays)

    def random_inputs(self, seed: int = 0, **values) -> list[np.ndarray]:
        """Random non-zero inputs at the given symbol values (`random_inputs(m=5)`)."""
        return self.at(**values).random_inputs(seed)

    def __str__(self) -> str:
        return f"{self.name}(" + ", ".join(f"{k}={v}" for k, v in self.dims.items()) + ")"


def symbolic(fn):
    """Lets an operator constructor take `Sym` dims: called with any, it returns the `Family`
    whose `at(...)` calls `fn` with ints; called with none, it is `fn` itself."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        if not any(isinstance(v, Sym) for v in bound.arguments.values()):
            return fn(*args, **kwargs)
        dims = dict(bound.arguments)
        syms_in(dims)  # one bound per symbol, or a ScheduleError now
        fam = Family(fn.__name__, dims, fn)
        fam.upper()  # the operator's own checks (dtypes, dims) run once, at the largest value
        return fam
    return wrapper
