"""What a tuning record is keyed by: the operator's signature, the machine file's hash, the
schedule function's name and the hash of its source with tsl's version (`Key`)."""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..ops.operator import Operator
from ..tam import Machine


def signature(op: Operator) -> str:
    """A stable text key for an operator: everything that changes its code or its time."""
    extra = " ".join(f"{k}={_plain(v)}" for k, v in sorted(op.params.items()) if k != "shape")
    steps = "+".join(s.kind + ("(" + ",".join(map(str, s.value)) + ")" if s.value else "")
                     for s in op.epilogue.steps)
    return " ".join(x for x in (op.name, op.shape_str, op.dtype, f"acc={op.acc_dtype}", extra,
                                f"epilogue={steps}" if steps else "",
                                f"out={op.out_dtype}") if x)


def machine_hash(machine: Machine) -> str:
    """First 12 hex digits of the SHA-256 of the machine's file (of its fields when it was
    built in Python)."""
    if machine.source and Path(machine.source).is_file():
        p = Path(machine.source)
        return _file_hash(str(p.resolve()), p.stat().st_mtime_ns)
    return hashlib.sha256(repr(machine).encode()).hexdigest()[:12]


@cache
def _file_hash(path: str, _mtime_ns: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def schedule_name(fn) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def schedule_hash(fn) -> str:
    """First 12 hex digits of the SHA-256 of the schedule function's source and tsl's version
    (a function without source, defined at a prompt: of its byte code and constants)."""
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        text = repr((fn.__code__.co_code, fn.__code__.co_consts))
    return hashlib.sha256(f"{versions()['tsl']}\n{text}".encode()).hexdigest()[:12]


def knobs_key(knobs: dict) -> str:
    return json.dumps(knobs, sort_keys=True)


@dataclass(frozen=True)
class Key:
    op: str
    machine: str
    machine_hash: str
    schedule: str
    schedule_hash: str = ""

    @classmethod
    def of(cls, op: Operator, machine: Machine, schedule_fn) -> "Key":
        return cls(signature(op), machine.name, machine_hash(machine), schedule_name(schedule_fn),
                   schedule_hash(schedule_fn))


@cache
def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    from .. import __version__

    out = {"tsl": __version__}
    try:
        out["tvm"] = version("apache-tvm")
    except PackageNotFoundError:
        out["tvm"] = "unknown"
    return out


def _plain(v):
    if isinstance(v, (list, tuple)):
        return "x".join(map(str, v)) if all(isinstance(x, int) for x in v) else list(v)
    if hasattr(v, "item"):  # NumPy scalars
        return v.item()
    return v
