"""The knob search: candidates from the schedule's space, ranked by the analytic model,
corrected by an XGBoost model trained on what was measured.

The first batch is the default knobs (and any `start` configurations), filled up by the
ranking; after that each batch comes from a random pool of the space plus the one-knob
neighbours of the best two so far. Candidates are ranked by the analytic model
(`tsl.model.evaluate`) until there are 2 x `batch` successful measurements, then by the
analytic model plus the XGBoost model's prediction of its error, retrained on this run's
measurements before each batch. Knob settings that differ only in loops of one iteration
and get the same analytic estimate (twins, `twin_key`) are measured once while distinct
candidates remain.

Transfer: a model saved beside the database by an earlier run of the same schedule on the same
machine (another operator of the family: the features are size-free) ranks the batches before
the run has a model of its own, in place of the analytic model alone; from then on only this
run's measurements train the model (the earlier operator's errors are not carried along), and
that model is what the run saves. For every batch a learned model ranked, the Spearman
correlation of its predictions with the measurements is kept, with which model ranked it."""

from __future__ import annotations

import itertools
import math
import random
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..backend import resolve_target
from ..record import record as record_schedule
from ..errors import BackendUnavailable, ScheduleError, TSLError
from ..model import evaluate
from ..primitives.schedule import Schedule
from ..schedules import default_schedule
from .database import Database, Key, as_database, knobs_key, make_record
from .runner import LocalRunner, Outcome, Runner


@dataclass
class TuneResult:
    knobs: dict
    seconds: float
    default_knobs: dict
    default_seconds: float
    log: list = field(default_factory=list)  # (knobs, analytic seconds, measured seconds)
    kind: str = "seconds"  # of the measurements: seconds / cycles / model
    resumed: int = 0  # configurations taken from the database, not measured again
    failed: int = 0  # configurations whose build, check or run failed (this run)
    # (trials before the batch, rho, ranker) per batch a learned model ranked; ranker:
    # "transferred" (a model saved by an earlier run) or "own" (trained on this run)
    spearman: list = field(default_factory=list)
    predicted: list = field(default_factory=list)  # (log seconds predicted, measured, ranker)
    transferred: bool = False  # the first batches were ranked by a model saved earlier
    ranked_by: list = field(default_factory=list)  # per batch: analytic / transferred / own
    wall_seconds: float = 0.0
    trace: list = field(default_factory=list)  # best seconds after each measurement, in order

    @property
    def speedup(self) -> float:
        return self.default_seconds / self.seconds

    @property
    def run_spearman(self) -> float | None:
        """Spearman correlation of every prediction the learned model made before a batch with
        that batch's measurements, over the whole run (None: the model ranked no batch)."""
        return self.spearman_of(("transferred", "own"))

    def spearman_of(self, rankers=("own",)) -> float | None:
        """As `run_spearman`, over the batches ranked by the models in `rankers` only."""
        got = [(p, t) for p, t, r in self.predicted if r in rankers]
        return spearman([p for p, _ in got], [t for _, t in got])

    def trials_to(self, seconds: float) -> int | None:
        """How many measurements this run needed to reach `seconds` (None: it never did)."""
        return next((n for n, t in enumerate(self.trace, 1) if t <= seconds), None)

    def summary(self) -> dict:
        return {"knobs": self.knobs, "seconds": self.seconds, "kind": self.kind,
                "default_knobs": self.default_knobs, "default_seconds": self.default_seconds,
                "speedup": self.speedup, "trials": len(self.log), "resumed": self.resumed,
                "failed": self.failed, "spearman": self.spearman,
                "run_spearman": self.run_spearman, "predicted": len(self.predicted),
                "transferred": self.transferred, "ranked_by": self.ranked_by,
                "wall_seconds": self.wall_seconds}

    def __str__(self) -> str:
        unit = " (model)" if self.kind == "model" else ""
        rho = self.run_spearman
        return (f"best {self.knobs}: {self.seconds * 1e3:.3f} ms{unit}, default "
                f"{self.default_seconds * 1e3:.3f} ms ({self.speedup:.2f}x), "
                f"{len(self.log)} measured ({self.resumed} from the database, {self.failed} "
                f"failed)" + (f", model Spearman {rho:.2f}" if rho is not None else ""))


def record(op, machine, schedule_fn, knobs) -> Schedule | None:
    """The recorded schedule, or None when it does not fit the machine."""
    try:
        return record_schedule(op, machine, schedule_fn, knobs)
    except ScheduleError:
        return None


def features(s: Schedule, est=None) -> list[float]:
    """Features of a recorded schedule that do not scale with the operator's size, so that a
    model trained on one operator of a family ranks another (transfer): `program_features`,
    then the knobs (log2 of a size, the index of any other choice). `est`: the schedule's
    `tsl.model.evaluate`, when known."""
    return program_features(s, est if est is not None else evaluate(s)) + knob_features(s)


def program_features(s: Schedule, est) -> list[float]:
    """What the analytic estimate `est` says of the program, size-free: its padding waste,
    balance over cores and pipelining, the split of its time (compute and each data path, as
    shares) and the bytes it moves into each level per MAC."""
    m = s.machine
    t = est.seconds
    macs = s.op.macs
    padded = math.prod(s.padded_extents().values())
    par = math.prod(lp.extent for lp in s.loops if lp.parallel)
    cores = m.cores()
    balance = par / (math.ceil(par / cores) * cores) if par else 1.0
    shares = [est.compute_seconds / t] + [est.level_seconds.get(lv.name, 0.0) / t
                                          for lv in m.memory]
    per_mac = [math.log2(1 + est.traffic.get(lv.name, 0.0) / max(macs, 1)) for lv in m.memory]
    return [math.log2(padded / max(macs, 1)), balance, float(est.pipelined)] + shares + per_mac


def knob_features(s: Schedule) -> list[float]:
    return [_knob_feature(s.space[n], v) for n, v in sorted(s.knob_values.items())]


def _knob_feature(choices, v) -> float:
    if isinstance(v, (str, bool)) or not isinstance(v, (int, float)):
        return float(choices.index(v))
    return math.log2(v) if v > 0 else -1.0


def analytic_seconds(s: Schedule) -> float:
    """The cost model's time of a recorded schedule (`tsl.model.evaluate`)."""
    return evaluate(s).seconds


class LearnedModel:
    """XGBoost on `features` -> the analytic model's error, log(measured / analytic seconds).
    A schedule's predicted log seconds are its analytic log seconds plus the predicted error:
    with no measurement yet the ranking is the analytic model's, and what a model learns about
    the analytic model's mistakes (a data path it underestimates, a knob it misjudges) is what
    carries over to another operator of the family."""

    PARAMS = {"max_depth": 4, "eta": 0.2, "nthread": 1}
    ROUNDS = 60

    def __init__(self, booster=None):
        self.booster = booster

    def fit(self, feats: list[list[float]], seconds: list[float], analytic: list[float]) -> None:
        """Train from scratch on these measurements (what any earlier fit learned is dropped)."""
        import xgboost as xgb

        label = np.log(np.asarray(seconds, dtype=float)) - np.log(np.asarray(analytic, float))
        self.booster = xgb.train(self.PARAMS, xgb.DMatrix(np.array(feats), label=label),
                                 self.ROUNDS)

    def predict(self, feats: list[list[float]], analytic: list[float]) -> np.ndarray:
        """Predicted log seconds."""
        import xgboost as xgb

        return (np.log(np.asarray(analytic, dtype=float))
                + self.booster.predict(xgb.DMatrix(np.array(feats))))

    def save(self, path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.booster.save_model(str(path))

    @classmethod
    def load(cls, path, n_features: int) -> "LearnedModel | None":
        """The model saved at `path`, or None when there is none or it was trained on other
        features (a warning says so)."""
        import xgboost as xgb

        if not path.exists():
            return None
        booster = xgb.Booster()
        try:
            booster.load_model(str(path))
        except xgb.core.XGBoostError as e:
            warnings.warn(f"learned model {path} not used: {e}", stacklevel=3)
            return None
        if booster.num_features() != n_features:
            warnings.warn(f"learned model {path} not used: it has {booster.num_features()} "
                          f"features, this schedule {n_features}", stacklevel=3)
            return None
        return cls(booster)


def spearman(a, b) -> float | None:
    """Spearman's rank correlation (None when either side has no spread)."""
    from scipy.stats import spearmanr

    if len(a) < 2 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return float(spearmanr(a, b).statistic)


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
         database: Database | str | None = None, runner: Runner | None = None,
         progress: Callable[[str], None] | None = None, transfer: bool = True) -> TuneResult:
    """Search the knobs of `schedule` (default: the operator's) for `op` on `target`.

    `trials` counts every configuration measured for this operator, schedule and machine,
    including those already in `database` (which are not measured again: a run that was
    stopped resumes). Each measurement is appended to the database as it is made, and the
    learned model is saved beside it at the end. `runner` builds and measures (default: in
    this process); `progress` receives one line per batch."""
    t0 = time.perf_counter()
    backend, machine = resolve_target(target)
    why = backend.unavailable(machine)
    if why:
        raise BackendUnavailable(f"cannot tune for {machine.name} here: {why}")
    fn = schedule or default_schedule(op.name)
    db = as_database(database) if database is not None else None
    runner = runner or LocalRunner(seed=seed)
    batch = max(batch, runner.parallelism)
    run = _Search(op, machine, fn, db, runner, candidates(op, machine, fn, pool, seed))
    run.resume()
    model, ranker = None, "analytic"  # what ranks the next batch
    model_path = db.model_path(machine, fn) if db is not None else None
    if transfer and model_path is not None:
        model = LearnedModel.load(model_path, len(run.est(0)[1]))
        run.result.transferred = model is not None
        ranker = "transferred" if model is not None else ranker
    # The default knobs and the `start` configurations open the first batch; the ranking fills
    # it (with a transferred model, its picks are measured from the first batch on).
    first = [0] + [run.add(s) for s in (record(op, machine, fn, k) for k in start or []) if s]
    first = [i for i in dict.fromkeys(first) if i not in run.done]
    n_batch = 0
    while len(run.done) < trials:
        run.grow()
        todo = [i for i in range(len(run.cands)) if i not in run.done and i not in first]
        room = max(min(batch, trials - len(run.done)) - len(first), 0)
        if not todo and not first:
            break
        ok = run.succeeded()
        if len(ok) >= 2 * batch:
            model, ranker = run.fitted(ok), "own"
        run.batch(first, todo, room, trials, model, ranker)
        first = []
        n_batch += 1
        if progress:
            progress(_progress_line(n_batch, run.done, trials, t0, run.result))
    return run.finish(model_path, t0)


class _Search:
    """One `tune` run's state: the candidates (grown by neighbours of the best), their
    analytic estimates and features (computed once each), what was measured, in order, and
    the result being filled in."""

    def __init__(self, op, machine, fn, db: Database | None, runner: Runner, cands: list):
        self.op, self.machine, self.fn, self.db, self.runner = op, machine, fn, db, runner
        self.key = Key.of(op, machine, fn)
        self.cands = cands
        self.known = {_key(c): i for i, c in enumerate(cands)}
        self.ests: dict[int, tuple] = {}  # candidate -> (analytic s, features, twin key)
        self.done: dict[int, float] = {}  # candidate -> seconds (inf: failed)
        self.order: list[int] = []
        self.result = TuneResult({}, math.inf, cands[0].knob_values, math.inf)

    def add(self, s: Schedule) -> int:
        if _key(s) not in self.known:
            self.known[_key(s)] = len(self.cands)
            self.cands.append(s)
        return self.known[_key(s)]

    def est(self, i: int) -> tuple:
        if i not in self.ests:
            c = self.cands[i]
            e = evaluate(c)
            prog = program_features(c, e)
            self.ests[i] = (e.seconds, prog + knob_features(c), twin_key(c, e.seconds, prog))
        return self.ests[i]

    def resume(self) -> None:
        """Count what the database measured for this key already (failed ones too)."""
        for rec in (self.db.measured(self.key).values() if self.db is not None else ()):
            s = record(self.op, self.machine, self.fn, rec.knobs)
            if s is not None:
                i = self.add(s)
                self.done[i] = rec.seconds if rec.ok else math.inf
                self.order.append(i)
                self.result.kind = rec.kind if rec.ok else self.result.kind
        self.result.resumed = len(self.done)

    def grow(self) -> None:
        for i in sorted(self.done, key=self.done.get)[:2]:
            for n in neighbours(self.cands[i], self.op, self.machine, self.fn):
                self.add(n)

    def succeeded(self) -> list[int]:
        return [i for i in self.done if math.isfinite(self.done[i])]

    def fitted(self, ok: list[int]) -> LearnedModel:
        model = LearnedModel()
        model.fit([self.est(i)[1] for i in ok], [self.done[i] for i in ok],
                  [self.est(i)[0] for i in ok])
        return model

    def measure(self, idx: list[int]) -> None:
        outs = self.runner.run([self.cands[i] for i in idx], self.fn)
        for i, o in zip(idx, outs):
            if self.db is not None:
                self.db.add(_as_record(self.key, self.cands[i].knob_values, o))
            if o.lost:
                continue  # the configuration stays a candidate
            self.done[i] = o.seconds if o.ok else math.inf
            self.order.append(i)
            self.result.failed += not o.ok
            if o.ok:
                self.result.kind = o.kind

    def batch(self, first, todo, room, trials, model, ranker) -> None:
        """Measure `first` and the `room` best of `todo` as `model` (else the analytic
        estimate) ranks them, distinct programs only; record how well the ranking did."""
        est, done, result = self.est, self.done, self.result
        scored = model is not None
        score = ((model.predict([est(i)[1] for i in todo], [est(i)[0] for i in todo]) if scored
                  else np.log([est(i)[0] for i in todo])) if todo and room else [])
        ranked = distinct([todo[j] for j in np.argsort(score, kind="stable")], room,
                          {est(i)[2] for i in [*done, *first]}, lambda i: est(i)[2])
        self.measure((first + ranked)[:trials - len(done)])
        result.ranked_by.append(ranker)
        if scored and ranked:
            got = [(float(score[todo.index(i)]), done[i]) for i in ranked
                   if i in done and math.isfinite(done[i])]
            result.predicted += [(p, t, ranker) for p, t in got]
            rho = spearman([p for p, _ in got], [t for _, t in got])
            if rho is not None:
                result.spearman.append((len(done) - len(ranked), rho, ranker))

    def finish(self, model_path, t0: float) -> TuneResult:
        """The result: the best measured knobs, the log and trace; the learned model saved."""
        done, result, ok = self.done, self.result, self.succeeded()
        if not ok:
            raise TSLError(f"tuning {self.op} for {self.machine.name}: every configuration "
                           f"measured failed ({len(done)}); see the errors in "
                           f"{self.db.path if self.db is not None else 'the runner outcomes'}")
        if model_path is not None and len(ok) >= 2:
            self.fitted(ok).save(model_path)
        best = min(ok, key=done.get)
        result.knobs, result.seconds = self.cands[best].knob_values, done[best]
        result.default_seconds = done.get(0, math.inf)
        result.log = [(self.cands[i].knob_values, self.est(i)[0], done[i]) for i in self.order]
        best_so_far = math.inf
        for i in self.order:
            best_so_far = min(best_so_far, done[i])
            result.trace.append(best_so_far)
        result.wall_seconds = time.perf_counter() - t0
        return result


def twin_key(s: Schedule, seconds: float, prog: list[float]) -> tuple:
    """A candidate apart from its knob values: its loop nest without the loops of one
    iteration (each loop's axes and steps, extent, parallel level, pipeline depth; the staged
    tiles), its analytic time and `program_features`. Knob settings that differ only in loops
    of one iteration are twins: on a conv2d with one image and one output-channel block,
    parallel over n*oh.0*co.0 or over oh.0 alone; `reduce_rows` with one row per tile. A
    pipelined loop counts even with one iteration (VTA overlaps its loads with the previous
    iteration of the loops around it: measured, 13% fewer cycles on ResNet-18 C10)."""
    nest = []
    for lp in s.loops:
        if lp.extent > 1 or lp.stages > 1:
            parts = tuple((p.axes, p.step) for p in lp.parts or (lp,) if p.extent > 1)
            nest.append((parts, lp.extent, lp.parallel, lp.stages, lp.tensorized is not None))
    staged = tuple((st.operand, st.level.name, st.elements) for st in s.stages)
    return (tuple(nest), staged, float(f"{seconds:.9g}"), *(float(f"{x:.9g}") for x in prog))


def distinct(ranked: list[int], room: int, taken: set, key) -> list[int]:
    """The first `room` of `ranked` whose `key` is not in `taken` nor picked before them; twins
    are deferred behind every distinct candidate, not dropped (they come in when nothing
    distinct is left)."""
    out, later = [], []
    for i in ranked:
        if len(out) == room:
            break
        k = key(i)
        (later if k in taken else out).append(i)
        taken.add(k)
    return out + later[:room - len(out)]


def _as_record(key: Key, knobs: dict, o: Outcome):
    return make_record(key, knobs, o.value, o.kind, o.seconds, o.error, o.device, o.lost)


def _progress_line(n: int, done: dict, trials: int, t0: float, result) -> str:
    ok = [i for i in done if math.isfinite(done[i])]
    best = (f"best {done[min(ok, key=done.get)] * 1e3:.4f} ms"
            + (" (model)" if result.kind == "model" else "") if ok else "no success yet")
    rho = f", Spearman {result.spearman[-1][1]:+.2f}" if result.spearman else ""
    return (f"batch {n}: {len(done)}/{trials} trials, {best}, {result.failed} failed{rho}, "
            f"{time.perf_counter() - t0:.1f} s")


def _key(s: Schedule) -> str:
    return knobs_key(s.knob_values)
