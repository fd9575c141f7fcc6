"""The bench's row schema, and the roofline fields of a row.

A row (one operator on one target; `--json` writes a list of them, `--report` a `bench.json`
of `{"host": ..., "rows": [...]}`) has, besides what the back end's `benchmark()` returns:

    op, shape, dtype, target   what compare matches rows on
    machine                    the TAM name the target resolved to
    verified                   True / False / None (built and checked, but nothing here runs it)
    seconds, rate, pct_peak    time (measured median, simulated, or modelled), useful operations
                               per second (a MAC is two), share of the machine's peak
    rates                      where the machine's clock, rates and peaks come from
                               (`Machine.provenance`: "probed" on this host, "built-in", "file")
    peak_under_read            only where the rate exceeded the machine's peak: rate / peak;
                               pct_peak is then 100 against the row's own rate (see peak_fields)
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
    """Bytes per memory level for the program the row timed (`art`), and where they come from:
    its `Estimate` (tsl.model's traffic into each level, or a simulator's DRAM bytes, counted
    at the global level), else the compulsory traffic."""
    glob = art.machine.levels("global")[0].name
    est = art.estimate()
    if est.traffic and est.kind == "simulated":
        return {glob: sum(est.traffic.values())}, "estimate"
    if est.traffic:
        return dict(est.traffic), "estimate"
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


def peak_fields(m: Machine, dtype: str, row: dict) -> dict:
    """`rates` (m's provenance) and, where the row's rate beat m's peak, the honest reading of
    that: the peak is a measured (or published) upper bound of the instruction's throughput, so
    a faster row means the peak under-read this machine (a probe timed while the host was busy,
    a file's nominal clock below this host's): the row's own rate is the best bound known, its
    pct_peak 100, and `peak_under_read` says by how much the stated peak was exceeded."""
    out = {"rates": m.provenance}
    peak = m.peak(dtype)
    if peak and row.get("rate", 0) > peak:
        out.update(pct_peak=100.0, peak_under_read=row["rate"] / peak)
    elif row.get("pct_peak", 0) > 100:  # a back end's own share, over a peak of its own
        out.update(pct_peak=100.0, peak_under_read=row["pct_peak"] / 100)
    return out


def roofline_fields(art, row: dict) -> dict:
    """The schema's fields after `seconds` for a row `art.benchmark()` filled."""
    moved, source = traffic(art, row)
    flops = 2 * art.op.macs
    kind = row_kind(row)
    out = {"machine": art.machine.name, "kind": kind, "flops": flops, "traffic": moved,
           "traffic_from": source, **bound_of(art.machine, art.op.dtype, flops, moved),
           **peak_fields(art.machine, art.op.dtype, row)}
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
