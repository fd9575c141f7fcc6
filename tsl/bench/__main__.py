"""`python -m tsl.bench [--targets T,..] [--ops OP,..] [--quick] [--json FILE]`

Builds each back end's suite with the default schedules, verifies every artifact against NumPy
on fresh random data, and prints time (or simulated cycles, or an estimate where there is no
hardware), the achieved rate, its share of the machine file's peak, and the ratio to a baseline
measured or modelled in the same run. Timings are medians; the machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..backend import resolve_target, targets
from ..build import record
from ..errors import BackendUnavailable, TSLError

COLUMNS = ("op", "shape", "dtype", "target", "verified", "time", "rate", "peak%", "baseline",
           "speedup", "notes")


def run_target(target: str, ops_filter, quick: bool, progress) -> list[dict]:
    backend, machine = resolve_target(target)
    why = backend.unavailable(machine)
    if why:
        return [{"op": "-", "shape": "-", "dtype": "-", "target": target, "verified": False,
                 "skipped": why, "baseline": None, "speedup": None}]
    rows = []
    suite = [op for op in backend.bench_suite(quick)
             if not ops_filter or op.name in ops_filter]
    for n, op in enumerate(suite, 1):
        progress(f"[{target} {n}/{len(suite)}] {op} ...")
        row = {"op": op.name, "shape": op.shape_str, "dtype": op.dtype, "target": target}
        if op.name == "conv2d":
            row["shape"] += "/" + op.params["layout"]
        try:
            t0 = time.perf_counter()
            # A back end whose cost model picks the knobs says so (the TPU back end).
            knobs = backend.default_knobs(op, machine) if hasattr(backend, "default_knobs") \
                else None
            art = backend.build(record(op, machine, None, knobs))
            row["build_s"] = round(time.perf_counter() - t0, 2)
            # Timed before it is verified: the NumPy reference leaves OpenBLAS' threads
            # spinning for about a second, and on 2 cores they slow whatever runs next.
            row.update(art.benchmark())
            try:
                ok, err = art.verify(seed=n)
                row["verified"], row["error"] = bool(ok), err
            except BackendUnavailable as e:
                # Built and checked, but nothing here can run it (no GPU): the estimate stands.
                row["verified"], row["unverified"] = None, str(e).splitlines()[0]
        except TSLError as e:
            row.update(verified=False, failed=f"{type(e).__name__}: {str(e).splitlines()[0]}",
                       baseline=None, speedup=None)
        rows.append(row)
    return rows


def fmt(row: dict) -> list[str]:
    if "skipped" in row:
        return [row["op"], "-", "-", row["target"], "skipped", "", "", "", "", "", row["skipped"]]
    if "failed" in row:
        return [row["op"], row["shape"], row["dtype"], row["target"], "FAILED", "", "", "", "",
                "", row["failed"][:160]]
    if "cycles" in row:
        t = f"{row['cycles']:,} cyc"
    elif row.get("estimated"):
        t = f"~{row['seconds'] * 1e3:.3f} ms (est.)"
    else:
        t = f"{row['seconds'] * 1e3:.3f} ms"
    sp = row.get("speedup")
    verified = {True: "yes", False: "NO", None: "n/a"}[row["verified"]]
    notes = row.get("checks") or row.get("notes") or ""
    if row["verified"] is None:
        notes = f"{notes}; not run here: {row['unverified']}"
    return [row["op"], row["shape"], row["dtype"], row["target"], verified,
            t, f"{row['rate'] / 1e9:.1f} GOP/s", f"{row['pct_peak']:.1f}",
            row.get("baseline") or "-", f"{sp:.2f}x" if sp is not None else "-", notes[:200]]


def print_table(rows: list[dict]) -> None:
    cells = [list(COLUMNS)] + [fmt(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    for n, c in enumerate(cells):
        print("  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tsl.bench", description=__doc__.split("\n\n")[1])
    ap.add_argument("--targets", help="comma-separated machine or back-end names "
                    f"(default: all of {', '.join(targets())})")
    ap.add_argument("--ops", help="comma-separated operator names (matmul, batch_matmul, "
                    "dense, conv2d)")
    ap.add_argument("--quick", action="store_true", help="a few small rows per target")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    tgts = args.targets.split(",") if args.targets else targets()
    ops_filter = set(args.ops.split(",")) if args.ops else None

    def progress(msg):
        print(f"\r\033[K{msg}" if sys.stderr.isatty() else msg, end="" if sys.stderr.isatty()
              else "\n", file=sys.stderr, flush=True)

    rows = []
    for t in tgts:
        try:
            rows += run_target(t, ops_filter, args.quick, progress)
        except TSLError as e:
            rows.append({"op": "-", "shape": "-", "dtype": "-", "target": t, "verified": False,
                         "skipped": f"{type(e).__name__}: {str(e).splitlines()[0]}",
                         "baseline": None, "speedup": None})
    progress("")
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=float)
    failed = [r for r in rows if "skipped" not in r and r.get("verified") is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
