"""The bench's row schema, and the roofline fields of a row.

A row (one operator on one target; `--json` writes a list of them, `--report` a `bench.json`
of `{"host": ..., "rows": [...]}`) has, besides what the back end's `benchmark()` returns:

    op, shape, dtype, target   what compare matches rows on
    machine                    the TAM name the target resolved to
    verified                   True / False / None (built and checked, but nothing here runs it)
    seconds, rate, pct_peak    time (measured median, simulated, or modelled), useful operations
                               per second (a MAC is two), share of the file's peak
    cycles                     simulated rows: the cycle count
    samples                    measured rows: the repeated times the median is taken over; their
                               spread is the row's noise band
    kind                       "measured" | "simulated" | "model": how `seconds` was obtained
    flops                      useful operations of the operator (padding excluded)
    traffic                    {memory level: bytes moved between it and its parent}
    traffic_from               "estimate" (the artifact's own estimate or simulation) or
                               "compulsory" (each input read once and the output written once)
    bound_level                the level whose traffic takes longest at its bandwidth
    intensity                  flops / traffic[bound_level], operations per byte
    bound                      "compute" or bound_level: the lower roofline ceiling there
    baseline, speedup          the first peer and tsl's rate over its rate
    peers                      {name: {"ratio", "kind", "rate" where measured}}: tsl's rate over
                               each peer's, and the weaker of the two kinds (a ratio is only as
                               measured as its less-measured side); `baseline` is one of them

Skipped rows have `skipped`, failed rows `failed`, and neither has the fields below `cycles`.
"""

from __future__ import annotations

import math
import statistics

from ..build import build
from ..tam.machine import Machine, dtype_bytes
from ..tam.roofline import compute_peak, level_bandwidth

KIND_ORDER = ("measured", "simulated", "model")


def row_kind(row: dict) -> str:
    if "cycles" in row:
        return "simulated"
    return "model" if row.get("estimated") else "measured"


def baseline_kind(row: dict) -> str:
    if "baseline_cycles" in row:
        return "simulated"
    return "measured" if "baseline_rate" in row and not row.get("estimated") else "model"


def weaker(a: str, b: str) -> str:
    return KIND_ORDER[max(KIND_ORDER.index(a), KIND_ORDER.index(b))]


def compulsory_bytes(op) -> int:
    tensors = [(t.shape, t.dtype) for t in op.inputs] + [(op.output.shape, op.out_dtype)]
    return int(sum(math.prod(s) * dtype_bytes(d) for s, d in tensors))


def traffic(art, row: dict) -> tuple[dict[str, float], str]:
    """Bytes per memory level for the program the row timed, and where they come from.

    Today only the global level is known, from the artifact's estimate where it counts it (the
    VTA simulator's DMA bytes, the TPU and Tensor Core models' HBM bytes) or as the compulsory
    traffic. THE ONE PLACE to switch to `tsl.model`'s per-level traffic when it lands."""
    glob = art.machine.levels("global")[0].name
    if isinstance(row.get("knobs"), dict):
        # The row timed a tuned program (VTA), not the default one `art` holds.
        art = build(art.op, art.machine, knobs=row["knobs"])
    est = art.estimate()
    stats = getattr(est, "stats", None)
    if stats is not None:
        return {glob: sum(stats.bytes_read.values()) + sum(stats.bytes_written.values())}, \
            "estimate"
    if getattr(est, "hbm_bytes", None):
        return {glob: est.hbm_bytes}, "estimate"
    return {glob: compulsory_bytes(art.op)}, "compulsory"


def bound_of(m: Machine, dtype: str, flops: float, moved: dict[str, float]) -> dict:
    """bound_level, intensity and bound of `flops` operations moving `moved` bytes per level."""
    timed = {lv: b / level_bandwidth(m, lv) for lv, b in moved.items()
             if b and level_bandwidth(m, lv)}
    level = max(timed, key=timed.get) if timed else next(iter(moved))
    intensity = flops / moved[level] if moved[level] else math.inf
    peak = compute_peak(m, dtype) or math.inf
    bw = level_bandwidth(m, level)
    bound = level if bw and intensity * bw < peak else "compute"
    return {"bound_level": level, "intensity": intensity, "bound": bound}


def roofline_fields(art, row: dict) -> dict:
    """The schema's fields after `seconds` for a row `art.benchmark()` filled."""
    moved, source = traffic(art, row)
    flops = 2 * art.op.macs
    kind = row_kind(row)
    out = {"machine": art.machine.name, "kind": kind, "flops": flops, "traffic": moved,
           "traffic_from": source, **bound_of(art.machine, art.op.dtype, flops, moved)}
    peers = {name: dict(p) for name, p in (row.get("peers") or {}).items()}
    if not peers and row.get("speedup") is not None:
        peers = {row["baseline"]: {"ratio": row["speedup"]}}
    for p in peers.values():
        p.setdefault("kind", weaker(kind, baseline_kind(row)))
    if peers:
        out["peers"] = peers
    return out


def noise(row: dict) -> float:
    """Relative half-spread of a row's repeated times (0 for a simulation or a model: the same
    program gives the same number)."""
    s = row.get("samples") or []
    if len(s) < 2:
        return 0.0
    return (max(s) - min(s)) / (2 * statistics.median(s))
