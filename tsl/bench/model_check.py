"""`python -m tsl.bench --model-check`: does the cost model rank knob settings the way the
machine does?

For every suite operator of every target that measures (CPU time) or simulates (VTA cycles),
draw random valid settings of the default schedule's knobs, build each, measure it with the
back end's `measure`, price it with `tsl.model.evaluate`, and report Spearman's rank
correlation between the two, with how far the model's own choice is from the best setting
measured. Targets whose `measure` is the model itself are skipped: a model checked against
itself says nothing.
"""

from __future__ import annotations

import math
import random

import numpy as np

from ..backend import resolve_target
from ..build import record
from ..errors import TSLError
from ..model import evaluate, record_fixed
from ..schedules import default_schedule


def ranks(v) -> np.ndarray:
    """Ranks from 0, ties sharing their average rank."""
    v = np.asarray(v, dtype=float)
    r = np.empty(len(v))
    r[v.argsort(kind="stable")] = np.arange(len(v))
    _, inv, counts = np.unique(v, return_inverse=True, return_counts=True)
    return (np.bincount(inv, weights=r) / counts)[inv]


def spearman(x, y) -> float:
    """Spearman's rank correlation of two equally long sequences (nan when either is flat)."""
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def draw(op, machine, backend, n: int, seed: int = 0, tries: int = 20):
    """Up to `n` distinct random knob settings of the default schedule that record and build,
    as (knobs, schedule, artifact); at most `tries` x `n` draws."""
    fn = default_schedule(op.name)
    chosen = record(op, machine)
    space = chosen.space
    rng = random.Random(seed)
    out, seen = [], set()
    candidates = [dict(chosen.knob_values)]
    for _ in range(tries * n):
        if len(out) >= n:
            break
        knobs = candidates.pop() if candidates else {k: rng.choice(v) for k, v in space.items()}
        key = tuple(sorted(knobs.items()))
        if key in seen:
            continue
        seen.add(key)
        try:
            s = record_fixed(op, machine, fn, knobs)
            out.append((knobs, s, backend.build(s)))
        except TSLError:
            continue  # does not fit, or a tile the back end refuses: not a valid setting
    return out


def check_op(op, target, n: int = 30, seed: int = 0) -> dict:
    """One row: Spearman(model, measurement) over `n` random settings of `op` on `target`."""
    backend, machine = resolve_target(target)
    drawn = draw(op, machine, backend, n, seed)
    model = [evaluate(s).seconds for _, s, _ in drawn]
    ests = [backend.measure(art) for _, _, art in drawn]
    real = [e.seconds for e in ests]
    best = min(range(len(real)), key=real.__getitem__)
    # drawn[0] is the model's own choice (the default knobs).
    return {"op": op.name, "shape": op.shape_str, "target": target, "n": len(drawn),
            "kind": ests[0].kind, "spearman": spearman(model, real),
            "default_vs_best": real[0] / real[best], "best_knobs": drawn[best][0]}


def run(targets, ops_filter, quick: bool, n: int, progress) -> list[dict]:
    rows = []
    for target in targets:
        backend, machine = resolve_target(target)
        why = backend.unavailable(machine)
        if why:
            rows.append({"target": target, "skipped": why})
            continue
        suite = [op for op in backend.suite(quick) if not ops_filter or op.name in ops_filter]
        for k, op in enumerate(suite, 1):
            progress(f"[model-check {target} {k}/{len(suite)}] {op} ...")
            try:
                row = check_op(op, target, n)
            except TSLError as e:
                row = {"op": op.name, "shape": op.shape_str, "target": target,
                       "skipped": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
            if row.get("kind") == "model":
                rows.append({"target": target, "skipped": "its measure is the model itself"})
                break
            rows.append(row)
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'op':<10} {'shape':<28} {'target':<14} {'n':>3} {'kind':<9} {'spearman':>8} "
          f"{'default/best':>12}")
    for r in rows:
        if "skipped" in r:
            print(f"{r.get('op', '-'):<10} {r.get('shape', '-'):<28} {r['target']:<14} "
                  f"skipped: {r['skipped']}")
            continue
        print(f"{r['op']:<10} {r['shape']:<28} {r['target']:<14} {r['n']:>3} {r['kind']:<9} "
              f"{r['spearman']:>8.2f} {r['default_vs_best']:>11.2f}x")
    vals = [r["spearman"] for r in rows if "spearman" in r and not math.isnan(r["spearman"])]
    if vals:
        print(f"spearman: min {min(vals):.2f}, median {float(np.median(vals)):.2f} over "
              f"{len(vals)} operators")
