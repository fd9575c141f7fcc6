"""Loading a Machine from TOML, with validation that names the file, the table and the key.

File format (every machine file in `machines/` is an example)::

    [machine]        name, backend, clock_hz, description, extends
    [params]         back-end parameters: the fields of the back end's `Params` class
    [sources]        what = where it comes from (and what the file does not model)
    [peaks]          dtype = operations per second
    [[compute]]      name, role, count, bind, virtual, launch_cycles
    [[memory]]       name, role, capacity, holds, parent, instances, per, bandwidth, alignment, managed
    [[primitive]]    name, kind, m, n, k, a_dtype, b_dtype, acc_dtype, a_level, b_level, c_level,
                     layout_a, layout_b, macs_per_cycle, latency, issued_by, instruction,
                     intrinsic, scratch
    [[mover]]        name, src, dst, dims, padding, bytes_per_cycle, store_bytes_per_cycle,
                     unpacked_bytes_per_cycle, latency
    [[vector]]       name, level, lanes, ops, dtypes, ops_per_cycle

Capacities are integers of bytes or strings such as "32 KiB". A memory level's parent defaults
to the level listed before it.

`extends = "<machine>"` (a built-in name, or a path relative to the file) starts from that file:
the tables' keys are merged (the extending file's win); an entry of an array of tables
replaces the keys of the inherited entry of the same `name`, or of the one its `replaces =
"<name>"` names (taking its place in the order); an entry of a new name is appended.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

from ..errors import TAMError
from .capabilities import Capabilities
from .params import Params, params_class, parse
from .machine import (COMPUTE_ROLES, DTYPES, MEMORY_ROLES, OPERANDS, PRIMITIVE_KINDS,
                      ComputeLevel, Machine, MemoryLevel, Mover, TensorPrimitive, VectorUnit)

BUILTIN_DIR = Path(__file__).parent / "machines"
CAPABILITIES = tuple(f.name for f in dataclasses.fields(Capabilities))
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6,
          "GB": 10**9}


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))


def resolve(name_or_path: str | Path) -> Path:
    if not isinstance(name_or_path, (str, Path)):
        raise TAMError(f"a machine is a built-in name, the path of a .toml file or a Machine; "
                       f"got {name_or_path!r}")
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        if not p.is_file():
            raise TAMError(f"{p}: no such machine file")
        return p
    q = BUILTIN_DIR / f"{name_or_path}.toml"
    if not q.exists():
        raise TAMError(f"unknown machine {str(name_or_path)!r}: built-in machines are "
                       f"{builtin_names()}, or pass the path of a .toml file")
    return q


def load(name_or_path: str | Path) -> Machine:
    path = resolve(name_or_path)
    return _Parser(path).machine(_read(path, ()))


_ARRAYS = ("compute", "memory", "primitive", "mover", "vector")


def _read(path: Path, seen: tuple[Path, ...]) -> dict:
    """The TOML of `path` with what it `extends` merged in (module docstring)."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise TAMError(f"{path}: not valid TOML: {e}") from None
    head = data.get("machine")
    if not isinstance(head, dict) or "extends" not in head:
        return data
    base = head.pop("extends")
    if not isinstance(base, str):
        raise TAMError(f"{path.name}: [machine] key 'extends': expected a machine name, got "
                       f"{base!r}")
    rel = path.parent / base
    parent = rel if rel.suffix == ".toml" and rel.is_file() else resolve(base)
    if parent.resolve() in seen:
        raise TAMError(f"{path.name}: [machine] key 'extends': {base!r} extends this file "
                       f"again (a cycle)")
    return _merge(_read(parent, (*seen, path.resolve())), data, path)


def _merge(base: dict, over: dict, path: Path) -> dict:
    out = dict(base)
    for key, val in over.items():
        if key in _ARRAYS and isinstance(val, list) and isinstance(base.get(key), list):
            out[key] = _merge_array(base[key], val, key, path)
        elif isinstance(val, dict) and isinstance(base.get(key), dict):
            out[key] = _merge(base[key], val, path)
        else:
            out[key] = val
    return out


def _merge_array(base: list, over: list, table: str, path: Path) -> list:
    out = [dict(e) for e in base]
    for entry in over:
        entry = dict(entry)
        target = entry.pop("replaces", entry.get("name"))
        at = [i for i, e in enumerate(out) if e.get("name") == target]
        if at:
            out[at[0]] = {**out[at[0]], **entry}
        elif target != entry.get("name"):
            raise TAMError(f"{path.name}: [[{table}]] {entry.get('name')!r} key 'replaces': "
                           f"the machine it extends has no {table} named {target!r}")
        else:
            out.append(entry)
    return out


class _Parser:
    def __init__(self, path: Path):
        self.path = path

    def err(self, table: str, key: str | None, msg: str) -> TAMError:
        where = f"[{table}]" + (f" key '{key}'" if key else "")
        return TAMError(f"{self.path.name}: {where}: {msg}")

    def fields(self, table: str, raw: Any, cls, conv: dict[str, Any]) -> dict:
        """Check keys of one table against `cls`'s fields and convert each value."""
        if not isinstance(raw, dict):
            raise self.err(table, None, "must be a table")
        names = {f.name: f for f in dataclasses.fields(cls)}
        out = {}
        for key, val in raw.items():
            if key not in conv:
                raise self.err(table, key, f"unknown key; allowed keys are {sorted(conv)}")
            try:
                out[key] = conv[key](val)
            except (TypeError, ValueError) as e:
                raise self.err(table, key, str(e)) from None
        for key, f in names.items():
            required = (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            if key in conv and required and key not in out:
                raise self.err(table, key, "missing (required)")
        return out

    def machine(self, data: dict) -> Machine:
        known = {"machine", "params", "sources", "peaks", "compute", "memory", "primitive",
                 "mover", "vector"}
        for key in data:
            if key not in known:
                raise self.err(key, None, f"unknown table; allowed tables are {sorted(known)}")
        if "machine" not in data:
            raise self.err("machine", None, "missing (required)")
        head = self.fields("machine", data["machine"], Machine,
                           {"name": _str, "backend": _str, "clock_hz": _pos_float,
                            "description": _str})
        params = self.params(head["backend"], data.get("params", {}))
        sources = self.sources(data.get("sources", {}))
        peaks = {}
        for key, val in data.get("peaks", {}).items():
            if key not in DTYPES:
                raise self.err("peaks", key, f"unknown dtype; known dtypes are {sorted(DTYPES)}")
            try:
                peaks[key] = _pos_float(val)
            except (TypeError, ValueError) as e:
                raise self.err("peaks", key, str(e)) from None
        compute = tuple(self.compute(i, c) for i, c in enumerate(self.array(data, "compute")))
        if not compute:
            raise self.err("compute", None, "a machine needs at least one [[compute]] level")
        memory = self.memory(self.array(data, "memory"), compute)
        names = {m.name for m in memory}
        prims = tuple(self.primitive(i, p, names, compute)
                      for i, p in enumerate(self.array(data, "primitive")))
        movers = tuple(self.mover(i, m, names) for i, m in enumerate(self.array(data, "mover")))
        vectors = tuple(self.vector(i, v, names) for i, v in enumerate(self.array(data, "vector")))
        return Machine(compute=compute, memory=memory, primitives=prims, movers=movers,
                       vectors=vectors, peaks=peaks, params=params, sources=sources,
                       source=str(self.path), **head)

    def params(self, backend: str, raw: Any) -> Params:
        if not isinstance(raw, dict):
            raise self.err("params", None, "must be a table")
        cls = params_class(backend)
        if cls is None:
            raise self.err("machine", "backend", f"no back end named {backend!r} is installed")
        return parse(cls, raw, lambda key, msg: self.err("params", key, msg) if key else
                     TAMError(f"{self.path.name}: [params] {msg}"))

    def sources(self, raw: Any) -> dict[str, str]:
        """[sources]: free keys (what), each a string (where from)."""
        if not isinstance(raw, dict):
            raise self.err("sources", None, "must be a table")
        for key, val in raw.items():
            if not isinstance(val, str):
                raise self.err("sources", key, f"expected a string, got {val!r}")
        return dict(raw)

    def array(self, data: dict, table: str) -> list:
        val = data.get(table, [])
        if not isinstance(val, list):
            raise self.err(table, None, f"must be an array of tables ([[{table}]])")
        return val

    def compute(self, i: int, raw: Any) -> ComputeLevel:
        t = f"compute #{i}"
        kw = self.fields(t, raw, ComputeLevel, {"name": _str, "role": _choice(COMPUTE_ROLES),
                                                "count": _pos_int, "bind": _str,
                                                "virtual": _bool,
                                                "launch_cycles": _nonneg_float})
        return ComputeLevel(**kw)

    def memory(self, raws: list, compute) -> tuple[MemoryLevel, ...]:
        if not raws:
            raise self.err("memory", None, "a machine needs at least one [[memory]] level")
        out: list[MemoryLevel] = []
        cnames = {c.name for c in compute}
        for i, raw in enumerate(raws):
            t = f"memory #{i}"
            kw = self.fields(t, raw, MemoryLevel, {
                "name": _str, "role": _choice(MEMORY_ROLES), "capacity": _bytes,
                "holds": _operands, "parent": _str, "instances": _pos_int, "per": _str,
                "bandwidth": _nonneg_float, "alignment": _pos_int, "managed": _bool})
            t = f"memory {kw['name']!r}"
            if any(m.name == kw["name"] for m in out):
                raise self.err(t, "name", "duplicate memory level name")
            if kw.get("per") is not None and kw["per"] not in cnames:
                raise self.err(t, "per", f"names no compute level; compute levels are {sorted(cnames)}")
            if "parent" not in kw and out:
                kw["parent"] = out[-1].name
            level = MemoryLevel(**kw)
            if level.parent is not None:
                parents = [m for m in out if m.name == level.parent]
                if not parents:
                    raise self.err(t, "parent", f"{level.parent!r} is not a memory level listed "
                                   f"before this one; levels so far: {[m.name for m in out]}")
                if level.capacity > parents[0].capacity:
                    raise self.err(t, "capacity", f"{level.capacity} bytes is larger than its "
                                   f"parent {parents[0].name!r} ({parents[0].capacity} bytes)")
            out.append(level)
        if out[0].role != "global":
            raise self.err(f"memory {out[0].name!r}", "role", "the first (outermost) memory "
                           "level must have role 'global'")
        return tuple(out)

    def primitive(self, i: int, raw: Any, levels: set[str], compute) -> TensorPrimitive:
        t = f"primitive #{i}"
        kw = self.fields(t, raw, TensorPrimitive, {
            "name": _str, "kind": _choice(PRIMITIVE_KINDS), "m": _pos_int, "n": _pos_int,
            "k": _pos_int, "a_dtype": _dtype, "b_dtype": _dtype, "acc_dtype": _dtype,
            "a_level": _str, "b_level": _str, "c_level": _str, "layout_a": _str,
            "layout_b": _str, "macs_per_cycle": _nonneg_float, "latency": _pos_int,
            "issued_by": _str, "instruction": _str, "intrinsic": _str, "scratch": _bytes0})
        t = f"primitive {kw['name']!r}"
        for key in ("a_level", "b_level", "c_level"):
            if kw[key] not in levels:
                raise self.err(t, key, f"names memory level {kw[key]!r}, which this machine "
                               f"does not have; levels are {sorted(levels)}")
        if "issued_by" in kw and kw["issued_by"] not in {c.name for c in compute}:
            raise self.err(t, "issued_by", "names no compute level")
        return TensorPrimitive(**kw)

    def mover(self, i: int, raw: Any, levels: set[str]) -> Mover:
        # Keys machine files used to carry: say where they went rather than "unknown key".
        moved = [k for k in CAPABILITIES if isinstance(raw, dict) and k in raw]
        if moved:
            raise self.err(f"mover #{i}", moved[0], "is a codegen capability its back end "
                           "declares (Backend.capabilities), not a machine fact: remove it")
        kw = self.fields(f"mover #{i}", raw, Mover, {
            "name": _str, "src": _str, "dst": _str, "dims": _pos_int, "padding": _bool,
            "bytes_per_cycle": _nonneg_float, "store_bytes_per_cycle": _nonneg_float,
            "unpacked_bytes_per_cycle": _nonneg_float, "latency": _nonneg_int})
        for key in ("src", "dst"):
            if kw[key] not in levels:
                raise self.err(f"mover {kw['name']!r}", key,
                               f"names memory level {kw[key]!r}, which this machine does not have")
        return Mover(**kw)

    def vector(self, i: int, raw: Any, levels: set[str]) -> VectorUnit:
        kw = self.fields(f"vector #{i}", raw, VectorUnit, {
            "name": _str, "level": _str, "lanes": _pos_int, "ops": _strs, "dtypes": _dtypes,
            "ops_per_cycle": _nonneg_float})
        if kw["level"] not in levels:
            raise self.err(f"vector {kw['name']!r}", "level",
                           f"names memory level {kw['level']!r}, which this machine does not have")
        return VectorUnit(**kw)


# -- value converters: each raises ValueError/TypeError with a sentence -----------------------
def _str(v):
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {v!r}")
    return v


def _strs(v):
    if not isinstance(v, list):
        raise TypeError(f"expected a list of strings, got {v!r}")
    return tuple(_str(x) for x in v)


def _bool(v):
    if not isinstance(v, bool):
        raise TypeError(f"expected true or false, got {v!r}")
    return v


def _num(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"expected a number, got {v!r}")
    return v


def _pos_int(v):
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"expected a positive integer, got {v!r}")
    return v


def _nonneg_int(v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"expected a non-negative integer, got {v!r}")
    return v


def _pos_float(v):
    if _num(v) <= 0:
        raise ValueError(f"expected a positive number, got {v!r}")
    return float(v)


def _nonneg_float(v):
    if _num(v) < 0:
        raise ValueError(f"expected a non-negative number, got {v!r}")
    return float(v)


def _bytes(v):
    if isinstance(v, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)\s*", v)
        if not m:
            raise ValueError(f"expected bytes as an integer or like '32 KiB', got {v!r}")
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    return _pos_int(v)


def _bytes0(v):
    return 0 if v == 0 else _bytes(v)


def _choice(options):
    def conv(v):
        if v not in options:
            raise ValueError(f"expected one of {list(options)}, got {v!r}")
        return v
    return conv


def _dtype(v):
    if v not in DTYPES:
        raise ValueError(f"unknown dtype {v!r}; known dtypes are {sorted(DTYPES)}")
    return v


def _dtypes(v):
    return tuple(_dtype(x) for x in _strs(v))


def _operands(v):
    ops = _strs(v)
    for o in ops:
        if o not in OPERANDS:
            raise ValueError(f"unknown operand {o!r}; operands are {list(OPERANDS)}")
    return ops
