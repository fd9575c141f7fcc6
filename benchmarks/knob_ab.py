"""A/B of knob settings: kernels of one operator under several settings, timed interleaved.

`python benchmarks/knob_ab.py ROWS.json`, ROWS a JSON list of
`{"op": "dense", "args": [M, K, N], "knobs": [{...}, {...}]}` or
`{"op": "conv2d", "args": [C, HW, K, R, STRIDE], "knobs": [...]}` (batch 1, padding R//2).
Each setting is built for this host's CPU machine and checked against NumPy, then the kernels
are called in turn on their prepared inputs (a warm call, then a timed one), ROUNDS times,
under the timing lock and at real-time priority where asked for (`tsl.timing`): every setting
sees the same host load. Prints each setting's median in ms and the second over the first.
"""

import json
import sys
import time

import numpy as np

from tsl import ops, timing
from tsl.backend import resolve_target
from tsl.backends.cpu.runtime import set_threads
from tsl.record import record

ROUNDS = 15


def operator(kind: str, args: list):
    if kind == "dense":
        return ops.dense(*args)
    c, hw, k, r, stride = args
    return ops.conv2d(1, c, hw, hw, k, r, r, stride=stride, padding=r // 2)


def medians(op, knob_sets, backend, machine) -> list[float]:
    xs = op.random_inputs(1)
    calls = []
    for knobs in knob_sets:
        art = backend.build(record(op, machine, None, knobs))
        ok, err = op.check(art.run(*xs), op.reference(*xs))
        if not ok:
            raise SystemExit(f"{op} {knobs}: wrong result (relative error {err:.1e})")
        calls.append((art.kernel(), art._tensors(art.prepare(list(xs)))))
    set_threads(machine.cores())
    ts = [[] for _ in calls]
    with timing.exclusive(), timing.realtime():
        for _ in range(ROUNDS):
            for (fn, args), t in zip(calls, ts):
                fn(*args)
                t0 = time.perf_counter()
                fn(*args)
                t.append(time.perf_counter() - t0)
    return [float(np.median(t)) * 1e3 for t in ts]


def main(path: str) -> None:
    backend, machine = resolve_target("cpu")
    for row in json.load(open(path)):
        t = medians(operator(row["op"], row["args"]), row["knobs"], backend, machine)
        print(f"{row['op']} {row['args']}: " + "  ".join(f"{x:.3f}" for x in t)
              + (f"   second/first {t[1] / t[0]:.3f}" if len(t) > 1 else ""), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
