"""Is the learned model worth transferring? Trials to reach the best, with and without it.

    python benchmarks/tune_transfer.py [--pairs C4:C7,C10:C7,C5:C7] [--trials 32] [--seeds 5]
                                       [--target vta] [--pool 600] [--json FILE] [--workdir DIR]
    TSL_TIMING=realtime python benchmarks/tune_transfer.py --target cpu \
        --pairs "matmul 512x512x512 int8:matmul 1024x1024x1024 int8" [--within 0.03]
        [--lock /tmp/rt.lock] [--remeasure 3]

For each pair X:Y of operators — ResNet-18 layers by name (docs/vta.md §6, int8 with VTA's
requantization) or operator specs as `python -m tsl.tune` takes them:
1. X is tuned from scratch (`--trials`, seed 0); the run saves its learned model beside its
   database.
2. Y is tuned with the same budget for every seed, twice: from scratch (`transfer=False`, its
   own empty database) and with X's model copied beside its database (`transfer=True`). The two
   runs of a seed share the candidate pool and differ only by the model ranking the batches
   before the run has 2 batches of its own measurements (then both train on their own).
3. After each trial a run's answer is the best configuration by its own measurements so far.
   The goal for Y is the fastest answer of any run (all seeds, both arms). Per run: the trials
   until its answer came within `--within` of the goal (default 1% on VTA, 3% on CPU; ">N":
   not within the budget); and, the issue's "the same best", until it came within that of the
   final answer of the run from scratch with the same seed. The tables give the median over
   seeds of each arm, the per-seed values, and the median final answer of each arm; then, per
   run, the Spearman correlation of the learned model's predictions with the next batch's
   measurements, over the batches ranked by X's model (transfer only) and over those ranked
   by the run's own model.
The default pairs on the CPU: int8 matmul 512³ -> 1024³ (the analytic model prices every
register tile alike there). On VTA they tune C7 from each of three other layers: on C4, C8
and C10 the default knobs (the analytic model's first choice) are the best any run finds, so
every run, with or without a model, reaches it at trial 1; C7's fastest program is one the
analytic model prices 46% too slow (rank 24 in the analytic order of the pool's top 60), the
case a learned model is for.
The VTA cycle model's counts are deterministic: the runs differ only by what they chose to
measure, never by noise. They depend on the program, not on the data, so the runs skip the
per-configuration check against NumPy (the functional simulation of a whole layer, most of a
trial's time here); the goal configuration of each Y is built and verified at the end. For the
same reason a configuration another run of this process measured is not simulated again (it
still counts as a trial of every run that measures it).
On the CPU the measurements are times, so noisy: every configuration is still checked against
NumPy, and measured once per process — the runs that choose it share that measurement, so the
two arms differ only by what they chose to measure, never by the luck of a timing. A run's
answer is still the luck of its own timings (the best of many noisy measurements is often a
lucky one: measured, up to 10% below that configuration's own later timings), so every
answer of every run and Y's default are built again and measured `--remeasure` more times,
in rounds over all of them; the median of those is the answer's time in the tables, and the
spread and the gap to the runs' measurements are printed as the noise, to compare with the
tolerance. Time with `TSL_TIMING=realtime` on a shared host; `--lock FILE` holds an exclusive
flock on FILE while a batch or a round is measured (one real-time timer at a time on the
host), not while the tuner builds candidates and ranks them.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tsl  # noqa: E402
from tsl import tune  # noqa: E402
from tsl.backend import resolve_target  # noqa: E402
from tsl.backends.vta import classic  # noqa: E402
from tsl.tune.database import knobs_key  # noqa: E402
from tsl.tune.opspec import parse  # noqa: E402
from tsl.timing import exclusive  # noqa: E402

WITHIN = {"vta": 0.01, "cpu": 0.03}  # default tolerance: deterministic cycles / measured times


class Memo(tune.Runner):
    """`LocalRunner`, remembering each outcome by (operator, knobs) across runs (simulated
    cycles are a function of the program; a time is measured once and shared, see the module's
    docstring). `check`: against NumPy (the VTA runs skip it, see above). `lock`: a file to
    hold an exclusive flock on while measuring."""

    outcomes: dict = {}

    def __init__(self, seed: int = 0, check: bool = False, lock: str | None = None):
        self.inner = tune.LocalRunner(check=check, seed=seed)
        self.lock = lock

    def run(self, schedules, schedule_fn):
        keys = [(tune.signature(s.op), knobs_key(s.knob_values))
                for s in schedules]
        new = [(k, s) for k, s in zip(keys, schedules) if k not in self.outcomes]
        if new:
            with exclusive(self.lock):
                outs = self.inner.run([s for _, s in new], schedule_fn)
            for (k, _), o in zip(new, outs):
                self.outcomes[k] = o
        return [self.outcomes[k] for k in keys]


def operator(name: str):
    """A ResNet-18 layer of `classic.LAYERS` by name, else an operator spec."""
    return classic.layer(name) if name in classic.LAYERS else parse(name)


def remeasure(op, target: str, configs: list[dict], times: int,
              lock: str | None) -> list[list[float]]:
    """`times` fresh measurements (seconds) of `op` built with each of `configs`, in rounds
    that measure every configuration once, so that a slow or fast spell of the host falls on
    all of them alike."""
    backend = resolve_target(target)[0]
    arts = [tsl.build(op, target, knobs=k) for k in configs]
    again: list[list[float]] = [[] for _ in arts]
    for _ in range(times):
        with exclusive(lock):
            for a, art in zip(again, arts):
                a.append(float(backend.measure(art).seconds))
    return again


def picks(r) -> list:
    """[trial, knobs] each time run `r` found a new best (by its own measurements): after
    trial n, the run's answer is the last pick at or before n."""
    out, best = [], math.inf
    for n, (knobs, _, seconds) in enumerate(r.log, 1):
        if seconds < best:
            best = seconds
            out.append([n, knobs])
    return out


def run_pair(x: str, y: str, target: str, trials: int, seeds: int, work: Path,
             progress, pool: int = 600, within: float | None = None, lock: str | None = None,
             times: int = 0) -> dict:
    machine = resolve_target(target)[1]
    within = WITHIN.get(machine.backend, 0.03) if within is None else within
    check = machine.backend != "vta"
    op_x, op_y = operator(x), operator(y)
    fn = tsl.default_schedule(op_y.name)
    if tsl.default_schedule(op_x.name) is not fn:
        raise tsl.InputError(f"pair {x}:{y}: a model transfers within one schedule; {op_x.name} "
                             f"and {op_y.name} have different ones")
    stem = {n: "".join(c if c.isalnum() else "_" for c in n) for n in (x, y)}
    src = tune.Database(work / f"{stem[x]}.jsonl")
    progress(f"{x}: tuning from scratch, {trials} trials")
    rx = tune.tune(op_x, target, trials=trials, seed=0, database=src, transfer=False,
                   runner=Memo(0, check, lock), pool=pool)
    runs = {"scratch": [], "transfer": []}
    for seed in range(seeds):
        for arm in runs:
            db = tune.Database(work / f"{stem[x]}-{stem[y]}-{arm}-{seed}.jsonl")  # not resumed
            if arm == "transfer":
                dst = db.model_path(machine, fn)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src.model_path(machine, fn), dst)
            r = tune.tune(op_y, target, trials=trials, seed=seed, database=db,
                          transfer=arm == "transfer", runner=Memo(seed, check, lock), pool=pool)
            assert r.transferred == (arm == "transfer")
            runs[arm].append(r)
            progress(f"{y} seed {seed} {arm}: best {r.seconds * 1e6:.2f} us, "
                     f"ranked by {r.ranked_by}, Spearman {r.spearman}")
    row = {"X": x, "Y": y, "target": machine.name, "trials": trials, "seeds": seeds,
           "pool": pool, "within": within, "X_best_s": rx.seconds, "X_best_knobs": rx.knobs,
           "Y_default_knobs": runs["scratch"][0].default_knobs}
    for arm, rs in runs.items():
        row[f"{arm}_picks"] = [picks(r) for r in rs]
        row[f"{arm}_spearman_own"] = [r.spearman_of(("own",)) for r in rs]
        row[f"{arm}_spearman_transferred"] = [r.spearman_of(("transferred",)) for r in rs]
    # Every configuration some run answered with at some trial, and Y's default, with the
    # measurement the runs saw and, with `times`, that many fresh ones (their median counts).
    tuned = {knobs_key(k): s for rs in runs.values() for r in rs
             for k, _, s in r.log}
    configs = {knobs_key(k): k for arm in runs for ps in row[f"{arm}_picks"]
               for _, k in ps}
    configs.setdefault(knobs_key(row["Y_default_knobs"]), row["Y_default_knobs"])
    if times:
        progress(f"{y}: measuring the {len(configs)} configurations the runs answered with "
                 f"{times} more times")
    again = remeasure(op_y, target, list(configs.values()), times, lock) if times else None
    row["answers"] = [{"knobs": k, "tuned_s": tuned[key], "again_s": again[i] if again else []}
                      for i, (key, k) in enumerate(configs.items())]
    row = reached(row)
    goal = next(a for a in row["answers"] if a["s"] == row["Y_goal_s"])["knobs"]
    ok, err = tsl.build(op_y, target, knobs=goal).verify()
    if not ok:
        raise tsl.LoweringError(f"{y}: the goal configuration {goal} is wrong ({err})")
    row["Y_goal_knobs"] = goal
    return row


def reached(row: dict) -> dict:
    """`row` with, per arm, the trials each run needed until its answer (the best by its own
    measurements) came within the tolerance of the goal — the fastest answer of any run, by
    the median of its fresh measurements where there are some (else by the measurement the
    runs saw) — and of the second goal, the final answer of the run from scratch with the
    same seed; with their medians."""
    trials, ok = row["trials"], 1 + row["within"]
    value = {}
    for a in row["answers"]:
        a["s"] = statistics.median(a["again_s"]) if a["again_s"] else a["tuned_s"]
        value[knobs_key(a["knobs"])] = a["s"]

    def trace(ps: list) -> list[float]:  # the answer's value after each trial
        out, cur, it = [], math.inf, iter(ps)
        nxt = next(it, None)
        for n in range(1, trials + 1):
            while nxt is not None and nxt[0] <= n:
                cur = value[knobs_key(nxt[1])]
                nxt = next(it, None)
            out.append(cur)
        return out

    traces = {arm: [trace(ps) for ps in row[f"{arm}_picks"]] for arm in ("scratch", "transfer")}
    row["Y_goal_s"] = min(min(tr) for trs in traces.values() for tr in trs)
    row["Y_default_s"] = value[knobs_key(row["Y_default_knobs"])]
    row["scratch_final_s"] = [tr[-1] for tr in traces["scratch"]]
    for arm, trs in traces.items():
        row[f"{arm}_traces"] = trs
        row[f"{arm}_final_median_s"] = statistics.median(tr[-1] for tr in trs)
        for suffix, goals in (("", [row["Y_goal_s"]] * len(trs)),
                              ("_to_scratch_final", row["scratch_final_s"])):
            reach = [trials_to(tr, g * ok) for tr, g in zip(trs, goals)]
            row[f"{arm}_trials{suffix}"] = reach
            # A run that never came within the tolerance counts as budget + 1 (">N").
            row[f"{arm}_median{suffix}"] = statistics.median(n or trials + 1 for n in reach)
    return row


def trials_to(trace: list[float], seconds: float) -> int | None:
    """The first trial after which the answer was within `seconds` (None: never)."""
    return next((n for n, t in enumerate(trace, 1) if t <= seconds), None)


def fmt_trials(n, trials) -> str:
    return f">{trials}" if n is None or n > trials else f"{n:g}"


def label(r: dict) -> str:
    return f"{r['X']} -> {r['Y']}"


def print_table(rows: list[dict]) -> None:
    lw = max(10, *(len(label(r)) for r in rows))
    for title, suffix in (("Trials until the run's answer is within the tolerance of the goal "
                           "(the fastest answer of any run)", ""),
                          ("Trials until the run's answer is within the tolerance of the final "
                           "answer of the run from scratch with the same seed",
                           "_to_scratch_final")):
        print(title)
        print(f"{'X -> Y':{lw}s} {'goal (us)':>10s}  {'scratch: median  per seed':34s}"
              f"{'transfer: median  per seed':34s}{'final us (scr/tr)':>18s}")
        for r in rows:
            t = r["trials"]
            cells = []
            for arm in ("scratch", "transfer"):
                per = ",".join(fmt_trials(n, t) for n in r[f"{arm}_trials{suffix}"])
                cells.append(f"{fmt_trials(r[f'{arm}_median{suffix}'], t):>6s}  [{per}]")
            goal = f"{r['Y_goal_s'] * 1e6:10.2f}" if not suffix else f"{'per seed':>10s}"
            print(f"{label(r):{lw}s} {goal}  {cells[0]:34s}{cells[1]:34s}"
                  f"{r['scratch_final_median_s'] * 1e6:8.2f}/"
                  f"{r['transfer_final_median_s'] * 1e6:.2f}")
        print()
    for r in rows:
        print(f"{label(r)}: goal {r['Y_goal_knobs']}, tolerance {r['within']:.0%}; "
              f"Y's default {r['Y_default_s'] * 1e6:.2f} us {r['Y_default_knobs']}")
        again = [a for a in r["answers"] if a["again_s"]]
        if again:
            spread = sorted(max(a["again_s"]) / min(a["again_s"]) - 1 for a in again)
            seen = sorted(a["tuned_s"] / a["s"] - 1 for a in again)
            print(f"  noise: {len(again)} answers measured {len(again[0]['again_s'])} more "
                  f"times each: spread (max / min - 1) median {statistics.median(spread):.1%}, "
                  f"max {spread[-1]:.1%}; the runs' measurement against the median of these: "
                  f"{seen[0]:+.1%} .. {seen[-1]:+.1%} (median {statistics.median(seen):+.1%})")
    print("\nSpearman of the learned model's predictions with the next batch, per seed")
    w = max(26, 6 * max(r["seeds"] for r in rows) + 2)  # "+0.12," per seed
    print(f"{'X -> Y':{lw}s} {'scratch, own model':{w}s}{'transfer, X model':{w}s}"
          f"{'transfer, own model':{w}s}")
    for r in rows:
        cols = [r["scratch_spearman_own"], r["transfer_spearman_transferred"],
                r["transfer_spearman_own"]]
        print(f"{label(r):{lw}s} " + "".join(
            f"{','.join('-' if v is None else f'{v:+.2f}' for v in c):{w}s}" for c in cols))


DEFAULT_PAIRS = {"vta": "C4:C7,C10:C7,C5:C7",
                 "cpu": "matmul 512x512x512 int8:matmul 1024x1024x1024 int8"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", help="comma-separated X:Y, each a ResNet-18 layer name or an "
                    f"operator spec (default: {DEFAULT_PAIRS})")
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--target", default="vta")
    ap.add_argument("--pool", type=int, default=600, help="candidates per run (tune's pool)")
    ap.add_argument("--within", type=float,
                    help=f"tolerance of 'reached the goal' (default: {WITHIN}, else 0.03)")
    ap.add_argument("--remeasure", type=int,
                    help="measure every answer of a run and Y's default this many more times; "
                    "their median is what counts (default: 0 on VTA, whose cycles are "
                    "deterministic, else 3)")
    ap.add_argument("--lock", help="hold an exclusive flock on this file while measuring")
    ap.add_argument("--json", help="also write the rows as JSON")
    ap.add_argument("--workdir")
    ap.add_argument("--show", nargs="+", metavar="JSON",
                    help="print the tables of rows written by --json (no run; --within applies)")
    args = ap.parse_args()
    if args.show:
        rows = [r for f in args.show for r in json.loads(Path(f).read_text())]
        for r in rows:
            r["within"] = r["within"] if args.within is None else args.within
        print_table([reached(r) for r in rows])
        return 0
    backend = resolve_target(args.target)[1].backend
    text = args.pairs or DEFAULT_PAIRS.get(backend, DEFAULT_PAIRS["cpu"])
    pairs = [p.split(":") for p in text.split(",")]
    if any(len(p) != 2 for p in pairs):
        ap.error(f"--pairs: comma-separated X:Y, got {text!r}")
    for name in {n for p in pairs for n in p}:
        try:
            operator(name)
        except tsl.TSLError as e:
            ap.error(f"--pairs: {name!r} is neither a layer of {sorted(classic.LAYERS)} nor an "
                     f"operator spec ({e})")
    times = args.remeasure if args.remeasure is not None else (0 if backend == "vta" else 3)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tsl-transfer-"))
    work.mkdir(parents=True, exist_ok=True)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    rows = [run_pair(x, y, args.target, args.trials, args.seeds, work, progress, args.pool,
                     args.within, args.lock, times) for x, y in pairs]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
