"""A Machine back to TOML, in the layout `loader.py` reads (used by `python -m tsl.backends.cpu probe`)."""

from __future__ import annotations

import dataclasses
import re

from .machine import Machine

_TABLES = (("compute", "compute"), ("memory", "memory"), ("primitive", "primitives"),
           ("mover", "movers"), ("vector", "vectors"))
_SKIP = {"memory": {"instances": 1}, "primitive": {"issued_by": None, "instruction": "",
                                                    "intrinsic": "", "layout_a": "mk",
                                                    "scratch": 0}}


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {v!r} to TOML")


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _value(k)


def dumps(m: Machine, header: str = "") -> str:
    """TOML text that `tsl.tam.load` reads back into a Machine equal to `m` (but `source`
    and `notes`)."""
    lines = [f"# {ln}".rstrip() for ln in header.splitlines()] + [""] if header else []
    lines += ["[machine]", f"name = {_value(m.name)}", f"backend = {_value(m.backend)}",
              f"clock_hz = {m.clock_hz!r}", f"description = {_value(m.description)}", ""]
    params = {k: v for k, v in m.params.changed().items() if v is not None}
    if params:
        lines += ["[params]"] + [f"{k} = {_value(v)}" for k, v in params.items()] + [""]
    if m.sources:
        lines += ["[sources]"] + [f"{_key(k)} = {_value(v)}" for k, v in m.sources.items()] + [""]
    if m.peaks:
        lines += ["[peaks]"] + [f"{k} = {v!r}" for k, v in m.peaks.items()] + [""]
    for table, attr in _TABLES:
        for obj in getattr(m, attr):
            lines.append(f"[[{table}]]")
            for f in dataclasses.fields(obj):
                v = getattr(obj, f.name)
                if v is None or _SKIP.get(table, {}).get(f.name, object()) == v:
                    continue
                lines.append(f"{f.name} = {_value(v)}")
            lines.append("")
    return "\n".join(lines)
