"""`tsl.tune.tune` of a family: the micro-kernels of a symbol's whole range tuned at once.

A trial is one candidate for one range (lo, hi] of the build (`tsl.tune.family.ranges`):
its kernel with run-time rows compiled once (recorded at hi), checked against NumPy at the
range's smallest sample value, then timed (bound, per call, the best of a few) at each of the
range's sample values -- one compile serves every sample, as the built kernel serves every
value. A range's first kernel is its reference: every later candidate is timed call by call
alternately with it and read as the ratio of the two at the reference's level
(`_Search._against`), so readings made minutes apart on a shared host compare; the level is
the median of the reference's readings, its first and one per round, when every range's
reference is timed again in one hold of the timing lock (`_Search.relevel`), so that the
ranges' seconds, which train one model, come from the same moments of the host. The first
rounds measure, per range, the kernels an untuned build runs there, one per round (the cost
model's choice at the top, then its second and third: `tsl.dynamic.microkernel.choose`), so a
tuned range measured its untuned kernels; each later round one more candidate per range: the
one predicted to take most time off the range's samples, each sample at the least measured
there so far (a build runs a range's best and up to two more where they are faster:
`tsl.tune.family.beside`), ties by the predicted total. A range's candidates are the model's
best at its top, knobs drawn at random from the space (as the static tuner's pool) and, for a
symbol in two or more axes, the model's best at the range's inside samples
(`_Search._add_inside`). The prediction is the analytic model's time of the knobs at each
sample (padded to their row block) corrected by ONE XGBoost model shared across the ranges,
trained on every measurement so far: its features are the static tuner's (program and knobs,
size free) and the value itself and its padding, so what it learns at one value of M ranks the
candidates at the others. After each round the one-knob neighbours of a range's best and the
best knobs of the ranges beside it (where they record) join its candidates. At the end a
range's best two, where within TIE, are timed again
alternately to order them (`_Search.settle`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..artifact import call_times
from ..errors import BackendUnavailable, InputError, ScheduleError, TSLError
from ..model import evaluate
from ..timing import exclusive, realtime
from . import search
from .database import Database, as_database, knobs_key, make_record
from .family import Measured, family_key, measured, ranges
from .runner import LocalRunner
from .search import LearnedModel, TuneResult, knob_features, neighbours, program_features

POOL = 24  # the model's best candidates per range to start from (and the best per row block)
SEEDS = 48  # knobs drawn at random per range beside them (`search.candidates`)
REPEAT, WARMUP = 5, 3  # calls timed per sample value (the least counts), calls before them
# A range's best two are timed again, alternately, where their totals are within TIE: the same
# kernels' readings moved by up to 1.1x on a shared host (benchmarks/README.md, tune41).
TIE, SETTLE = 1.1, 11


@dataclass
class FamilyResult:
    """Per range top: the knobs chosen, their total measured seconds over the range's
    samples, and the cost model's own choice's (the untuned build's kernel)."""

    knobs: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    default_seconds: dict = field(default_factory=dict)
    samples: dict = field(default_factory=dict)  # range top -> the values timed
    trials: int = 0  # candidates compiled and timed (counting those from the database)
    measurements: int = 0  # (candidate, value) timings
    resumed: int = 0
    failed: int = 0
    ranked_by: list = field(default_factory=list)  # per round: analytic / learned
    settled: int = 0  # ranges whose best two were timed again (`_Search.settle`)
    wall_seconds: float = 0.0

    @property
    def speedup(self) -> float:
        """Total over every range's samples: the model's choices over the tuned ones."""
        both = [hi for hi in self.seconds if hi in self.default_seconds]
        return (sum(self.default_seconds[hi] for hi in both)
                / sum(self.seconds[hi] for hi in both)) if both else math.nan

    def summary(self) -> dict:
        return {"knobs": self.knobs, "seconds": self.seconds, "kind": "seconds",
                "default_seconds": self.default_seconds, "speedup": self.speedup,
                "trials": self.trials, "measurements": self.measurements,
                "resumed": self.resumed, "failed": self.failed, "ranked_by": self.ranked_by,
                "settled": self.settled, "wall_seconds": self.wall_seconds}

    def __str__(self) -> str:
        return (f"family tuned: {len(self.knobs)} ranges, {self.trials} trials "
                f"({self.measurements} timings, {self.resumed} from the database, "
                f"{self.failed} failed), {self.speedup:.2f}x the cost model's kernels over "
                f"the ranges' samples, {self.wall_seconds:.1f} s")


def tune(op, target="cpu", trials: int = 24, schedule=None, seed: int = 0,
         database: Database | str | None = None, runner=None, progress=None,
         **static) -> "FamilyResult | TuneResult":
    """`tsl.tune.tune`: an operator's knobs (`tsl.tune.search.tune`, which takes `static`'s
    options), or, for a `Family` (an operator with a `tsl.ops.sym` dim), its kernels over
    the symbol's whole range (`tune_family`: a trial is one kernel timed at several values;
    measured in this process)."""
    from ..backend import resolve_target
    from ..ops.sym import Family
    from ..schedules import default_schedule

    if not isinstance(op, Family):
        return search.tune(op, target, trials, schedule, seed=seed, database=database,
                           runner=runner, progress=progress, **static)
    if runner is not None and not isinstance(runner, LocalRunner):
        raise InputError(f"{op}: a family is tuned in this process (its kernels are timed "
                         f"at several values each); leave runner unset")
    backend, machine = resolve_target(target)
    why = backend.unavailable(machine)
    if why:
        raise BackendUnavailable(f"cannot tune for {machine.name} here: {why}")
    return tune_family(op, backend, machine, schedule or default_schedule(op.name), trials,
                       as_database(database) if database is not None else None, seed,
                       progress)


def tune_family(fam, backend, machine, fn, trials: int, database: Database | None,
                seed: int = 0, progress=None) -> FamilyResult:
    """Tune `fam`'s kernels for `machine` (see the module's text); measurements go to
    `database` as they are made."""
    from ..dynamic import runtime_rows
    from ..dynamic.shape import dims_of

    t0 = time.perf_counter()
    dims = dims_of(fam)
    if not runtime_rows(fam, backend, dims, {}):
        raise ScheduleError(f"{fam}: tuning a family needs kernels with run-time rows (a "
                            f"GEMM's rows or columns on a back end that compiles them; "
                            f"{machine.name} builds per-value kernels here): tune "
                            f"fam.at(...) per value instead")
    run = _Search(fam, backend, machine, fn, dims.axes, database, seed)
    n_round = 0
    while run.result.trials < trials:
        model = run.fitted()
        picks = run.picks(trials - run.result.trials, model)
        if not picks:
            break
        run.result.ranked_by.append("learned" if model is not None else "analytic")
        for r, i in picks:
            run.measure(r, i)
        run.relevel()
        run.grow()
        n_round += 1
        if progress:
            progress(f"round {n_round}: {run.result.trials}/{trials} trials, "
                     f"{run.result.failed} failed, {time.perf_counter() - t0:.1f} s")
    run.record_levels()
    run.settle()
    return run.finish(t0)


class _Range:
    def __init__(self, lo: int, hi: int, pts: list[int]):
        self.lo, self.hi, self.pts = lo, hi, pts
        self.cands: list = []  # schedules recorded at hi, or at `at`'s value
        self.at: dict[int, int] = {}  # candidate -> the value inside its knobs record at
        self.known: dict[str, int] = {}
        self.opening: list[int] = []  # the untuned build's kernels, its top first
        self.done: dict[int, Measured] = {}
        self.ref: tuple | None = None  # (bound kernel, its free inputs): `_time`
        # The reference's readings per sample (its first, then one per round: `_Search.relevel`)
        # and the candidates' readings as ratios to it: a candidate's seconds are its ratio
        # times the median of the reference's readings, so every range's level comes from the
        # same moments of the host
        self.reads: dict[int, list[float]] = {}
        self.ratios: dict[int, dict[int, float]] = {}
        self.written: dict[int, dict[int, float]] = {}  # the seconds in the database

    def level(self) -> dict[int, float]:
        return {v: float(np.median(ts)) for v, ts in self.reads.items()}

    def relevelled(self) -> None:
        """Each candidate read against the reference at the reference's level now."""
        lvl = self.level()
        for i, q in self.ratios.items():
            self.done[i].seconds = {v: q[v] * lvl[v] for v in q}

    def add(self, s, at: int | None = None) -> int:
        """Candidate `s` (recorded at hi, or at value `at` inside the range)."""
        k = knobs_key(s.knob_values)
        if k not in self.known:
            self.known[k] = len(self.cands)
            self.cands.append(s)
            if at is not None:
                self.at[len(self.cands) - 1] = at
        return self.known[k]

    def value_of(self, i: int) -> int:
        """The value candidate i's schedule is recorded at."""
        return self.at.get(i, self.hi)

    def sort(self, key) -> None:
        """Candidates in the order of `key` (before any is measured)."""
        order = sorted(range(len(self.cands)), key=key)
        self.cands = [self.cands[i] for i in order]
        self.at = {n: self.at[i] for n, i in enumerate(order) if i in self.at}
        self.known = {knobs_key(s.knob_values): i for i, s in enumerate(self.cands)}

    def floor(self) -> np.ndarray:
        """The least seconds measured at each sample (inf where none was)."""
        got = [[m.seconds.get(v, math.inf) for v in self.pts] for m in self.done.values()
               if m.error is None]
        return np.min(got, axis=0) if got else np.full(len(self.pts), math.inf)

    def best(self) -> int | None:
        ok = [(m.total(self.pts), i) for i, m in self.done.items()
              if m.total(self.pts) is not None]
        return min(ok)[1] if ok else None


class _Search:
    def __init__(self, fam, backend, machine, fn, axes, db, seed: int):
        from ..dynamic import _check as microkernel_check, microkernel, symbolic_ladder

        self.fam, self.backend, self.machine, self.fn = fam, backend, machine, fn
        self.axes, self.db, self.seed = axes, db, seed
        self.name = next(iter(fam.syms))
        self.key = family_key(fam, machine, fn)
        self.result = FamilyResult()
        self.ranges = [_Range(lo, hi, pts) for lo, hi, pts in ranges(fam)]
        self.ests: dict[tuple, tuple] = {}  # (range top, knobs, value) -> (analytic, feats)
        check = microkernel_check(machine)
        upper = next(iter(fam.syms.values())).upper
        untuned = microkernel.kernels(fam, machine, fn, axes, symbolic_ladder(upper), upper,
                                      None, check)
        for r, ks in zip(self.ranges, untuned, strict=True):
            for c in microkernel.pool(fam, machine, fn, axes, r.hi, None, check, top=POOL):
                r.add(c.schedule)
            totals = self.predicted_totals(r, list(range(len(r.cands))), None)
            r.sort(totals.__getitem__)  # the model's choice first
            # and knobs drawn from the whole space, as the static tuner's pool: the model's
            # best at a top are a few tiles in several orders, and the split reductions a
            # 64-trial tune picks at m = 100 and 333 (benchmarks/README.md, dyn40) are
            # three steps of neighbours from them
            for s in search.candidates(fam.at(**{self.name: r.hi}), machine, fn, SEEDS,
                                       seed + r.hi):
                r.add(s)
            if len(axes) > 1:
                self._add_inside(r, ks, check)
            r.opening = list(dict.fromkeys(
                r.add(k.schedule, at=None if k.value == r.hi else k.value) for k in ks))
        self._resume()

    def _add_inside(self, r: _Range, untuned: list, check) -> None:
        """The model's best at each sample inside range r (a symbol in two or more axes):
        blocks that suit a value inside the range, which the top's value may offer none of
        (attention's scores: 4 x 112 at s = 107, 0.96 of static at s = 100, where the top's
        8 x 32 ran 1.07-1.17: `tsl.dynamic.microkernel.third`). Recorded at the top where
        its knobs record there, else at their own value (7 column blocks of 16 do not divide
        128). A sample the untuned build's third kernel was searched at (`untuned`) takes
        that kernel: the same search, not run again."""
        from ..model import search as model_search
        from ..record import record

        searched = {k.value: k.schedule for k in untuned}
        for v in r.pts[1:-1]:
            best = searched.get(v) or model_search(
                self.fam.at(**{self.name: v}), self.machine, self.fn, None,
                check=check).candidates[0].schedule
            try:
                r.add(record(self.fam.at(**{self.name: r.hi}), self.machine, self.fn,
                             dict(best.knob_values)))
            except ScheduleError:
                r.add(best, at=v)

    # -- the model ----------------------------------------------------------------------
    def est(self, r: _Range, i: int, v: int) -> tuple:
        k = (r.hi, knobs_key(r.cands[i].knob_values), v)
        if k not in self.ests:
            from ..dynamic.microkernel import padded_schedule
            from ..dynamic.symbolic import blocks_of, padded

            s = r.cands[i]
            t = padded_schedule(self.fam, self.fn, s, self.axes, v)
            if t is None:
                self.ests[k] = (math.inf, None)
            else:
                e = evaluate(t)
                pad = max(padded(v, b) for b in blocks_of(s, self.axes).values()) / v
                self.ests[k] = (e.seconds, program_features(t, e) + knob_features(s)
                                + [math.log2(v), math.log2(pad)])
        return self.ests[k]

    def fitted(self) -> LearnedModel | None:
        """The shared model, trained on every timing so far (None: too few yet)."""
        pts = [(self.est(r, i, v), t) for r in self.ranges for i, m in r.done.items()
               for v, t in m.seconds.items() if m.error is None]
        pts = [(e, t) for e, t in pts if e[1] is not None]
        if len(pts) < 8:
            return None
        model = LearnedModel()
        model.fit([e[1] for e, _ in pts], [t for _, t in pts], [e[0] for e, _ in pts])
        return model

    def predicted(self, r: _Range, todo: list[int], model) -> np.ndarray:
        """Each candidate's predicted seconds at each of the range's samples (a row per
        candidate; inf where its knobs do not record at one of them); the model asked once
        for them all."""
        es = {i: [self.est(r, i, v) for v in r.pts] for i in todo}
        ok = [i for i in todo if all(e[1] is not None for e in es[i])]
        got = np.full((len(todo), len(r.pts)), math.inf)
        rows = [todo.index(i) for i in ok]
        if model is None:
            got[rows] = [[e[0] for e in es[i]] for i in ok]
        elif ok:
            got[rows] = np.exp(model.predict([e[1] for i in ok for e in es[i]],
                                             [e[0] for i in ok for e in es[i]])
                               ).reshape(len(ok), len(r.pts))
        return got

    def predicted_totals(self, r: _Range, todo: list[int], model) -> list[float]:
        """Each candidate's predicted seconds summed over the range's samples."""
        return list(self.predicted(r, todo, model).sum(axis=1))

    def picks(self, room: int, model) -> list[tuple[_Range, int]]:
        """Per range (while `room` lasts), its unmeasured candidate predicted to take most
        off the range's samples, each at the least any candidate measured there (a build
        runs up to two more kernels where they beat the best: `tsl.tune.family.beside`); ties by
        the predicted total."""
        out = []
        for r in self.ranges:
            todo = [i for i in range(len(r.cands)) if i not in r.done]
            if len(out) == room or not todo:
                continue
            first = [i for i in r.opening if i in todo]
            if first:  # the untuned build's kernels open every range
                out.append((r, first[0]))
                continue
            pred = self.predicted(r, todo, model)
            # the analytic model's seconds are not the timings' scale: its totals alone
            floor = np.minimum(pred, r.floor() if model is not None else math.inf).sum(axis=1)
            floor[~np.isfinite(pred.sum(axis=1))] = math.inf
            out.append((r, todo[min(range(len(todo)),
                                    key=lambda j: (floor[j], pred[j].sum()))]))
        return out

    # -- measuring -----------------------------------------------------------------------
    def measure(self, r: _Range, i: int) -> None:
        s = r.cands[i]
        got = Measured(r.hi, dict(s.knob_values), at=r.at.get(i),
                       untuned=bool(r.opening) and i == r.opening[0])
        try:
            got.seconds, got.error = self._time(r, s)
        except BackendUnavailable:
            raise
        except TSLError as e:
            got.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
        r.done[i] = got
        if got.error is None and r.reads:
            lvl = r.level()
            r.ratios[i] = {v: t / lvl[v] for v, t in got.seconds.items()}
        self.result.trials += 1
        self.result.failed += got.error is not None
        self.result.measurements += len(got.seconds)
        r.written[i] = dict(got.seconds)
        if self.db is None:
            return
        for v in r.pts if got.error is None else r.pts[:1]:
            t = got.seconds.get(v)
            self.db.add(make_record(self.key, got.record_knobs(v), t, "seconds", t,
                                    got.error))

    def _time(self, r: _Range, s) -> tuple[dict, str | None]:
        """The kernel compiled from `s`, checked at r.pts[0], timed at each value: the range's
        first kernel back to back (it becomes the range's reference), every later one
        alternately with the reference (`_against`)."""
        f, frees, err = self._bound(s, r.pts)
        if err:
            return {}, err
        ref = self._reference(r)
        # The timing lock, when one is set, and real-time priority, when asked for
        # (`tsl.timing`), as the static tuner's runner times: at ordinary priority on a
        # shared host the same kernel read 3-10x apart between candidates (benchmarks/README.md,
        # dyn40), and a range kept whichever the others' builds preempted least.
        with exclusive(), realtime():
            if ref is not None:
                return self._against(ref, f, frees, r.level()), None
            got = _least(f, frees)
        r.ref = (f, frees)
        r.reads = {v: [t] for v, t in got.items()}
        return got, None

    def _against(self, ref: tuple, f, frees, level: dict) -> dict:
        """{value: seconds} of `f` timed call by call alternately with the reference kernel
        `ref` (REPEAT calls each after WARMUP), read at the reference's level: the median of
        the REPEAT ratios of f's call to the reference's call before it, times `level` (the
        ratio of the least of each read one candidate 0.67x its neighbours at
        one sample). The host's speed moved by 1.6x between a tuning's rounds
        (benchmarks/README.md, tune42: the model's choice of (128, 256] read 3.9-6.3 ms in
        round 1 of one tuning, 2.1-4.1 in another), so readings made minutes apart are
        compared as ratios within one alternated run; and between f's calls the L3 holds
        the reference's own copy of the weights, as between a model's kernels, not f's
        alone."""
        g, gfrees = ref
        theirs, mine = _interleaved([(g, gfrees), (f, frees)], list(frees), REPEAT)
        return {v: float(np.median(np.array(mine[v]) / np.array(theirs[v]))) * level[v]
                for v in frees}

    def _reference(self, r: _Range) -> tuple | None:
        """The range's reference kernel (bound, its free inputs): its first candidate
        measured without error, compiled again after a resume (its recorded seconds its first
        reading, every candidate's read as a ratio to them); None before there is one."""
        if r.ref is None:
            for i, m in r.done.items():
                if m.error is None and m.total(r.pts) is not None:
                    f, frees, err = self._bound(r.cands[i], r.pts)
                    if err is None:
                        r.ref = (f, frees)
                        r.reads = {v: [t] for v, t in m.seconds.items()}
                        r.ratios = {j: {v: d.seconds[v] / m.seconds[v] for v in r.pts}
                                    for j, d in r.done.items() if d.total(r.pts) is not None}
                        break
        return r.ref

    def relevel(self) -> None:
        """Every range's reference timed again, all in one hold of the timing lock, and
        each range's candidates read at the median of its reference's readings: a range's
        first reading is one moment of a shared host (the same kernel's first reading read
        0.55-1.93x apart between two tunings, in 6 ranges of 14 by 13% or more:
        benchmarks/README.md, tune45), and the model shared across the ranges learns from
        every range's seconds."""
        live = [r for r in self.ranges if r.ref is not None]
        if not live:
            return
        with exclusive(), realtime():
            got = [_least(*r.ref) for r in live]
        for r, read in zip(live, got):
            for v, t in read.items():
                r.reads[v].append(t)
            r.relevelled()

    def record_levels(self) -> None:
        """The database's readings of the candidates whose level moved (appended: the last
        record of a value counts), so that a build and a resumed tuning read what the search
        read last."""
        if self.db is None:
            return
        for r in self.ranges:
            for i in r.ratios:
                m = r.done[i]
                for v, t in m.seconds.items():
                    if not math.isclose(t, r.written[i].get(v, t), rel_tol=1e-9):
                        self.db.add(make_record(self.key, m.record_knobs(v), t, "seconds",
                                                t))

    def _bound(self, s, pts) -> tuple:
        """(`s`'s kernel compiled, checked at pts[0] and bound, its free inputs per value,
        None), or (None, None, what was wrong)."""
        from ..dynamic.symbolic import blocks_of

        art = self.backend.build_symbolic(s, blocks_of(s, self.axes))
        op = self.fam.at(**{self.name: pts[0]})
        xs = op.random_inputs(self.seed + 1)
        ok, err = op.check(art.run(*xs), op.reference(*xs))
        if not ok:
            return None, None, (f"wrong result at {self.name}={pts[0]}: error {err:.3g} "
                                f"against the NumPy reference")
        names = art.constants()
        f = art.bind(**{t.name: x for t, x in zip(op.inputs, xs) if t.name in names})
        frees = {v: [x for t, x in zip(at.inputs, at.random_inputs(self.seed))
                     if t.name not in names]
                 for v, at in ((v, self.fam.at(**{self.name: v})) for v in pts)}
        return f, frees, None

    def settle(self) -> None:
        """Where a range's best two totals are within TIE, both timed again alternately,
        call by call, SETTLE calls each per sample, and the two's readings replaced by the
        new ones' ratios (in the database too, after the first readings): REPEAT calls back
        to back ranked such pairs by the host's noise (benchmarks/README.md, tune41)."""
        for r in self.ranges:
            ranked = sorted((m.total(r.pts), i) for i, m in r.done.items()
                            if m.total(r.pts) is not None)
            if len(ranked) < 2 or ranked[1][0] > TIE * ranked[0][0]:
                continue
            pair = [i for _, i in ranked[:2]]
            again = self._alternated([r.cands[i] for i in pair], r.pts)
            if again is None:
                continue
            # the new readings order the two; their level stays the first readings' (the
            # least of the two at each sample): the same kernels read 1.1-2.7x slower a few
            # minutes later on a loaded host, and the other candidates' readings are not
            # taken again
            least = {v: min(r.done[i].seconds[v] for i in pair) / min(a[v] for a in again)
                     for v in r.pts}
            for i, secs in zip(pair, again):
                secs = {v: t * least[v] for v, t in secs.items()}
                r.done[i].seconds.update(secs)
                if self.db is not None:
                    for v, t in secs.items():
                        self.db.add(make_record(self.key, r.done[i].record_knobs(v), t,
                                                "seconds", t))
            self.result.settled += 1

    def _alternated(self, cands: list, pts) -> list[dict] | None:
        """Per candidate, {value: the least seconds} of SETTLE calls alternated with the
        others' (after WARMUP each); None where one no longer checks against NumPy (its
        first reading stands)."""
        bound = [self._bound(s, pts) for s in cands]
        if any(err for _, _, err in bound):
            return None
        with exclusive(), realtime():
            got = _interleaved([(f, frees) for f, frees, _ in bound], pts, SETTLE)
        return [{v: min(t) for v, t in ts.items()} for ts in got]

    def grow(self) -> None:
        """Neighbours of each range's best, and its neighbouring ranges' bests, join it."""
        from ..record import record

        bests = [r.best() for r in self.ranges]
        for n, r in enumerate(self.ranges):
            if bests[n] is not None:
                b = bests[n]
                op = self.fam.at(**{self.name: r.value_of(b)})
                for s in neighbours(r.cands[b], op, self.machine, self.fn):
                    r.add(s, at=r.at.get(b))
            for m in (n - 1, n + 1):
                if 0 <= m < len(self.ranges) and bests[m] is not None:
                    try:
                        r.add(record(self.fam.at(**{self.name: r.hi}), self.machine, self.fn,
                                     dict(self.ranges[m].cands[bests[m]].knob_values)))
                    except ScheduleError:
                        pass  # those knobs do not fit this range's top

    def _resume(self) -> None:
        """What the database measured for this family already (failed ones too)."""
        from ..record import record

        if self.db is None:
            return
        by_top = {r.hi: r for r in self.ranges}
        for (top, _), m in measured(self.db, self.key).items():
            r = by_top.get(top)
            if r is None or (m.error is None and m.total(r.pts) is None):
                continue  # another ladder's range, or cut short: measured again
            try:
                i = r.add(record(self.fam.at(**{self.name: m.at or top}), self.machine,
                                 self.fn, m.knobs), at=m.at)
            except ScheduleError:
                continue
            r.done[i] = m
            r.written[i] = dict(m.seconds)
            self.result.trials += 1
            self.result.resumed += 1

    def finish(self, t0: float) -> FamilyResult:
        res = self.result
        for r in self.ranges:
            b = r.best()
            if b is None:
                continue
            res.knobs[r.hi] = dict(r.cands[b].knob_values)
            res.seconds[r.hi] = r.done[b].total(r.pts)
            res.samples[r.hi] = list(r.pts)
            d = r.done.get(r.opening[0]) if r.opening else None
            if d is not None and d.total(r.pts) is not None:
                res.default_seconds[r.hi] = d.total(r.pts)
        if not res.knobs:
            raise TSLError(f"tuning {self.fam} for {self.machine.name}: every candidate "
                           f"measured failed ({res.trials})")
        res.wall_seconds = time.perf_counter() - t0
        return res


def _least(f, frees: dict) -> dict:
    """{value: the least of REPEAT calls of f after WARMUP} (the caller holds the lock)."""
    return {v: min(call_times(lambda: f(*xs), REPEAT, WARMUP)) for v, xs in frees.items()}


def _interleaved(kernels: list, pts, calls: int) -> list[dict]:
    """Per kernel (bound, its free inputs per value), {value: the seconds of `calls` calls}:
    at each value every kernel warmed up (WARMUP calls), then the kernels called in turn, one
    call each, `calls` times (the caller holds the timing lock)."""
    got = [{v: [] for v in pts} for _ in kernels]
    for v in pts:
        for f, frees in kernels:
            call_times(lambda: f(*frees[v]), 0, WARMUP)
        for _ in range(calls):
            for (f, frees), ts in zip(kernels, got):
                ts[v] += call_times(lambda: f(*frees[v]), 1, 0)
    return got
