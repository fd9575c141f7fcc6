"""`python -m tsl.bench --dynamic`: shape-generic builds (issue #25) against static ones.

Per family and value: the dynamic artifact (`tsl.build(family)`: built once) against a
static build of that value, both called with their constants bound (`bind`), timed paired
(`_paired`: rounds of alternated calls, the row's ratio the median of the rounds' ratios; each
round with ``TSL_TIMING_LOCK=<file>`` under an exclusive lock on that file,
`tsl.timing.exclusive`, so no cooperating timing on the host overlaps, and with
``TSL_TIMING=realtime`` at real-time priority, `tsl.timing.realtime`), and the peers of the
operator at that value timed alone (`tsl.bench.alone`: NumPy, PyTorch, and ONNX Runtime
running a model whose rows are a dynamic axis, as the peers that take dynamic shapes
natively). Also the family's compile time and its kernels. The ">= within 10%" numbers are
read here, never asserted in tests.

With ``--tune N`` (`tuned`): each family tuned once with 2 x N trials (`tsl.tune.tune(family)`)
against a static N-trial tune of every value, each built from its database and timed as above;
the tuning times beside (less any waits for the timing lock: other processes' timings).
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import numpy as np

from ..timing import exclusive, realtime, waited_seconds

VALUES = (1, 5, 16, 31, 64, 100, 128, 200, 333, 512, 1000, 2048)
QUICK_VALUES = (1, 31, 100, 333)
# Rounds per row, and each party's calls per round: at least CALLS, and ROUND_S seconds of them.
# A row of 0.13-0.15 ms calls read 1.10 from 9 alternated calls and 0.98 over 9 rounds of
# them in one process (benchmarks/README.md, lead45): the guest's speed moves within seconds.
ROUNDS, CALLS, ROUND_S = 7, 9, 0.05


def spread(ratios: list[float], what: str = "dyn/static") -> str:
    """A family's summary line: the geo-mean and the worst of its rows' ratios."""
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    return f"geo-mean {what} {geo:.3f}, worst {max(ratios):.3f}"


def families(upper: int):
    import tsl
    from tsl.ops import sym

    m = sym("m", upper=upper)
    s = sym("s", upper=upper)
    return [("dense 768->3072", tsl.ops.dense(m, 768, 3072, epilogue=tsl.ops.bias())),
            ("dense 3072->768", tsl.ops.dense(m, 3072, 768, epilogue=tsl.ops.bias())),
            ("dense 768->2304", tsl.ops.dense(m, 768, 2304, epilogue=tsl.ops.bias())),
            ("attention scores 12 x s x s x 64", tsl.ops.batch_matmul(12, s, s, 64,
                                                                       transpose_b=True))]


def _paired(f, g, args_f, args_g) -> tuple[float, float, float]:
    """(f's seconds, g's seconds, f / g): ROUNDS rounds, each calling f and g alternately, one
    call each, CALLS times or for ROUND_S of each's calls if more; per round the two's medians
    and their ratio; returned, the medians of those over the rounds (a ratio read within each
    round, as `tsl.bench.imported` reads a model's: both parties see the same moments of the
    host)."""
    f(*args_f), g(*args_g)
    t = time.perf_counter()
    f(*args_f), g(*args_g)
    calls = max(CALLS, math.ceil(ROUND_S / max(time.perf_counter() - t, 1e-9) * 2))
    tf, tg, q = [], [], []
    for _ in range(ROUNDS):
        a, b = [], []
        with exclusive(), realtime():
            for _ in range(calls):
                t = time.perf_counter()
                f(*args_f)
                a.append(time.perf_counter() - t)
                t = time.perf_counter()
                g(*args_g)
                b.append(time.perf_counter() - t)
        tf.append(np.median(a))
        tg.append(np.median(b))
        q.append(tf[-1] / tg[-1])
    return float(np.median(tf)), float(np.median(tg)), float(np.median(q))


def row(name, fam, art, v, peers) -> dict:
    import tsl

    op = fam.at(**{next(iter(fam.syms)): v})
    xs = op.random_inputs(7)
    static = tsl.build(op, "cpu")
    consts = {t.name: x for t, x in zip(op.inputs, xs) if t.name in static.constants()}
    free = [x for t, x in zip(op.inputs, xs) if t.name not in consts]
    ok, err = op.check(art.run(*xs), op.reference(*xs))
    td, ts, q = _paired(art.bind(**consts), static.bind(**consts), free, free)
    out = {"family": name, "value": v, "dynamic_s": td, "static_s": ts, "ratio": q,
           "verified": ok, "error": err, "pieces": art.pieces(v)}
    if peers:
        from .alone import cpu_peers

        with exclusive(), realtime():
            out["peers"] = {k: p["seconds"] for k, p in cpu_peers(static.machine.cores())(op)
                            .items()}
    return out


def main(quick: bool = False, peers: bool = True, upper: int = 2048) -> list[dict]:
    import tsl
    from tsl.backend import resolve_target

    # The process's one-time import of TVM and the host's detection (4-5 s here) are no
    # family's compile: done before the first family's build is timed, as for the others.
    resolve_target("cpu")
    rows = []
    for name, fam in families(upper):
        t0 = time.perf_counter()
        art = tsl.build(fam, "cpu")
        compile_s = time.perf_counter() - t0
        print(f"\n{name}: one build {compile_s:.1f} s, {len(art.kernels)} kernels "
              f"({'run-time extents' if art.kernels[0].blocks else 'per-rung, padded'})",
              flush=True)
        print(f"  {'value':>6} {'dynamic ms':>11} {'static ms':>10} {'dyn/static':>10} "
              f"{'ok':>3}  peers (ms)", flush=True)
        ratios = []
        for v in QUICK_VALUES if quick else VALUES:
            r = row(name, fam, art, v, peers)
            r["compile_s"] = compile_s
            rows.append(r)
            ratios.append(r["ratio"])
            pe = ", ".join(f"{k} {s * 1e3:.3f}" for k, s in r.get("peers", {}).items())
            print(f"  {v:>6} {r['dynamic_s'] * 1e3:>11.3f} {r['static_s'] * 1e3:>10.3f} "
                  f"{r['ratio']:>10.3f} {'yes' if r['verified'] else 'NO':>3}  {pe}",
                  flush=True)
        print(f"  {spread(ratios)}", flush=True)
    return rows


def _tuned_static(op, trials: int, where: Path):
    import tsl

    db = tsl.tune.Database(where / f"static-{op.shape_str}.jsonl")
    t0, w0 = time.perf_counter(), waited_seconds()
    tsl.tune.tune(op, "cpu", trials=trials, database=db, transfer=False)
    return tsl.build(op, "cpu", knobs=db), _busy(t0, w0)


def _busy(t0: float, w0: float) -> float:
    """Wall seconds since t0, less the waits for the timing lock since w0 (other processes'
    measurements)."""
    return time.perf_counter() - t0 - (waited_seconds() - w0)


def tuned_row(fam, art, v: int, trials: int, where: Path) -> dict:
    """The tuned family's artifact against a static N-trial tune of value v, bound, timed
    paired (`_paired`)."""
    op = fam.at(**{next(iter(fam.syms)): v})
    static, tune_s = _tuned_static(op, trials, where)
    xs = op.random_inputs(7)
    consts = {t.name: x for t, x in zip(op.inputs, xs) if t.name in static.constants()}
    free = [x for t, x in zip(op.inputs, xs) if t.name not in consts]
    ok = op.check(art.run(*xs), op.reference(*xs))[0] and static.verify()[0]
    td, ts, q = _paired(art.bind(**consts), static.bind(**consts), free, free)
    return {"value": v, "family_s": td, "static_s": ts, "ratio": q, "verified": ok,
            "static_tune_s": tune_s}


def tuned(trials: int, quick: bool = False, values=None, upper: int = 2048) -> list[dict]:
    """Families tuned with 2 x `trials` against per-value `trials`-trial static tunes
    (--quick: dense 768->3072 only, 4 values)."""
    import tsl

    rows = []
    chosen = families(upper)[:1] if quick else families(upper)
    values = values or (QUICK_VALUES if quick else VALUES)
    with tempfile.TemporaryDirectory() as tmp:
        for name, fam in chosen:
            db = tsl.tune.Database(Path(tmp) / f"{len(rows)}-family.jsonl")
            t0, w0 = time.perf_counter(), waited_seconds()
            res = tsl.tune.tune(fam, "cpu", trials=2 * trials, database=db)
            fam_s = _busy(t0, w0)
            art = tsl.build(fam, "cpu", knobs=db)
            print(f"\n{name}: family tuned with {2 * trials} trials in {fam_s:.0f} s "
                  f"({res.measurements} timings; {res.speedup:.2f}x the untuned kernels over "
                  f"the ranges' samples); static {trials}-trial tunes per value", flush=True)
            print(f"  {'value':>6} {'family ms':>10} {'static ms':>10} {'fam/static':>10} "
                  f"{'ok':>3} {'static tune s':>13}", flush=True)
            got = []
            for v in values:
                r = tuned_row(fam, art, v, trials, Path(tmp))
                got.append(r)
                print(f"  {v:>6} {r['family_s'] * 1e3:>10.3f} {r['static_s'] * 1e3:>10.3f} "
                      f"{r['ratio']:>10.3f} {'yes' if r['verified'] else 'NO':>3} "
                      f"{r['static_tune_s']:>13.1f}", flush=True)
            ratios = [r["ratio"] for r in got]
            print(f"  {spread(ratios, 'family/static')}; tuning "
                  f"(lock waits excluded): family {fam_s:.0f} s for every value, static "
                  f"{sum(r['static_tune_s'] for r in got):.0f} s for {len(got)} values",
                  flush=True)
            rows += [{"family": name, "family_tune_s": fam_s, **r} for r in got]
    return rows
