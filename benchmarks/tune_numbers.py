"""The tuner's numbers that are not a kernel's time: database load time, what `knobs=db` adds
to a build, and what the learned model's transfer is worth.

    python benchmarks/tune_numbers.py [--target vta] [--trials 32] [--workdir DIR]

1. A database of 1,000 records (one operator, random knobs) is written, then loaded: seconds.
2. `tsl.build(op, target, knobs=db)` against `tsl.build(op, target, knobs=<the same dict>)`,
   medians of 5: the difference is what looking the record up adds.
3. Transfer: operator A is tuned (`--trials`), which saves the learned model beside its
   database. Operator B (same family, another shape) is then tuned twice with the same budget
   and seed: from scratch, and starting from A's model. For each: its best, the trials it
   needed to reach the scratch run's best, and the Spearman correlation of the model's
   predictions with the measurements that followed them.
The default target is the VTA simulator: its cycle model is deterministic, so the two runs of
B differ only by the ranking.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tsl  # noqa: E402
from tsl import tune  # noqa: E402
from tsl.tune.database import Database, Key, make_record  # noqa: E402


def operators(target: str):
    if target.startswith("vta"):
        from tsl.backends.vta import classic

        return classic.gemm(32, 256, 128), classic.gemm(16, 128, 64)
    return tsl.ops.matmul(256, 256, 512), tsl.ops.matmul(256, 512, 256)


def database_numbers(op, target: str, work: Path) -> dict:
    from tsl.backend import resolve_target

    _, machine = resolve_target(target)
    fn = tsl.default_schedule(op.name)
    key = Key.of(op, machine, fn)
    s = tsl.schedule(op, target)
    rng = np.random.default_rng(0)
    db = Database(work / "big.jsonl")
    for n in range(1000):
        knobs = {k: v[rng.integers(len(v))] for k, v in s.space.items()}
        t = float(rng.uniform(1e-4, 1e-3))
        db.add(make_record(key, knobs, t, "seconds", t))
    # The best record must build: give the default knobs the best time.
    db.add(make_record(key, s.knob_values, 1e-5, "seconds", 1e-5))
    best = s.knob_values
    t0 = time.perf_counter()
    loaded = Database(db.path)
    load_s = time.perf_counter() - t0
    with_db, with_dict = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        tsl.build(op, target, knobs=loaded)
        with_db.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        tsl.build(op, target, knobs=dict(best))
        with_dict.append(time.perf_counter() - t0)
    return {"records": len(loaded), "load_s": load_s,
            "build_with_db_s": float(np.median(with_db)),
            "build_with_dict_s": float(np.median(with_dict)),
            "added_s": float(np.median(with_db) - np.median(with_dict))}


def transfer_numbers(a, b, target: str, trials: int, work: Path) -> dict:
    src = Database(work / "a.jsonl")
    ra = tune.tune(a, target, trials=trials, database=src)
    scratch = tune.tune(b, target, trials=trials, database=work / "b0.jsonl", transfer=False)
    warm_db = Database(work / "b1.jsonl")
    from tsl.backend import resolve_target

    machine = resolve_target(target)[1]
    fn = tsl.default_schedule(b.name)
    dst = warm_db.model_path(machine, fn)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src.model_path(machine, fn), dst)
    warm = tune.tune(b, target, trials=trials, database=warm_db)
    assert warm.transferred
    goal = scratch.seconds
    return {"A": str(a), "B": str(b), "trials": trials, "A_best_s": ra.seconds,
            "A_spearman": ra.run_spearman,
            "scratch_best_s": scratch.seconds, "scratch_trials_to_best": scratch.trials_to(goal),
            "scratch_spearman": scratch.run_spearman,
            "transfer_best_s": warm.seconds, "transfer_trials_to_scratch_best":
                warm.trials_to(goal), "transfer_spearman": warm.run_spearman}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="vta")
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--workdir")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tsl-tune-numbers-"))
    work.mkdir(parents=True, exist_ok=True)
    a, b = operators(args.target)
    for k, v in database_numbers(b, args.target, work).items():
        print(f"database  {k:22s} {v}")
    for k, v in transfer_numbers(a, b, args.target, args.trials, work).items():
        print(f"transfer  {k:32s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
