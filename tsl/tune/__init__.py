"""Knob search: the TAM's analytic model ranks candidates, measurements train an XGBoost model.

    result = tsl.tune.tune(op, "cpu", trials=24)
    art = tsl.build(op, "cpu", knobs=result.knobs)

Candidates are drawn from the schedule's own knob space and recorded without TVM (a candidate
that does not fit the machine raises ScheduleError and is dropped). The first measurements go
to the candidates the analytic model likes best; after that an XGBoost regressor, trained on the
analytic features of everything measured so far, picks each next batch. Measurement is the back
end's `measure(artifact)` (a measured time, simulated cycles, or the model where nothing here
runs the program).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..backend import resolve_target
from ..build import record as record_schedule
from ..errors import LoweringError, ScheduleError
from ..model import evaluate
from ..primitives.schedule import Schedule
from ..schedules import default_schedule


@dataclass
class TuneResult:
    knobs: dict
    seconds: float
    default_knobs: dict
    default_seconds: float
    log: list = field(default_factory=list)  # (knobs, analytic seconds, measured seconds)

    @property
    def speedup(self) -> float:
        return self.default_seconds / self.seconds

    def __str__(self) -> str:
        return (f"best {self.knobs}: {self.seconds * 1e3:.3f} ms, default "
                f"{self.default_seconds * 1e3:.3f} ms ({self.speedup:.2f}x), "
                f"{len(self.log)} measured")


def record(op, machine, schedule_fn, knobs) -> Schedule | None:
    """The recorded schedule, or None when it does not fit the machine."""
    try:
        return record_schedule(op, machine, schedule_fn, knobs)
    except ScheduleError:
        return None


def features(s: Schedule) -> list[float]:
    """Analytic features of a recorded schedule: padded work, tile shapes, and for every
    staged tile the bytes it moves into its level over the whole run."""
    m = s.machine
    padded = math.prod(s.padded_extents().values())
    moved = {lv.name: 0.0 for lv in m.memory}
    for st in s.stages:
        loads = math.prod(lp.extent for lp in s.loops[:s.loops.index(st.at) + 1])
        moved[st.level.name] += loads * st.bytes
    par = math.prod(lp.extent for lp in s.loops if lp.parallel)
    cores = m.cores()
    balance = par / (math.ceil(par / cores) * cores) if par else 1.0
    knob = [float(s.space[n].index(v)) if isinstance(v, (str, bool)) else float(v)
            for n, v in sorted(s.knob_values.items())]
    return [math.log2(padded), balance] + [math.log2(1 + moved[lv.name]) for lv in m.memory] + knob


def analytic_seconds(s: Schedule) -> float:
    """The cost model's seconds for a recorded schedule (`tsl.model.evaluate`)."""
    return evaluate(s).seconds


def candidates(op, machine, schedule_fn, limit: int, seed: int) -> list[Schedule]:
    base = record(op, machine, schedule_fn, None)
    if base is None:
        raise ScheduleError(f"the default schedule of {op} does not fit {machine.name}")
    names = sorted(base.space)
    combos = list(itertools.product(*(base.space[n] for n in names)))
    random.Random(seed).shuffle(combos)
    out, seen = [base], {_key(base)}
    for combo in combos:
        if len(out) >= limit:
            break
        s = record(op, machine, schedule_fn, dict(zip(names, combo)))
        if s is not None and _key(s) not in seen:
            seen.add(_key(s))
            out.append(s)
    return out


def neighbours(s: Schedule, op, machine, schedule_fn) -> list[Schedule]:
    """Schedules one knob step away from `s` (the next smaller or larger choice)."""
    out = []
    for name, choices in sorted(s.space.items()):
        i = choices.index(s.knob_values[name])
        for j in (i - 1, i + 1):
            if 0 <= j < len(choices):
                n = record(op, machine, schedule_fn, {**s.knob_values, name: choices[j]})
                if n is not None:
                    out.append(n)
    return out


def tune(op, target="cpu", trials: int = 24, schedule: Callable | None = None,
         pool: int = 600, batch: int = 4, seed: int = 0, start: list[dict] | None = None,
         measure: Callable | None = None) -> TuneResult:
    """Search the knobs of `schedule` (default: the operator's) for `op` on `target`.

    The default knobs and any `start` configurations are measured first; after that each batch
    comes from a random pool of the space plus the one-knob neighbours of the best two so far,
    ranked by the analytic model until there are 2 x `batch` measurements, then by XGBoost."""
    import xgboost as xgb

    backend, machine = resolve_target(target)
    fn = schedule or default_schedule(op.name)
    cands = candidates(op, machine, fn, pool, seed)
    known = {_key(c): i for i, c in enumerate(cands)}

    def add(s: Schedule) -> int:
        if _key(s) not in known:
            known[_key(s)] = len(cands)
            cands.append(s)
        return known[_key(s)]

    def run(i: int) -> float:
        try:
            art = backend.build(cands[i])
        except LoweringError:
            return math.inf  # e.g. a tile the back end's own finer checks refuse
        if measure is not None:
            return measure(art)
        return backend.measure(art).seconds

    first = [0] + [add(s) for s in (record(op, machine, fn, k) for k in start or []) if s]
    done: dict[int, float] = {i: run(i) for i in dict.fromkeys(first)}
    while len(done) < trials:
        for i in sorted(done, key=done.get)[:2]:
            for n in neighbours(cands[i], op, machine, fn):
                add(n)
        todo = [i for i in range(len(cands)) if i not in done]
        if not todo:
            break
        if len(done) >= 2 * batch:
            idx = list(done)
            label = np.log([min(done[i], 1e9) for i in idx])
            model = xgb.train({"max_depth": 4, "eta": 0.2, "nthread": 1},
                              xgb.DMatrix(np.array([features(cands[i]) for i in idx]),
                                          label=label), 60)
            score = model.predict(xgb.DMatrix(np.array([features(cands[i]) for i in todo])))
        else:
            score = [analytic_seconds(cands[i]) for i in todo]
        for j in np.argsort(score)[:min(batch, trials - len(done))]:
            done[todo[j]] = run(todo[j])
    best = min(done, key=done.get)
    log = [(cands[i].knob_values, analytic_seconds(cands[i]), t) for i, t in done.items()]
    return TuneResult(cands[best].knob_values, done[best], cands[0].knob_values, done[0], log)


def _key(s: Schedule) -> tuple:
    return tuple(sorted(s.knob_values.items()))
