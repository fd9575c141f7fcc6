"""`python -m tsl.bench --targets cpu --tune N --vs-metaschedule`: tsl.tune and TVM MetaSchedule
on the same operators, the same CPU target and the same number of measured trials.

Per operator: tsl.tune searches the default schedule's knobs (N trials, in-process), its best is
built and verified; MetaSchedule's `tune_tir` tunes the operator's TE definition (N trials),
its best is compiled and verified. Both kernels are then timed with TVM's `time_evaluator`,
alternately, in 5 rounds (this host's speed drifts), and the medians compared. Tuning
wall-clock is each tuner's own, from start to its best configuration.
"""

from __future__ import annotations

import time

import numpy as np

from .. import ops
from ..backend import resolve_target
from ..build import build
from ..errors import BackendUnavailable, TSLError
from ..tune import metaschedule, search

ROUNDS = 5


def operators() -> list:
    return [ops.matmul(1024, 1024, 1024),
            ops.dense(128, 768, 3072, epilogue=ops.bias() + ops.relu()),  # BERT-base FFN1
            ops.conv2d(1, 128, 28, 28, 128, 3, 3, padding=1),  # ResNet-18 C5, NCHW
            ops.matmul(1024, 1024, 1024, dtype="int8")]


def compare(op, target: str, trials: int, progress) -> dict:
    backend, machine = resolve_target(target)
    why = backend.unavailable(machine)
    if why:
        raise BackendUnavailable(f"cannot build for {machine.name} here: {why}")
    row = {"op": op.name, "shape": op.shape_str, "dtype": op.dtype, "target": machine.name,
           "trials": trials}
    progress(f"[{op}] tsl.tune, {trials} trials ...")
    res = search.tune(op, machine, trials=trials)
    art = build(op, machine, knobs=res.knobs)
    ok, err = art.verify(seed=3)
    row.update(tsl_tune_s=res.wall_seconds, tsl_knobs=res.knobs, tsl_verified=bool(ok),
               tsl_error=err)
    progress(f"[{op}] MetaSchedule tune_tir, {trials} trials ...")
    ms = metaschedule.tune(op, machine, trials)
    row.update(ms_tune_s=ms.tune_seconds, ms_records=ms.trials, ms_verified=ms.verified,
               ms_error=ms.error)
    xs = op.random_inputs(7)
    t_tsl, t_ms = [], []
    for _ in range(ROUNDS):
        t_tsl.append(art.time(*xs))
        t_ms.append(ms.time(op))
    row["tsl_s"], row["ms_s"] = float(np.median(t_tsl)), float(np.median(t_ms))
    row["speedup"] = row["ms_s"] / row["tsl_s"]
    row["verified"] = row["tsl_verified"] and row["ms_verified"]
    return row


def run(targets: list[str], trials: int, ops_filter, progress) -> list[dict]:
    rows = []
    for target in targets:
        for op in operators():
            if ops_filter and op.name not in ops_filter:
                continue
            t0 = time.perf_counter()
            try:
                rows.append(compare(op, target, trials, progress))
            except TSLError as e:
                rows.append({"op": op.name, "shape": op.shape_str, "dtype": op.dtype,
                             "target": target, "verified": False,
                             "failed": f"{type(e).__name__}: {str(e).splitlines()[0]}"})
            rows[-1]["wall_s"] = time.perf_counter() - t0
            progress("  ".join(fmt(rows[-1])))
    return rows


COLUMNS = ("op", "shape", "dtype", "target", "trials", "verified", "tsl", "MetaSchedule",
           "speedup", "tsl tune", "MS tune")


def fmt(r: dict) -> list[str]:
    if "failed" in r:
        return [r["op"], r["shape"], r["dtype"], r["target"], "-", "FAILED", "", "", "", "",
                r["failed"][:120]]
    return [r["op"], r["shape"], r["dtype"], r["target"], str(r["trials"]),
            "yes" if r["verified"] else "NO", f"{r['tsl_s'] * 1e3:.3f} ms",
            f"{r['ms_s'] * 1e3:.3f} ms", f"{r['speedup']:.2f}x", f"{r['tsl_tune_s']:.0f} s",
            f"{r['ms_tune_s']:.0f} s"]


def print_table(rows: list[dict]) -> None:
    cells = [list(COLUMNS)] + [fmt(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    for n, c in enumerate(cells):
        print("  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
