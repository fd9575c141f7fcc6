"""Knob search: the TAM's analytic model ranks candidates, measurements train an XGBoost model.

    result = tsl.tune.tune(op, "cpu", trials=24)
    art = tsl.build(op, "cpu", knobs=result.knobs)

Candidates are drawn from the schedule's own knob space and recorded without TVM (a candidate
that does not fit the machine raises ScheduleError and is dropped). The first measurements go
to the candidates the analytic model likes best; after that an XGBoost regressor, trained on the
analytic features of everything measured so far, picks each next batch. Measurement is the back
end's `measure(artifact)` when it has one (simulated cycles, estimated time), otherwise the
artifact's timed run.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..backend import resolve_target
from ..errors import ScheduleError
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
    s = Schedule(op, machine, knobs)
    try:
        schedule_fn(s)
    except ScheduleError:
        return None
    return s


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
    """Roofline over the levels: the slowest of compute at the primitive's rate and of each
    level's traffic at its bandwidth (bytes per cycle to its parent)."""
    m = s.machine
    p = s.primitive
    macs = math.prod(s.padded_extents().values())
    par = math.prod(lp.extent for lp in s.loops if lp.parallel) or 1
    used = min(par, m.cores())
    t = macs / ((p.macs_per_cycle or 1) * used * m.clock_hz) if p else 0.0
    for st in s.stages:
        lv = st.level
        if lv.bandwidth:
            loads = math.prod(lp.extent for lp in s.loops[:s.loops.index(st.at) + 1])
            t = max(t, loads * st.bytes / (lv.bandwidth * used * m.clock_hz))
    return t


def candidates(op, machine, schedule_fn, limit: int, seed: int) -> list[Schedule]:
    base = record(op, machine, schedule_fn, None)
    if base is None:
        raise ScheduleError(f"the default schedule of {op} does not fit {machine.name}")
    names = sorted(base.space)
    combos = list(itertools.product(*(base.space[n] for n in names)))
    random.Random(seed).shuffle(combos)
    out, seen = [base], {tuple(sorted(base.knob_values.items()))}
    for combo in combos:
        if len(out) >= limit:
            break
        s = record(op, machine, schedule_fn, dict(zip(names, combo)))
        if s is not None and (key := tuple(sorted(s.knob_values.items()))) not in seen:
            seen.add(key)
            out.append(s)
    return out


def tune(op, target="cpu", trials: int = 24, schedule: Callable | None = None,
         pool: int = 400, batch: int = 4, seed: int = 0,
         measure: Callable | None = None) -> TuneResult:
    """Search the knobs of `schedule` (default: the operator's) for `op` on `target`."""
    import xgboost as xgb

    backend, machine = resolve_target(target)
    fn = schedule or default_schedule(op.name)
    cands = candidates(op, machine, fn, pool, seed)
    xs = op.random_inputs(seed)

    def run(s: Schedule) -> float:
        art = backend.build(s)
        if measure is not None:
            return measure(art)
        if hasattr(backend, "measure"):
            return backend.measure(art)
        return art.time(*xs)

    feats = np.array([features(s) for s in cands])
    prior = np.array([analytic_seconds(s) for s in cands])
    done: dict[int, float] = {0: run(cands[0])}          # the default schedule first
    order = [i for i in np.argsort(prior) if i != 0]
    trials = min(trials, len(cands))
    while len(done) < trials:
        todo = [i for i in order if i not in done]
        if len(done) >= 2 * batch:
            idx = list(done)
            train = xgb.DMatrix(feats[idx], label=np.log([done[i] for i in idx]))
            model = xgb.train({"max_depth": 4, "eta": 0.2, "nthread": 1}, train, 60)
            pred = model.predict(xgb.DMatrix(feats[todo]))
            todo = [todo[j] for j in np.argsort(pred)]
        for i in todo[:min(batch, trials - len(done))]:
            done[i] = run(cands[i])
    best = min(done, key=done.get)
    log = [(cands[i].knob_values, float(prior[i]), t) for i, t in done.items()]
    return TuneResult(cands[best].knob_values, done[best], cands[0].knob_values, done[0], log)
