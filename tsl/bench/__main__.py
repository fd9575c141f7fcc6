"""`python -m tsl.bench [--full] [--targets T,..] [--ops OP,..] [--trials N] [--json FILE]
[--report DIR]`, `python -m tsl.bench --compare OLD.json NEW.json [--threshold F] [--report DIR]`
and `python -m tsl.bench --model-check [--targets T,..] [--ops OP,..] [--quick] [--samples N]`

Builds a representative slice of each back end's suite (`--full`: all of it; minutes on 2 cores
against tens) with the default schedules, verifies every artifact against NumPy
on fresh random data, and prints time (or simulated cycles, or an estimate where there is no
hardware), the achieved rate, its share of the machine's peak, and the ratio to a baseline
measured or modelled in the same run, then one summary line per target. A CPU row's time is
what a caller pays per call (constant operands bound once with `art.bind`; the kernel alone
and the one-time weight preparation in the notes); its peers (NumPy, PyTorch) are each timed
alone, the median of 3 fresh processes (tsl/bench/alone.py; `--check-peers` times them in 3 more
and flags an in-bench rate more than 15% from all of them; `--check-relax` times one conv inside
a Relax model against its row). peak% is against the machine's peak: for the CPU, this host's,
probed (a row faster than it prints 100.0! and says the peak under-read the host). Timings
are medians; the machines are noisy. Knobs are the cost model's choice; where a back end asks for it (VTA) or `--trials N` is given, a
`tsl.tune` search of N programs may replace them (`--trials 0`: default knobs only).
`--model-check` instead ranks random knob settings by the model and by measurement and prints
their Spearman correlation (see tsl/bench/model_check.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..backend import get_backend, resolve_target, targets
from ..tam import load
from ..record import record
from .. import timing
from ..errors import BackendUnavailable, TSLError
from . import alone, model_check, search
from .report import print_table, summary
from .rows import roofline_fields

def run_target(target: str, ops_filter, quick: bool, progress,
               trials: int | None = None) -> list[dict]:
    backend, machine = resolve_target(target)
    why = backend.unavailable(machine)
    if why:
        return [{"op": "-", "shape": "-", "dtype": "-", "target": target, "verified": False,
                 "skipped": why, "baseline": None, "speedup": None}]
    rows = []
    suite = [op for op in backend.suite(quick)
             if not ops_filter or op.name in ops_filter]
    for n, op in enumerate(suite, 1):
        progress(f"[{target} {n}/{len(suite)}] {op} ...")
        row = {"op": op.name, "shape": op.shape_str, "dtype": op.dtype, "target": machine.name}
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
            row.update(_benchmark(art, backend, machine))
            n_trials = backend.bench_trials if trials is None else trials
            if n_trials:
                art = search.improve(backend, machine, op, art, row, n_trials)
            row.update(roofline_fields(art, row))
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


def _benchmark(art, backend, machine) -> dict:
    """The artifact's benchmark; an artifact with peers to time (`peer_spec`, the CPU's) gets
    them, each timed alone (tsl.bench.alone)."""
    if not hasattr(art, "peer_spec") or art.cross:
        return art.benchmark()
    row = art.benchmark(peers=alone.cpu_peers(machine.cores()))
    row["op_spec"] = art.peer_spec()
    infos = [p.pop("info") for p in row.get("peers", {}).values()]
    blas = next((i["blas"] for i in infos if i.get("blas")), None)
    if blas:
        row["blas"] = f"{blas}; peers timed alone"
    return row


def default_targets() -> list[str]:
    """The machine detected on this host (a back end's name, e.g. the CPU's) and every
    built-in machine of the other back ends."""
    names = sorted({load(t).backend for t in targets()})
    detected = [b for b in names if get_backend(b).host_detected]
    return detected + [t for t in targets() if load(t).backend not in detected]


def _model_args(ap: argparse.ArgumentParser) -> None:
    """The options of the whole-model and dynamic-shape benches."""
    ap.add_argument("--models", action="store_true", help="whole models through tsl.relax "
                    "instead: torchvision ResNet-18 / MobileNetV2 and a BERT-base encoder layer "
                    "imported through TVM's torch and ONNX frontends vs PyTorch and ONNX Runtime "
                    "(each alone in its own process; needs the peers extra), then the project's "
                    "own models (ResNet-18, BERT layer, int8 ResNet-18, Tensor Core compile); "
                    "with --quick, only the project's own small configurations")
    ap.add_argument("--profile", action="store_true", help="with --models: tsl's time per "
                    "function of each imported model (tsl kernels vs the rest)")
    ap.add_argument("--frontends", default="torch,onnx", help="with --models: torch, onnx")
    ap.add_argument("--only", help="with --models: comma-separated imported models "
                    "(resnet18, mobilenet_v2, encoder); 'none' skips them")
    ap.add_argument("--dynamic", action="store_true", help="shape-generic builds (one build "
                    "of an operator family with a symbolic dim) against a static build per "
                    "value, with PyTorch/NumPy timed alone, then a BERT-base encoder layer "
                    "with a symbolic sequence length compiled once (--quick: 4 values, no "
                    "peers, a smaller encoder); with --tune N, each family tuned with 2 x N "
                    "trials against a static N-trial tune per value (--quick: dense "
                    "768->3072 only)")
    ap.add_argument("--values", help="with --dynamic --tune: the values, comma-separated "
                    "(default: the issue's twelve; --quick: 1,31,100,333)")


def parser() -> argparse.ArgumentParser:
    """The command line of `python -m tsl.bench`."""
    ap = argparse.ArgumentParser(prog="python -m tsl.bench", description=__doc__.split("\n\n")[1])
    ap.add_argument("--targets", help="comma-separated machine or back-end names (default: "
                    f"cpu, i.e. this host's machine, and {', '.join(default_targets()[1:])})")
    ap.add_argument("--ops", help="comma-separated operator names (matmul, batch_matmul, "
                    "dense, conv2d)")
    ap.add_argument("--quick", action="store_true", help="a few small rows per target (the "
                    "default of the bench itself; with --models and --model-check, their small "
                    "configurations)")
    ap.add_argument("--full", action="store_true", help="every back end's whole suite (tens of "
                    "minutes on 2 cores) instead of the representative slice")
    ap.add_argument("--realtime", action="store_true", help="time at real-time priority "
                    "(SCHED_FIFO) on a host shared with other work; needs CAP_SYS_NICE "
                    "(see tsl/timing.py)")
    ap.add_argument("--check-peers", action="store_true", help="time every CPU peer once more, "
                    "alone in a fresh process, and flag rows whose in-bench peer rate differs "
                    "by more than 15%% (exit status 1)")
    ap.add_argument("--check-relax", action="store_true", help="also build a one-conv Relax "
                    "model through tsl.relax.pipeline and flag its time off the bench's "
                    "user-level time of that conv by more than 15%% (exit status 1)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--trials", type=int, help="programs searched per operator (default: the "
                    "back end's, 24 on VTA, 0 elsewhere; 0 = the model's default knobs only); "
                    "with --model-check, the search the default knobs are compared with")
    ap.add_argument("--model-check", action="store_true", help="Spearman rank correlation of "
                    "the cost model with measurement over random knob settings")
    ap.add_argument("--samples", type=int, default=30, help="knob settings per operator for "
                    "--model-check (default 30)")
    ap.add_argument("--rounds", type=int, default=3, help="with --model-check: times each "
                    "setting is timed on a clock, in alternating order (default 3)")
    ap.add_argument("--report", metavar="DIR", help="also write DIR/index.html, DIR/report.md, "
                    "the plots and DIR/bench.json; with --compare, the comparison's page")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="compare two bench JSON "
                    "files instead of running (exit status 1 on a regression)")
    ap.add_argument("--threshold", type=float, default=0.05, help="with --compare: the "
                    "fraction slower, beyond the noise band, that fails (default 0.05)")
    ap.add_argument("--tune", type=int, metavar="N", help="measured trials per tuner in the "
                    "--vs-metaschedule comparison, or per static tune with --dynamic")
    ap.add_argument("--vs-metaschedule", action="store_true", help="tsl.tune and TVM "
                    "MetaSchedule side by side, N trials each (see tsl/bench/metaschedule.py)")
    _model_args(ap)
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.dynamic:
        from .dynamic import main as dynamic_main

        if args.tune:
            from .dynamic import tuned

            tuned(args.tune, args.quick, [int(v) for v in args.values.split(",")]
                  if args.values else None)
        else:
            from .dynamic_models import main as dynamic_models_main
            from .dynamic_vta import main as dynamic_vta_main

            dynamic_main(args.quick, peers=not args.quick)
            dynamic_models_main(args.quick)  # the encoder with a symbolic sequence length
            dynamic_vta_main(args.quick)  # the dense families on VTA, in simulated cycles
        return 0
    if args.realtime:
        timing.request()
    if args.models:
        return run_models(args)
    if bool(args.tune) != args.vs_metaschedule:
        ap.error("--tune N and --vs-metaschedule go together (the trial budget of each tuner)")
    if args.vs_metaschedule and args.report:
        ap.error("--vs-metaschedule rows have no report page; use --json")
    if args.compare:
        from . import compare

        return compare.main(*args.compare, args.threshold, args.report)
    started = time.perf_counter()
    tgts = args.targets.split(",") if args.targets else default_targets()
    ops_filter = set(args.ops.split(",")) if args.ops else None

    def progress(msg):
        print(f"\r\033[K{msg}" if sys.stderr.isatty() else msg, end="" if sys.stderr.isatty()
              else "\n", file=sys.stderr, flush=True)

    if args.model_check:
        return run_model_check(args, tgts, ops_filter, progress)
    return run_rows(args, tgts, ops_filter, progress, started)


def run_models(args) -> int:
    """--models: whole networks through tsl.relax (with --targets: on a simulated accelerator)."""
    if args.targets:
        # Whole networks on a simulated accelerator (VTA): quantized, partitioned, simulated.
        from .vta_models import main as vta_main

        return vta_main(args.targets.split(","), args.json)
    from .models import main as models_main

    if not args.quick and args.only != "none":
        from . import imported

        json_path = args.json and args.json.replace(".json", "") + ".imported.json"
        imported.main(args.only.split(",") if args.only else None,
                      tuple(args.frontends.split(",")), args.profile, json_path)
        if args.only:
            return 0
    return models_main(args.quick, args.json)


def run_model_check(args, tgts, ops_filter, progress) -> int:
    """--model-check: the cost model's rank correlation with measurement."""
    checked = model_check.run(tgts, ops_filter, args.quick, args.samples, progress,
                              args.rounds, args.trials or 0)
    progress("")
    model_check.print_rows(checked)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(checked, f, indent=1, default=str)
    return 0


def run_rows(args, tgts, ops_filter, progress, started: float) -> int:
    """The bench's rows (or the --vs-metaschedule ones): printed, written, self-checked."""
    rows = []
    for t in tgts if not args.vs_metaschedule else ():
        try:
            rows += run_target(t, ops_filter, not args.full, progress, args.trials)
        except TSLError as e:
            rows.append({"op": "-", "shape": "-", "dtype": "-", "target": t, "verified": False,
                         "skipped": f"{type(e).__name__}: {str(e).splitlines()[0]}",
                         "baseline": None, "speedup": None})
    if args.vs_metaschedule:
        from . import metaschedule

        rows = metaschedule.run(tgts, args.tune, ops_filter, progress)
    progress("")
    (metaschedule.print_table if args.vs_metaschedule else print_table)(rows)
    if not args.vs_metaschedule:
        for line in summary(rows):
            print(line)
        print(f"bench wall time: {time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=float)
    if args.report:
        from .report import host_info, write_report

        print(f"report: {write_report({'host': host_info(), 'rows': rows}, args.report)}")
    failed = [r for r in rows if "skipped" not in r and r.get("verified") is False]
    return 1 if failed or not self_checks(rows, args.check_peers, args.check_relax,
                                          progress) else 0


def self_checks(rows: list[dict], peers: bool, relax: bool, progress) -> bool:
    """--check-peers (each peer re-timed alone) and --check-relax (one conv inside a Relax
    model against its row's time); prints what they find, True when nothing is off."""
    off = []
    if peers:
        progress("[check-peers] timing every peer again, alone ...")
        off = alone.check(rows, resolve_target("cpu")[1].cores())
        progress("")
        checked = sum(len(r.get("peer_check", {})) for r in rows)
        print(f"check-peers: {checked} peers re-timed alone (3 fresh processes each), "
              f"{len(off)} off by > 15% from all three")
        for line in off:
            print(f"  {line}")
    ok = True
    if relax:
        from . import relax_check

        progress("[check-relax] one conv through tsl.relax.pipeline ...")
        res = relax_check.check()
        progress("")
        print(relax_check.line(res))
        ok = res["ok"]
    return ok and not off

if __name__ == "__main__":
    sys.exit(main())
