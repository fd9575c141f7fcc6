"""The tuning database's numbers: its load time, and what `knobs=db` adds to a build.

    python benchmarks/tune_numbers.py [--target vta] [--workdir DIR]

1. A database of 1,000 records (one operator, random knobs) is written, then loaded: seconds.
2. `tsl.build(op, target, knobs=db)` against `tsl.build(op, target, knobs=<the same dict>)`,
   medians of 5: the difference is what looking the record up adds.

What the learned model's transfer is worth: benchmarks/tune_transfer.py.
"""

from __future__ import annotations

import argparse
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


def operator(target: str):
    if target.startswith("vta"):
        from tsl.backends.vta import classic

        return classic.gemm(16, 128, 64)
    return tsl.ops.matmul(256, 512, 256)


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="vta")
    ap.add_argument("--workdir")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tsl-tune-numbers-"))
    work.mkdir(parents=True, exist_ok=True)
    for k, v in database_numbers(operator(args.target), args.target, work).items():
        print(f"database  {k:22s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
