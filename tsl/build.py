"""`tsl.build`: operator + schedule function + target -> artifact."""

from __future__ import annotations

import warnings
from typing import Callable

from .backend import resolve_target
from .ops.operator import Operator
from .ops.sym import Family
from .record import record
from .schedules import default_schedule
from .tam import Machine


def build(op: Operator, target: str | Machine = "cpu", schedule: Callable | None = None,
          knobs=None, **options):
    """Compile `op` for `target` with `schedule` (a function of a `tsl.Schedule`; default: the
    operator's default schedule) and `knobs`: values for the schedule's knobs, or a
    `tsl.tune.Database`, whose best record for (operator, machine, schedule) is used; with no
    record there, the schedule's defaults are, and a warning says so. A `Family` (an operator
    with `tsl.ops.sym` dims) builds once for its whole range: a `tsl.dynamic.DynamicArtifact`
    whose micro-kernels the cost model chooses (`knobs`: a dict fixes knobs in all of them;
    a database: the kernels `tsl.tune.tune(family, ...)` measured best, per range)."""
    backend, machine = resolve_target(target)
    backend.require(machine, backend.options(**options))  # before the model's knob search
    if isinstance(op, Family):
        return _build_family(op, backend, machine, schedule, knobs, options)
    return backend.build(recorded(op, machine, schedule, knobs), **options)


def recorded(op: Operator, machine: Machine, schedule: Callable | None = None, knobs=None):
    """The schedule `build` compiles: `schedule` (default: the operator's) recorded with
    `knobs` (values, or a database's best record for it), marked as written when either is
    given."""
    if hasattr(knobs, "best_for"):
        knobs = tuned_knobs(knobs, op, machine, schedule or default_schedule(op.name))
    s = record(op, machine, schedule, knobs)
    s.as_written = schedule is not None or bool(knobs)
    return s


def _build_family(fam: Family, backend, machine: Machine, fn, knobs, options):
    """A family (symbolic dims): micro-kernels over the symbol's range and a run-time
    dispatch (tsl.dynamic)."""
    from .dynamic import build_family

    if hasattr(knobs, "best_for_family"):
        db, fn = knobs, fn or default_schedule(fam.name)
        knobs = db.best_for_family(fam, machine, fn)
        if knobs is None:
            warnings.warn(f"tuning database {db.path} has no complete record for {fam} on "
                          f"{machine.name} with {fn.__module__}.{fn.__qualname__}: building "
                          f"with the cost model's knobs", stacklevel=3)
    return build_family(fam, backend, machine, fn, knobs, **options)


def tuned_knobs(db, op: Operator, machine: Machine, fn: Callable) -> dict | None:
    """The knobs of the best record in tuning database `db` (None, with a warning, when it has
    none for this operator, machine file and schedule function)."""
    best = db.best_for(op, machine, fn)
    if best is None:
        warnings.warn(f"tuning database {db.path} has no successful record for {op} on "
                      f"{machine.name} with {fn.__module__}.{fn.__qualname__}: building with "
                      f"the schedule's default knobs", stacklevel=3)
        return None
    return best.knobs
