"""`python -m tsl.tune "OPERATOR" --target T --trials N --db FILE [--json] [--workers N]
[--rpc HOST:PORT --key KEY]`

Tunes one operator's schedule knobs for a target and appends every measurement to a tuning
database (a run that is stopped resumes where it stopped). One progress line per batch on
stderr; the result (or, with --json, a JSON summary) on stdout. Exits 0 unless something
failed: bad arguments, a target that cannot be built or measured here, nothing measured.
"""

from __future__ import annotations

import argparse
import json
import sys

from .. import timing
from ..errors import TSLError
from . import opspec
from .database import Database
from .runner import LocalRunner, PoolRunner
from .search import tune


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tsl.tune", description=__doc__.split("\n\n")[1],
                                 epilog=opspec.__doc__, formatter_class=argparse.
                                 RawDescriptionHelpFormatter)
    ap.add_argument("op", help='the operator, e.g. "matmul 1024x1024x1024 float32"')
    ap.add_argument("--target", default="cpu", help="back-end or machine name, or a machine "
                    ".toml (default: cpu)")
    ap.add_argument("--trials", type=int, default=64, help="configurations to measure, "
                    "counting those already in the database (default: 64)")
    ap.add_argument("--db", help="tuning database (JSON lines; created if missing)")
    ap.add_argument("--batch", type=int, default=4, help="configurations per batch (default: "
                    "4, at least one per device)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=0, help="measure in N worker processes "
                    "(the simulated and modelled targets)")
    ap.add_argument("--rpc", metavar="HOST:PORT", help="measure on the devices registered with "
                    "this TVM RPC tracker")
    ap.add_argument("--key", help="the device key at the RPC tracker")
    ap.add_argument("--no-transfer", action="store_true", help="ignore a learned model saved "
                    "beside the database by earlier runs")
    ap.add_argument("--json", action="store_true", help="print a JSON summary")
    ap.add_argument("--realtime", action="store_true", help="time at real-time priority "
                    "(SCHED_FIFO) on a host shared with other work; needs CAP_SYS_NICE "
                    "(see tsl/timing.py)")
    args = ap.parse_args(argv)
    if args.realtime:
        timing.request()
    if args.trials < 1:
        ap.error("--trials must be at least 1")
    if bool(args.rpc) != bool(args.key):
        ap.error("--rpc and --key go together")
    if args.rpc and args.workers:
        ap.error("--rpc and --workers are two different runners; pick one")

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        op = opspec.parse(args.op)
        if args.rpc:
            from .rpc import RPCRunner

            runner = RPCRunner(args.rpc, args.key, seed=args.seed)
        elif args.workers:
            runner = PoolRunner(args.workers, seed=args.seed)
        else:
            runner = LocalRunner(seed=args.seed)
        with runner:
            res = tune(op, args.target, trials=args.trials, batch=args.batch, seed=args.seed,
                       database=Database(args.db) if args.db else None, runner=runner,
                       progress=progress, transfer=not args.no_transfer)
    except TSLError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"op": str(op), "target": args.target, "db": args.db,
                          **res.summary()}, default=str))
    else:
        print(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
