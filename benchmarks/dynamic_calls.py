"""Per-call cost of a bound dynamic artifact at small values (issue #25, the per-call path).

For each family and value: the dynamic artifact's bound call, a static build's bound call and
the static kernel alone on prepared tensors, interleaved, median of CALLS each, under the
timing lock (`TSL_TIMING_LOCK`). `python benchmarks/dynamic_calls.py [values...]`.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import tsl
from tsl.bench.dynamic import families
from tsl.timing import exclusive, realtime

CALLS = 61


def _medians(fns) -> list[float]:
    for f in fns:
        f()
    ts = [[] for _ in fns]
    for _ in range(CALLS):
        for f, t in zip(fns, ts):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [float(np.median(t)) for t in ts]


def main(values) -> None:
    for name, fam in families(2048):
        art = tsl.build(fam, "cpu")
        for v in values:
            op = fam.at(**{next(iter(fam.syms)): v})
            xs = op.random_inputs(7)
            static = tsl.build(op, "cpu")
            consts = {t.name: x for t, x in zip(op.inputs, xs) if t.name in static.constants()}
            free = [x for t, x in zip(op.inputs, xs) if t.name not in consts]
            d, s = art.bind(**consts), static.bind(**consts)
            args = s.resident.args
            with exclusive(), realtime():
                td, ts, tk = _medians([lambda: d(*free), lambda: s(*free),
                                       lambda: static.run_resident(args)])
            print(f"{name:34} {v:>5}: dynamic bound {td * 1e6:7.1f} us, static bound "
                  f"{ts * 1e6:7.1f} us, static kernel {tk * 1e6:7.1f} us", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 5])
