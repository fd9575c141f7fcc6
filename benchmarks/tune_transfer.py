"""Is the learned model worth transferring? Trials to reach the best, with and without it.

    python benchmarks/tune_transfer.py [--pairs C4:C7,C10:C7,C5:C7] [--trials 32] [--seeds 5]
                                       [--target vta] [--pool 600] [--json FILE] [--workdir DIR]
    TSL_TIMING=realtime python benchmarks/tune_transfer.py --target cpu \
        --pairs "matmul 512x512x512 int8:matmul 1024x1024x1024 int8" [--within 0.03]
        [--lock /tmp/rt.lock] [--remeasure 5]

For each pair X:Y of operators — ResNet-18 layers by name (docs/vta.md §6, int8 with VTA's
requantization) or operator specs as `python -m tsl.tune` takes them:
1. X is tuned from scratch (`--trials`, seed 0); the run saves its learned model beside its
   database.
2. Y is tuned with the same budget for every seed, twice: from scratch (`transfer=False`, its
   own empty database) and with X's model copied beside its database (`transfer=True`). The two
   runs of a seed share the candidate pool and differ only by the model ranking the batches
   before the run has 2 batches of its own measurements (then both train on their own).
3. The goal for Y is the best configuration any of its runs found (all seeds, both arms). Per
   run: the trials it needed to come within `--within` of the goal (default 1% on VTA, 3% on
   CPU; ">N": it did not within its budget). The table gives the median over seeds of each arm, the per-seed values, and the
   median best each arm reached; then, per run, the Spearman correlation of the learned
   model's predictions with the next batch's measurements, over the batches ranked by X's
   model (transfer only) and over those ranked by the run's own model.
The default pairs tune C7 from each of three other layers: on C4, C8 and C10 the default knobs
(the analytic model's first choice) are the best any run finds, so every run, with or without
a model, reaches it at trial 1; C7's fastest program is one the analytic model prices 46% too
slow (rank 24 in the analytic order of the pool's top 60), the case a learned model is for.
The VTA cycle model's counts are deterministic: the runs differ only by what they chose to
measure, never by noise. They depend on the program, not on the data, so the runs skip the
per-configuration check against NumPy (the functional simulation of a whole layer, most of a
trial's time here); the goal configuration of each Y is built and verified at the end. For the
same reason a configuration another run of this process measured is not simulated again (it
still counts as a trial of every run that measures it).
On the CPU the measurements are times, so noisy: every configuration is still checked against
NumPy, and measured once per process — the runs that choose it share that measurement, so the
two arms differ only by what they chose to measure, never by the luck of a timing. The noise
is then measured on its own: the goal configuration and Y's default knobs are measured again
`--remeasure` times, and the spread (max / min - 1) is printed beside the tolerance, which
must exceed it. Time with `TSL_TIMING=realtime` on a shared host; `--lock FILE` holds an
exclusive flock on FILE while each batch is measured (only one real-time timer at a time on
the host), not while the tuner builds candidates and ranks them.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
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
from tsl.tune.opspec import parse  # noqa: E402

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
        keys = [(tune.signature(s.op), json.dumps(s.knob_values, sort_keys=True))
                for s in schedules]
        new = [(k, s) for k, s in zip(keys, schedules) if k not in self.outcomes]
        if new:
            with locked(self.lock):
                outs = self.inner.run([s for _, s in new], schedule_fn)
            for (k, _), o in zip(new, outs):
                self.outcomes[k] = o
        return [self.outcomes[k] for k in keys]


@contextlib.contextmanager
def locked(path: str | None):
    if path is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def operator(name: str):
    """A ResNet-18 layer of `classic.LAYERS` by name, else an operator spec."""
    return classic.layer(name) if name in classic.LAYERS else parse(name)


def remeasure(op, target: str, knobs: dict, times: int, lock: str | None) -> list[float]:
    """`times` fresh measurements of `op` built with `knobs` (seconds)."""
    backend = resolve_target(target)[0]
    art = tsl.build(op, target, knobs=knobs)
    with locked(lock):
        return [float(backend.measure(art).seconds) for _ in range(times)]


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
    best = min((r for rs in runs.values() for r in rs), key=lambda r: r.seconds)
    goal = best.seconds
    ok, err = tsl.build(op_y, target, knobs=best.knobs).verify()
    if not ok:
        raise tsl.LoweringError(f"{y}: the goal configuration {best.knobs} is wrong ({err})")
    row = {"X": x, "Y": y, "target": machine.name, "trials": trials, "seeds": seeds,
           "pool": pool, "within": within, "X_best_s": rx.seconds, "X_best_knobs": rx.knobs,
           "Y_goal_s": goal, "Y_goal_knobs": best.knobs,
           "Y_default_s": runs["scratch"][0].default_seconds,
           "Y_default_knobs": runs["scratch"][0].default_knobs}
    if times:  # the noise of a measurement, beside the tolerance
        for name in ("goal", "default"):
            row[f"Y_{name}_again_s"] = remeasure(op_y, target, row[f"Y_{name}_knobs"], times,
                                                 lock)
    for arm, rs in runs.items():
        row[f"{arm}_best_s"] = [r.seconds for r in rs]
        row[f"{arm}_traces"] = [r.trace for r in rs]  # best so far after each trial
        row[f"{arm}_spearman_own"] = [r.spearman_of(("own",)) for r in rs]
        row[f"{arm}_spearman_transferred"] = [r.spearman_of(("transferred",)) for r in rs]
    return reached(row)


def reached(row: dict) -> dict:
    """`row` with, per arm, the trials each run needed to come within the tolerance of the goal
    (the best of all runs), and of the best the run from scratch of the same seed reached in
    the budget (the second goal), with their medians (from the runs' traces)."""
    trials, ok = row["trials"], 1 + row["within"]
    row["scratch_best_s"] = [min(tr) for tr in row["scratch_traces"]]
    for arm in ("scratch", "transfer"):
        traces = row[f"{arm}_traces"]
        row[f"{arm}_best_median_s"] = statistics.median(min(tr) for tr in traces)
        for suffix, goals in (("", [row["Y_goal_s"]] * len(traces)),
                              ("_to_scratch_best", row["scratch_best_s"])):
            reach = [trials_to(tr, g * ok) for tr, g in zip(traces, goals)]
            row[f"{arm}_trials{suffix}"] = reach
            # A run that never came within the tolerance counts as budget + 1 (">N").
            row[f"{arm}_median{suffix}"] = statistics.median(n or trials + 1 for n in reach)
    return row


def trials_to(trace: list[float], seconds: float) -> int | None:
    """`TuneResult.trials_to` of a saved trace."""
    return next((n for n, t in enumerate(trace, 1) if t <= seconds), None)


def fmt_trials(n, trials) -> str:
    return f">{trials}" if n is None or n > trials else f"{n:g}"


def label(r: dict) -> str:
    return f"{r['X']} -> {r['Y']}"


def print_table(rows: list[dict]) -> None:
    lw = max(10, *(len(label(r)) for r in rows))
    for title, suffix in (("Trials to reach the goal (the best any run of Y found)", ""),
                          ("Trials to reach the best the run from scratch of the same seed "
                           "reached in the budget", "_to_scratch_best")):
        print(title)
        print(f"{'X -> Y':{lw}s} {'goal (us)':>10s}  {'scratch: median  per seed':34s}"
              f"{'transfer: median  per seed':34s}{'best us (scr/tr)':>18s}")
        for r in rows:
            t = r["trials"]
            cells = []
            for arm in ("scratch", "transfer"):
                per = ",".join(fmt_trials(n, t) for n in r[f"{arm}_trials{suffix}"])
                cells.append(f"{fmt_trials(r[f'{arm}_median{suffix}'], t):>6s}  [{per}]")
            goal = f"{r['Y_goal_s'] * 1e6:10.2f}" if not suffix else f"{'per seed':>10s}"
            print(f"{label(r):{lw}s} {goal}  {cells[0]:34s}{cells[1]:34s}"
                  f"{r['scratch_best_median_s'] * 1e6:8.2f}/"
                  f"{r['transfer_best_median_s'] * 1e6:.2f}")
        print()
    for r in rows:
        print(f"{label(r)}: goal {r['Y_goal_knobs']}, tolerance {r['within']:.0%}; "
              f"Y's default {r['Y_default_s'] * 1e6:.2f} us {r['Y_default_knobs']}")
        for name in ("goal", "default"):
            again = r.get(f"Y_{name}_again_s")
            if again:
                print(f"  {name} measured {len(again)} more times: "
                      f"{' '.join(f'{s * 1e6:.2f}' for s in again)} us, "
                      f"spread {max(again) / min(again) - 1:.1%}")
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
                    help="measure the goal and Y's default this many more times, for the noise "
                    "(default: 0 on VTA, whose cycles are deterministic, else 5)")
    ap.add_argument("--lock", help="hold an exclusive flock on this file while measuring")
    ap.add_argument("--json", help="also write the rows as JSON")
    ap.add_argument("--workdir")
    ap.add_argument("--show", nargs="+", metavar="JSON",
                    help="print the tables of rows written by --json (no run)")
    args = ap.parse_args()
    if args.show:
        print_table([reached(r) for f in args.show for r in json.loads(Path(f).read_text())])
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
    times = args.remeasure if args.remeasure is not None else (0 if backend == "vta" else 5)
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
