"""`python -m tsl.bench --model-check`: does the cost model rank knob settings the way the
machine does?

For every suite operator of every target that measures (CPU time) or simulates (VTA cycles),
draw valid settings of the default schedule's knobs spread over the model's range (`draw`),
build each, measure it with the back end's `measure` (a clock several times, in alternating
order, keeping the median), price it with `tsl.model.evaluate`, and report Spearman's rank
correlation between the two, how far the model's own choice is from the best setting
measured, and for a clock its noise floor (`check_op`). Targets whose `measure` is the model
itself are skipped: a model checked against itself says nothing.

With `--trials N`, each row also compares the default knobs with the best of an N-program
`tsl.tune` search. On a quiet host:
`python -m tsl.bench --model-check --targets cpu --quick --trials 64`.
"""

from __future__ import annotations

import math
import random

import numpy as np

from ..backend import resolve_target
from ..record import record
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


def draw(op, machine, backend, n: int, seed: int = 0, pool: int = 8):
    """Up to `n` distinct valid knob settings of the default schedule, built, as (knobs,
    schedule, artifact): the model's own choice first, then settings spread over the range
    the model predicts. A pool of `pool` x `n` random settings is recorded and priced (cheap:
    nothing is built), and the settings nearest to times evenly spaced (in log) between the
    fastest and the slowest prediction are built: uniform draws land mostly on settings within a few percent of one another, whose
    order on a shared machine is noise, and a rank correlation over them says nothing."""
    fn = default_schedule(op.name)
    chosen = record(op, machine)
    space = chosen.space
    rng = random.Random(seed)
    priced, seen = [], set()
    for knobs in [dict(chosen.knob_values)] + [{k: rng.choice(v) for k, v in space.items()}
                                               for _ in range(pool * n)]:
        try:
            s = record_fixed(op, machine, fn, knobs)
        except TSLError:
            continue  # does not fit: not a valid setting
        key = tuple(sorted(s.knob_values.items()))
        if key not in seen:
            seen.add(key)
            priced.append((evaluate(s).seconds, dict(s.knob_values), s))
    first, rest = priced[0], sorted(priced[1:], key=lambda c: c[0])
    order, spare = [first], list(rest)
    if rest:
        # The setting nearest each of n - 1 times evenly spaced in log between the fastest
        # and the slowest the model predicts (many settings share one predicted time).
        lo, hi = math.log(rest[0][0]), math.log(rest[-1][0])
        for i in range(n - 1):
            if not spare:
                break
            target = lo + (hi - lo) * i / max(n - 2, 1)
            order.append(spare.pop(min(range(len(spare)),
                                       key=lambda j: abs(math.log(spare[j][0]) - target))))
    out = []
    for _, knobs, s in order + spare:
        if len(out) >= n:
            break
        try:
            out.append((knobs, s, backend.build(s)))
        except TSLError:
            continue  # a tile the back end refuses: not a valid setting
    return out


def measure_all(backend, arts, rounds: int, seed: int = 0):
    """Seconds per artifact per round, and whether the measurement is deterministic. A
    simulator is measured once; a clock `rounds` times, every round in another order
    (forward, backward, then shuffled) so that a slow spell of the machine does not fall on
    the same settings each time."""
    first = [backend.measure(a) for a in arts]
    times = [[e.seconds] for e in first]
    if first[0].kind != "measured":
        return times, first[0].kind
    rng = random.Random(seed)
    for r in range(1, rounds):
        idx = list(range(len(arts)))[::-1] if r == 1 else rng.sample(range(len(arts)), len(arts))
        for i in idx:
            times[i].append(backend.measure(arts[i]).seconds)
    return times, "measured"


def check_op(op, target, n: int = 30, seed: int = 0, rounds: int = 3) -> dict:
    """One row: Spearman(model, measurement) over `n` knob settings of `op` on `target`
    (see `draw`). A clock is read `rounds` times per setting and the median kept; the row
    also says how noisy that is: `noise` is the median relative spread (max - min over
    median) of a setting's rounds, `retest` the Spearman of the first round with the second
    (how well the measurement ranks the settings against itself: the most the model can
    reach), and `resolved` the share of pairs of settings whose medians differ by more than
    the noise."""
    backend, machine = resolve_target(target)
    drawn = draw(op, machine, backend, n, seed)
    model = [evaluate(s).seconds for _, s, _ in drawn]
    times, kind = measure_all(backend, [a for _, _, a in drawn], rounds, seed)
    real = [float(np.median(t)) for t in times]
    best = min(range(len(real)), key=real.__getitem__)
    row = {"op": op.name, "shape": op.shape_str, "dtype": op.dtype, "target": target,
           "n": len(drawn), "kind": kind, "spearman": spearman(model, real),
           # drawn[0] is the model's own choice (the default knobs).
           "default_vs_best": real[0] / real[best], "best_knobs": drawn[best][0],
           "model_seconds": model, "seconds": times}
    if kind == "measured" and rounds > 1:
        spread = [(max(t) - min(t)) / np.median(t) for t in times]
        noise = float(np.median(spread))
        pairs = [(i, j) for i in range(len(real)) for j in range(i)]
        row.update(noise=noise, retest=spearman([t[0] for t in times], [t[1] for t in times]),
                   resolved=sum(abs(real[i] / real[j] - 1) > noise for i, j in pairs)
                   / max(len(pairs), 1))
    return row


def versus_tuned(op, target, trials: int, rounds: int = 3) -> dict:
    """The model's default knobs against the best of a `trials`-program `tsl.tune` search:
    the two programs timed again in alternating order (`rounds` times each; once for a
    simulator), so that the search's best is not a lucky reading of a noisy clock."""
    from ..tune import tune

    backend, machine = resolve_target(target)
    result = tune(op, target, trials=trials)
    arts = [backend.build(record(op, machine)), backend.build(record(op, machine,
                                                                     knobs=result.knobs))]
    times, _ = measure_all(backend, arts, rounds)
    default, tuned = (float(np.median(t)) for t in times)
    return {"default_vs_tuned": default / tuned, "tuned_knobs": result.knobs,
            "tune_trials": trials}


def run(targets, ops_filter, quick: bool, n: int, progress, rounds: int = 3,
        trials: int = 0) -> list[dict]:
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
                row = check_op(op, target, n, rounds=rounds)
                if trials and row["kind"] != "model":
                    progress(f"[model-check {target} {k}/{len(suite)}] {op}: {trials}-program "
                             f"search ...")
                    row.update(versus_tuned(op, target, trials, rounds))
            except TSLError as e:
                row = {"op": op.name, "shape": op.shape_str, "dtype": op.dtype,
                       "target": target,
                       "skipped": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
            if row.get("kind") == "model":
                rows.append({"target": target, "skipped": "its measure is the model itself"})
                break
            rows.append(row)
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'op':<10} {'shape':<28} {'dtype':<8} {'target':<14} {'n':>3} {'kind':<9} "
          f"{'spearman':>8} {'default/best':>12} {'noise':>6} {'retest':>6} {'resolved':>8}"
          + (f" {'def/tuned':>10}" if any("default_vs_tuned" in r for r in rows) else ""))
    for r in rows:
        if "skipped" in r:
            print(f"{r.get('op', '-'):<10} {r.get('shape', '-'):<28} {r.get('dtype', '-'):<8} "
                  f"{r['target']:<14} skipped: {r['skipped']}")
            continue
        noise = (f" {100 * r['noise']:>5.1f}% {r['retest']:>6.2f} {100 * r['resolved']:>7.0f}%"
                 if "noise" in r else f" {'-':>6} {'-':>6} {'-':>8}")
        if "default_vs_tuned" in r:
            noise += f" {r['default_vs_tuned']:>9.2f}x"
        print(f"{r['op']:<10} {r['shape']:<28} {r['dtype']:<8} {r['target']:<14} {r['n']:>3} "
              f"{r['kind']:<9} {r['spearman']:>8.2f} {r['default_vs_best']:>11.2f}x{noise}")
    vals = [r["spearman"] for r in rows if "spearman" in r and not math.isnan(r["spearman"])]
    if vals:
        print(f"spearman: min {min(vals):.2f}, median {float(np.median(vals)):.2f} over "
              f"{len(vals)} operators")
    if any("noise" in r for r in rows):
        print("noise: median (max - min) / median of a setting's rounds; retest: Spearman of "
              "round 1 with round 2 (the clock against itself); resolved: pairs of settings "
              "whose medians differ by more than the noise")
    if any("default_vs_tuned" in r for r in rows):
        print("def/tuned: the default knobs' time over the best of a tsl.tune search of "
              f"{rows[-1].get('tune_trials', '?')} programs, both timed again in alternation")
