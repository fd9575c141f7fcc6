"""Recording a schedule function into a validated `Schedule` (nothing lowered): what
`tsl.build`, the tuner, the dynamic builds and the bench start from."""

from __future__ import annotations

from typing import Callable

from . import model
from .backend import get_backend, resolve_target
from .errors import BackendUnavailable, ScheduleError
from .ops.operator import Operator
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
