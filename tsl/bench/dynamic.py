"""`python -m tsl.bench --dynamic`: shape-generic builds (issue #25) against static ones.

Per family and value: the dynamic artifact (`tsl.build(family)`: built once) against a
static build of that value, both called with their constants bound (`bind`), timed
interleaved (median of `REPEAT` each; with ``TSL_TIMING_LOCK=<file>`` under an exclusive lock
on that file, `tsl.timing.exclusive`, so no cooperating timing on the host overlaps), and the
peers of the static operator timed alone
(`tsl.bench.alone`: PyTorch, NumPy; ONNX Runtime has no operator-level peer here). Also the
family's compile time and its kernels. The ">= within 10%" numbers are read here, never
asserted in tests.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..timing import exclusive

VALUES = (1, 5, 16, 31, 64, 100, 128, 200, 333, 512, 1000, 2048)
QUICK_VALUES = (1, 31, 100, 333)
REPEAT = 9


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


def _interleaved(f, g, args_f, args_g) -> tuple[float, float]:
    f(*args_f), g(*args_g)
    a, b = [], []
    for _ in range(REPEAT):
        t = time.perf_counter()
        f(*args_f)
        a.append(time.perf_counter() - t)
        t = time.perf_counter()
        g(*args_g)
        b.append(time.perf_counter() - t)
    return float(np.median(a)), float(np.median(b))


def row(name, fam, art, v, peers) -> dict:
    import tsl

    op = fam.at(**{next(iter(fam.syms)): v})
    xs = op.random_inputs(7)
    static = tsl.build(op, "cpu")
    consts = {t.name: x for t, x in zip(op.inputs, xs) if t.name in static.constants()}
    free = [x for t, x in zip(op.inputs, xs) if t.name not in consts]
    ok, err = op.check(art.run(*xs), op.reference(*xs))
    with exclusive():
        td, ts = _interleaved(art.bind(**consts), static.bind(**consts), free, free)
    out = {"family": name, "value": v, "dynamic_s": td, "static_s": ts, "ratio": td / ts,
           "verified": ok, "error": err, "pieces": art.pieces(v)}
    if peers:
        from .alone import cpu_peers

        with exclusive():
            out["peers"] = {k: p["seconds"] for k, p in cpu_peers(static.machine.cores())(op)
                            .items()}
    return out


def main(quick: bool = False, peers: bool = True, upper: int = 2048) -> list[dict]:
    import tsl

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
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        print(f"  geo-mean dyn/static {geo:.3f}, worst {max(ratios):.3f}", flush=True)
    return rows
