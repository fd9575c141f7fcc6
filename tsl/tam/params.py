"""A machine file's [params] table as typed data: each back end declares a frozen `Params`
dataclass (in its own package, `tsl/backends/<name>/machine.py`) whose fields carry their unit
in their name (`hbm_bytes_per_s`, `barrier_cycles`), as JAX Pallas' `TpuInfo` does. The loader
checks a file's [params] against the class of the file's back end: an unknown key, a missing
required key or a value of the wrong type is a TAMError naming the file, the key and the valid
keys.

This layer names no back end: the back-end registry (`tsl.backend`, a layer above) tells the
loader which class a back end declares through `set_finder`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Callable


@dataclasses.dataclass(frozen=True, kw_only=True)
class Params:
    """What the default schedules read on any machine (each back end's class adds its own).

    pipeline_stages: the deepest software pipeline the back end's movers keep in flight (2:
    double buffering).
    split_k: the reduction splits a GEMM schedule may choose (partial sums summed after by a
    second kernel); empty: the back end does not split reductions.
    """

    pipeline_stages: int = 2
    split_k: tuple[int, ...] = ()

    def changed(self) -> dict:
        """The fields that differ from their defaults (what a machine file must write)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                out[f.name] = v
            elif v != (f.default if f.default is not dataclasses.MISSING
                       else f.default_factory()):
                out[f.name] = v
        return out


_finder: Callable[[str], type[Params] | None] | None = None


def set_finder(finder: Callable[[str], type[Params] | None]) -> None:
    """Install how a back end's name maps to its `Params` class (None: no such back end)."""
    global _finder
    _finder = finder


def params_class(backend: str) -> type[Params] | None:
    """The `Params` class of `backend`; None when no back end of that name is known."""
    return _finder(backend) if _finder is not None else Params


def parse(cls: type[Params], raw: Mapping, where: Callable[[str | None, str], Exception]):
    """`raw` (a [params] table) as an instance of `cls`; `where(key, msg)` makes the error."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    valid = f"valid keys are {sorted(fields)}"
    unknown = [k for k in raw if k not in fields]
    if unknown:
        raise where(unknown[0], f"unknown key for a {cls.__name__}; {valid}")
    missing = [k for k, f in fields.items() if k not in raw
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise where(None, f"key(s) {missing} missing (required for a {cls.__name__}); {valid}")
    out = {}
    for key, val in raw.items():
        try:
            out[key] = _convert(hints[key], val)
        except (TypeError, ValueError) as e:
            raise where(key, str(e)) from None
    return cls(**out)


def _convert(hint, v):
    """`v` read from TOML as type `hint` (lists become tuples so that machines stay frozen)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):  # `X | None`: TOML has no None to give
        return _convert(next(a for a in args if a is not type(None)), v)
    if origin is tuple:
        if not isinstance(v, list):
            raise TypeError(f"expected a list, got {v!r}")
        return tuple(_convert(args[0], x) for x in v)
    if origin in (dict, Mapping):
        if not isinstance(v, dict):
            raise TypeError(f"expected a table, got {v!r}")
        return {_convert(args[0], k): _convert(args[1], x) for k, x in v.items()}
    if hint in (dict, list):  # a nested table its back end's reader checks itself
        if not isinstance(v, hint):
            raise TypeError(f"expected a {'table' if hint is dict else 'list'}, got {v!r}")
        return v
    if hint is bool:
        if not isinstance(v, bool):
            raise TypeError(f"expected true or false, got {v!r}")
        return v
    if hint is float and isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if hint in (int, str) and isinstance(v, hint) and not isinstance(v, bool):
        return v
    raise TypeError(f"expected {getattr(hint, '__name__', hint)}, got {v!r}")
