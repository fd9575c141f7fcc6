"""The tuning database: one JSON line per measurement, appended and synced as it is made.

    db = tsl.tune.Database("tuning.jsonl")
    tsl.tune.tune(op, "cpu", trials=64, database=db)   # measured configurations are not re-run
    art = tsl.build(op, "cpu", knobs=db)                # the best record for this key

A record's key is (operator signature, machine name, hash of the machine file, qualified name
of the schedule function, hash of its source and tsl's version): a machine file that changed,
another schedule, or the same schedule edited or run by another tsl starts afresh, and the
records that no longer apply are reported (a warning), not used.
Every record is written with append + flush + fsync, so a run killed at any moment loses at
most the measurement in flight; a truncated last line (the write that was cut) is skipped with
a warning when the file is read.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import InputError
from ..ops.operator import Operator
from ..tam import Machine
from .keys import (Key, _plain, knobs_key, machine_hash, schedule_hash,  # noqa: F401
                   schedule_name, signature, versions)

KINDS = ("seconds", "cycles", "model")  # timed on a device / simulated cycles / an estimate


@dataclass(frozen=True)
class Record:
    """One measurement. `value` is in units of `kind`; `seconds` is what ranks records (equal
    to `value` for "seconds" and "model", value / clock for "cycles"). A failed build or run
    has `error` set and no value."""

    op: str
    machine: str
    machine_hash: str
    schedule: str
    knobs: dict
    value: float | None
    kind: str
    seconds: float | None
    error: str | None = None
    device: str = "local"
    lost: bool = False  # the device went away mid-measurement: measured again on resume
    versions: dict = field(default_factory=dict)
    time: float = 0.0
    schedule_hash: str = ""  # "" in records written before the key had it: they never match

    @property
    def key(self) -> Key:
        return Key(self.op, self.machine, self.machine_hash, self.schedule, self.schedule_hash)

    @property
    def ok(self) -> bool:
        return self.error is None and self.seconds is not None and math.isfinite(self.seconds)


def make_record(key: Key, knobs: dict, value=None, kind="seconds", seconds=None, error=None,
                device="local", lost=False) -> Record:
    if kind not in KINDS:
        raise ValueError(f"record kind {kind!r} is not one of {KINDS}")
    return Record(key.op, key.machine, key.machine_hash, key.schedule, dict(knobs), value, kind,
                  seconds, error, device, lost, versions(), time.time(), key.schedule_hash)


class Database:
    """Append-only JSON-lines records, indexed by key in memory."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._by_key: dict[Key, list[Record]] = {}
        self._count = 0
        self._needs_newline = False
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        data = self.path.read_bytes()
        self._needs_newline = bool(data) and not data.endswith(b"\n")
        lines = data.split(b"\n")
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = Record(**json.loads(line))
            except (ValueError, TypeError) as e:
                where = ("its last line, cut short (a run killed while writing it?)"
                         if n >= len(lines) - 1 else f"line {n}, not a record")
                warnings.warn(f"tuning database {self.path}: skipped {where}: {e}", stacklevel=3)
                continue
            self._index(rec)

    def _index(self, rec: Record) -> None:
        self._by_key.setdefault(rec.key, []).append(rec)
        self._count += 1

    def add(self, rec: Record) -> None:
        """Append `rec` and make it durable before returning (flush + fsync)."""
        line = json.dumps(asdict(rec), default=_plain) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            if self._needs_newline:  # the cut line stays skipped; ours starts a new one
                f.write("\n")
                self._needs_newline = False
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self._index(rec)

    def __len__(self) -> int:
        return self._count

    def keys(self) -> list[Key]:
        return list(self._by_key)

    def records(self, key: Key | None = None) -> list[Record]:
        if key is not None:
            return list(self._by_key.get(key, ()))
        return [r for recs in self._by_key.values() for r in recs]

    def measured(self, key: Key) -> dict[str, Record]:
        """The latest record of each configuration measured for `key`. Failed ones count (a
        configuration that failed is not tried again), lost ones do not."""
        return {knobs_key(r.knobs): r for r in self._by_key.get(key, ()) if not r.lost}

    def best(self, key: Key) -> Record | None:
        ok = [r for r in self._by_key.get(key, ()) if r.ok]
        return min(ok, key=lambda r: r.seconds, default=None)

    def best_for(self, op: Operator, machine: Machine, schedule_fn) -> Record | None:
        """The best record for the key; records of the same schedule made from another source
        or tsl version are reported (a warning) and not used."""
        key = Key.of(op, machine, schedule_fn)
        self.report_stale(key)
        return self.best(key)

    def best_for_family(self, fam, machine: Machine, schedule_fn) -> dict | None:
        """A tuned family's measured kernels per range top (`tsl.tune.family.best_knobs`)."""
        from .family import best_knobs

        return best_knobs(self, fam, machine, schedule_fn)

    def report_stale(self, key: Key) -> None:
        """A warning naming the records `stale` finds for `key` (they are not used)."""
        stale = self.stale(key)
        if stale:
            hashes = sorted({r.schedule_hash or "(none)" for r in stale})
            warnings.warn(f"tuning database {self.path}: {len(stale)} records for {key.op} on "
                          f"{key.machine} with {key.schedule} were made by another source of "
                          f"the schedule or another tsl (schedule hash {', '.join(hashes)}, now "
                          f"{key.schedule_hash}); not used: tune again", stacklevel=4)

    def stale(self, key: Key) -> list[Record]:
        """Records of `key`'s operator, machine file and schedule name whose schedule hash is
        not `key`'s: the schedule function or tsl changed since they were measured."""
        return [r for k, recs in self._by_key.items()
                if k.schedule_hash != key.schedule_hash
                and (k.op, k.machine, k.machine_hash, k.schedule)
                == (key.op, key.machine, key.machine_hash, key.schedule) for r in recs]

    def model_path(self, machine: Machine, schedule_fn) -> Path:
        """Where the learned model for (machine, schedule) is saved, beside the database: it
        serves every operator of the schedule's family on that machine (transfer)."""
        name = f"{machine.name}-{machine_hash(machine)}-{schedule_name(schedule_fn)}.json"
        return self.path.with_name(self.path.name + ".models") / name


def as_database(db) -> Database:
    if isinstance(db, Database):
        return db
    if isinstance(db, (str, os.PathLike)):
        return Database(db)
    raise InputError(f"database must be a tsl.tune.Database or a path, got {type(db).__name__}")
