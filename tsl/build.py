"""`tsl.build`: operator + schedule function + target -> artifact."""

from __future__ import annotations

import warnings
from typing import Callable

from . import model
from .backend import get_backend, resolve_target
from .errors import BackendUnavailable, ScheduleError
from .ops.operator import Operator
from .ops.sym import Family
from .primitives.schedule import Schedule
from .schedules import default_schedule
from .tam import Machine


def record(op: Operator, machine: Machine, fn: Callable | None = None,
           knobs: dict | None = None) -> Schedule:
    """Run schedule function `fn` (default: the operator's) on a new `Schedule` of `op` for
    `machine` and validate the final nest. Knobs not in `knobs` are the cost model's choice
    (`tsl.model.choose`). Raises ScheduleError when it does not fit."""
    if knobs is not None and not isinstance(knobs, dict):
        raise ScheduleError(f"knobs must be a dict of knob name -> value, got {knobs!r}")
    fn = fn or default_schedule(op.name)
    try:
        check = get_backend(machine.backend).check
    except BackendUnavailable:  # a schedule can be recorded for a back end not installed
        check = None
    try:
        s = model.record_fixed(op, machine, fn, knobs)
        if not set(s.space) - set(knobs or {}):
            if check is not None:
                check(s)
            return s
    except ScheduleError as e:
        # Unset knobs at their first choices may not fit where the model's choice does.
        try:
            return model.choose(op, machine, fn, knobs, check)
        except ScheduleError:
            raise e from None
    return model.choose(op, machine, fn, knobs, check)


def schedule(op: Operator, target: str | Machine = "cpu", schedule: Callable | None = None,
             knobs: dict | None = None) -> Schedule:
    """Record `schedule` (default: the operator's) for `op` on the target's machine, validated
    against it; nothing is lowered. Raises ScheduleError when it does not fit."""
    return record(op, resolve_target(target)[1], schedule, knobs)


def build(op: Operator, target: str | Machine = "cpu", schedule: Callable | None = None,
          knobs=None, **options):
    """Compile `op` for `target` with `schedule` (a function of a `tsl.Schedule`; default: the
    operator's default schedule) and `knobs`: values for the schedule's knobs, or a
    `tsl.tune.Database`, whose best record for (operator, machine, schedule) is used; with no
    record there, the schedule's defaults are, and a warning says so. A `Family` (an operator
    with `tsl.ops.sym` dims) builds once for its whole range: a `tsl.dynamic.DynamicArtifact`
    whose micro-kernels the cost model chooses (`knobs`: a dict fixes knobs in all of them)."""
    backend, machine = resolve_target(target)
    why = backend.unavailable(machine, backend.options(**options))
    if why:
        raise BackendUnavailable(f"cannot build for {machine.name} here: {why}")
    if isinstance(op, Family):
        return _build_family(op, backend, machine, schedule, knobs, options)
    if hasattr(knobs, "best_for"):
        knobs = tuned_knobs(knobs, op, machine, schedule or default_schedule(op.name))
    s = record(op, machine, schedule, knobs)
    s.as_written = schedule is not None or bool(knobs)
    return backend.build(s, **options)


def _build_family(fam: Family, backend, machine: Machine, fn, knobs, options):
    """A family (symbolic dims): micro-kernels over the symbol's range and a run-time
    dispatch (tsl.dynamic)."""
    from .dynamic import build_family

    if hasattr(knobs, "best_for"):
        # Tuning a family (one database entry for its range, #25 part 3) is not built yet.
        raise ScheduleError(f"{fam}: a tuning database has no entries for a family yet; "
                            f"build with the cost model's knobs (knobs=None) or tune and "
                            f"build fam.at(...) per value")
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
