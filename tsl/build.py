"""`tsl.build`: operator + schedule function + target -> artifact."""

from __future__ import annotations

from typing import Callable

from .backend import resolve_target
from .errors import BackendUnavailable
from .ops.operator import Operator
from .primitives.schedule import Schedule
from .schedules import default_schedule
from .tam import Machine


def record(op: Operator, machine: Machine, fn: Callable | None = None,
           knobs: dict | None = None) -> Schedule:
    """Run schedule function `fn` (default: the operator's) on a new `Schedule` of `op` for
    `machine` and validate the final nest. Raises ScheduleError when it does not fit."""
    s = Schedule(op, machine, knobs)
    (fn or default_schedule(op.name))(s)
    s.validate()
    return s


def schedule(op: Operator, target: str | Machine = "cpu", schedule: Callable | None = None,
             knobs: dict | None = None) -> Schedule:
    """Record `schedule` (default: the operator's) for `op` on the target's machine, validated
    against it; nothing is lowered. Raises ScheduleError when it does not fit."""
    return record(op, resolve_target(target)[1], schedule, knobs)


def build(op: Operator, target: str | Machine = "cpu", schedule: Callable | None = None,
          knobs: dict | None = None, **options):
    """Compile `op` for `target` with `schedule` (a function of a `tsl.Schedule`; default: the
    operator's default schedule) and `knobs` (values for the schedule's knobs)."""
    backend, machine = resolve_target(target)
    why = backend.unavailable(machine, **options)
    if why:
        raise BackendUnavailable(f"cannot build for {machine.name} here: {why}")
    return backend.build(record(op, machine, schedule, knobs), **options)
