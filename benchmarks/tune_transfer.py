"""Is the learned model worth transferring? Trials to reach the best, with and without it.

    python benchmarks/tune_transfer.py [--pairs C4:C7,C10:C7,C5:C7] [--trials 32] [--seeds 5]
                                       [--target vta] [--pool 600] [--json FILE] [--workdir DIR]

For each pair X:Y of ResNet-18 layers (docs/vta.md §6, int8 with VTA's requantization):
1. X is tuned from scratch (`--trials`, seed 0); the run saves its learned model beside its
   database.
2. Y is tuned with the same budget for every seed, twice: from scratch (`transfer=False`, its
   own empty database) and with X's model copied beside its database (`transfer=True`). The two
   runs of a seed share the candidate pool and differ only by the model ranking the batches
   before the run has 2 batches of its own measurements (then both train on their own).
3. The goal for Y is the best configuration any of its runs found (all seeds, both arms). Per
   run: the trials it needed to come within 1% of the goal (">N": it did not within its
   budget). The table gives the median over seeds of each arm, the per-seed values, and the
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
"""

from __future__ import annotations

import argparse
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

WITHIN = 0.01


class Memo(tune.Runner):
    """`LocalRunner(check=False)`, remembering each outcome by (operator, knobs) across runs:
    simulated cycles are a function of the program."""

    outcomes: dict = {}

    def __init__(self, seed: int = 0):
        self.inner = tune.LocalRunner(check=False, seed=seed)

    def run(self, schedules, schedule_fn):
        keys = [(tune.signature(s.op), json.dumps(s.knob_values, sort_keys=True))
                for s in schedules]
        new = [(k, s) for k, s in zip(keys, schedules) if k not in self.outcomes]
        for (k, _), o in zip(new, self.inner.run([s for _, s in new], schedule_fn)):
            self.outcomes[k] = o
        return [self.outcomes[k] for k in keys]


def run_pair(x: str, y: str, target: str, trials: int, seeds: int, work: Path,
             progress, pool: int = 600) -> dict:
    machine = resolve_target(target)[1]
    op_x, op_y = classic.layer(x), classic.layer(y)
    fn = tsl.default_schedule("conv2d")
    src = tune.Database(work / f"{x}.jsonl")
    progress(f"{x}: tuning from scratch, {trials} trials")
    rx = tune.tune(op_x, target, trials=trials, seed=0, database=src, transfer=False,
                   runner=Memo(), pool=pool)
    runs = {"scratch": [], "transfer": []}
    for seed in range(seeds):
        for arm in runs:
            db = tune.Database(work / f"{x}-{y}-{arm}-{seed}.jsonl")  # a new run, not resumed
            if arm == "transfer":
                dst = db.model_path(machine, fn)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src.model_path(machine, fn), dst)
            r = tune.tune(op_y, target, trials=trials, seed=seed, database=db,
                          transfer=arm == "transfer", runner=Memo(seed), pool=pool)
            assert r.transferred == (arm == "transfer")
            runs[arm].append(r)
            progress(f"{y} seed {seed} {arm}: best {r.seconds * 1e6:.2f} us, "
                     f"ranked by {r.ranked_by}, Spearman {r.spearman}")
    best = min((r for rs in runs.values() for r in rs), key=lambda r: r.seconds)
    goal = best.seconds
    ok, err = tsl.build(op_y, target, knobs=best.knobs).verify()
    if not ok:
        raise tsl.LoweringError(f"{y}: the goal configuration {best.knobs} is wrong ({err})")
    row = {"X": x, "Y": y, "trials": trials, "seeds": seeds, "X_best_s": rx.seconds,
           "Y_goal_s": goal, "Y_goal_knobs": best.knobs}
    for arm, rs in runs.items():
        reach = [r.trials_to(goal * (1 + WITHIN)) for r in rs]
        row[f"{arm}_trials"] = reach
        # A run that never came within 1% counts as budget + 1 (">N") in the median.
        row[f"{arm}_median"] = statistics.median(n or trials + 1 for n in reach)
        row[f"{arm}_best_median_s"] = statistics.median(r.seconds for r in rs)
        row[f"{arm}_traces"] = [r.trace for r in rs]  # best so far after each trial
        row[f"{arm}_spearman_own"] = [r.spearman_of(("own",)) for r in rs]
        row[f"{arm}_spearman_transferred"] = [r.spearman_of(("transferred",)) for r in rs]
    return row


def fmt_trials(n, trials) -> str:
    return f">{trials}" if n is None or n > trials else f"{n:g}"


def print_table(rows: list[dict]) -> None:
    print(f"{'X -> Y':10s} {'goal (us)':>10s}  {'scratch: median  per seed':34s}"
          f"{'transfer: median  per seed':34s}{'best us (scr/tr)':>18s}")
    for r in rows:
        t = r["trials"]
        cells = []
        for arm in ("scratch", "transfer"):
            per = ",".join(fmt_trials(n, t) for n in r[f"{arm}_trials"])
            cells.append(f"{fmt_trials(r[f'{arm}_median'], t):>6s}  [{per}]")
        print(f"{r['X'] + ' -> ' + r['Y']:10s} {r['Y_goal_s'] * 1e6:10.2f}  "
              f"{cells[0]:34s}{cells[1]:34s}"
              f"{r['scratch_best_median_s'] * 1e6:8.2f}/{r['transfer_best_median_s'] * 1e6:.2f}")
    print("\nSpearman of the learned model's predictions with the next batch, per seed")
    w = max(26, 6 * max(r["seeds"] for r in rows) + 2)  # "+0.12," per seed
    print(f"{'X -> Y':10s} {'scratch, own model':{w}s}{'transfer, X model':{w}s}"
          f"{'transfer, own model':{w}s}")
    for r in rows:
        cols = [r["scratch_spearman_own"], r["transfer_spearman_transferred"],
                r["transfer_spearman_own"]]
        print(f"{r['X'] + ' -> ' + r['Y']:10s} " + "".join(
            f"{','.join('-' if v is None else f'{v:+.2f}' for v in c):{w}s}" for c in cols))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", default="C4:C7,C10:C7,C5:C7",
                    help="source:target ResNet-18 layers (default: C4:C7,C10:C7,C5:C7)")
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--target", default="vta")
    ap.add_argument("--pool", type=int, default=600, help="candidates per run (tune's pool)")
    ap.add_argument("--json", help="also write the rows as JSON")
    ap.add_argument("--workdir")
    args = ap.parse_args()
    pairs = [p.split(":") for p in args.pairs.split(",")]
    bad = [n for p in pairs for n in p if n not in classic.LAYERS]
    if bad or any(len(p) != 2 for p in pairs):
        ap.error(f"--pairs: X:Y of {sorted(classic.LAYERS)}, got {args.pairs!r}")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tsl-transfer-"))
    work.mkdir(parents=True, exist_ok=True)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    rows = [run_pair(x, y, args.target, args.trials, args.seeds, work, progress, args.pool)
            for x, y in pairs]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
