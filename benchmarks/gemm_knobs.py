"""The encoder's GEMMs (dense 128 x K -> N + epilogue) under the cost model's top knob settings
and any given by hand, against torch's F.linear alone in its own process.

`python benchmarks/gemm_knobs.py M K N EPILOGUE [TOP] ['{"knob": value, ...}' ...]`, EPILOGUE
bias or bias_relu (as F.linear's peer takes them): builds each setting, checks it against NumPy, then
times single kernel calls interleaved over the settings (median of ROUNDS x 5 calls, under the
timing lock and at real-time priority where asked for, `tsl.timing`), then F.linear with the
machine's cores in a fresh process (`tsl.bench.alone`).
"""

import json
import sys
import time

import numpy as np

from tsl import ops, timing
from tsl.backend import resolve_target
from tsl.backends.cpu.runtime import set_threads
from tsl.bench.alone import time_alone
from tsl.model.search import search
from tsl.record import record
from tsl.schedules import schedule_gemm

ROUNDS = 9
EPILOGUES = {"bias": lambda: ops.bias(), "bias_relu": lambda: ops.bias() + ops.relu()}


def _settings(op, machine, backend, top, given):
    choice = search(op, machine, schedule_gemm, check=getattr(backend, "check", None))
    return ([(cd.knobs, cd.estimate.seconds) for cd in choice.candidates[:top]]
            + [(json.loads(a), None) for a in given])


def main(argv: list[str]) -> None:
    m, k, n = (int(v) for v in argv[:3])
    epilogue = argv[3]
    top = int(argv[4]) if len(argv) > 4 else 4
    backend, machine = resolve_target("cpu")
    op = ops.dense(m, k, n, epilogue=EPILOGUES[epilogue]())
    rng = np.random.default_rng(1)
    args = [rng.uniform(-1, 1, t.shape).astype("float32") for t in op.inputs]
    runs = []
    for knobs, est in _settings(op, machine, backend, top, argv[5:]):
        s = record(op, machine, None, knobs)
        art = backend.build(s)
        ok, err = op.check(art.run(*args), op.reference(*args))
        if not ok:
            raise SystemExit(f"{s.knob_values}: wrong result (relative error {err:.1e})")
        runs.append((s.knob_values, est, art.kernel(), art._tensors(art.prepare(args))))
    set_threads(machine.cores())
    times = [[] for _ in runs]
    with timing.exclusive(), timing.realtime():
        for _ in range(ROUNDS):
            for n_, (_, _, fn, a) in enumerate(runs):
                fn(*a)
                for _ in range(5):
                    t0 = time.perf_counter()
                    fn(*a)
                    times[n_].append(time.perf_counter() - t0)
    flop = 2 * m * n * k
    for n_, (knobs, est, _, _) in enumerate(runs):
        t = np.median(times[n_])
        e = f"{est * 1e3:.3f}" if est else "given"
        print(f"{t * 1e3:.3f} ms  {flop / t / 1e9:.0f} GFLOP/s  estimate {e}  {knobs}")
    spec = {"gemm": [1, m, n, k], "dtype": "float32", "bias": True,
            "relu": epilogue == "bias_relu", "work": flop}
    peer = time_alone("torch linear", spec, machine.cores())
    print(f"torch F.linear {peer.seconds * 1e3:.3f} ms  {flop / peer.seconds / 1e9:.0f} GFLOP/s")


if __name__ == "__main__":
    main(sys.argv[1:])
