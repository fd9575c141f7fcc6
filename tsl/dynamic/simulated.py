"""Families on a back end whose measurement is a simulation (`measure` of kind "simulated":
VTA's cycle count), priced by what each kernel's program costs there, not by the model.

A simulated call's cost is exact and deterministic, and cheap to have once the kernel is
built, so the table (`plan.table`) weighs the kernels' simulated times, and may cut a value
into calls of any kernel (`cut_any`): a call's price is then what it costs, where on the CPU
the model missed each call's fixed costs (`plan`'s text). The ladder changes two ways:

- Its top stops at the first rung not PLATEAU cheaper per value than the rung before it:
  larger values are cut into calls of the rungs below instead of searching and compiling the
  largest programs. The dense families of issue #25 on vta-1x16x16 stop at 48 rows (the 48-row
  program costs more per row than the 32-row one): 15-16 kernels, 3.3-4.2 s of CPU, where
  the ladder to 1024 built 20 in 8.5-10 s. The price: 32-row calls run 2-5% above the 512- and
  1024-row programs' cycles per row, and each call loads all the weights (768->3072 at
  m = 2048: 160 MB of DRAM against the static build's 36 MB, which the cycle model's DMA
  overlaps with compute; benchmarks/README.md, vta46).
- Where a value is padded (or cut) to a price above TOLERANCE times the line between the
  two rungs around it (about what a program of its own would cost), a rung is added in the
  middle of that gap, at most EXTRA of them: the gaps of the ratio-1.5 ladder padded
  768->3072 at m = 100 to the 128 rung, 1.19x its static program's cycles.
"""

from __future__ import annotations

import math

from . import jobs, plan

PLATEAU = 0.02  # a rung not this much cheaper per value than the one below it ends the ladder
TOLERANCE = 1.06  # a plan's price over the line between rungs that adds a rung
EXTRA = 10  # rungs added at most


def priced(backend, record, values: list[int], chunkable: bool, options: dict):
    """The kernels of `values` (`record(values)`: their schedules, searched by the model)
    recorded and built in order of value, a few at a time (the searches of a batch run in
    parallel, `jobs`), each's `seconds` the simulated time of a call, up to the plateau
    (`PLATEAU`; chunkable families only: others need the bound's rung). The rungs above it
    are never searched: the searches were most of a build (768->3072 at load 5: 25 of 28 s
    wall, its 15 programs 2 s; searching the ladder's 20 rungs first took 6.7 s of CPU, these
    batches 3.9 s)."""
    out = []
    values = sorted(values)
    batch = 2 * jobs.workers(len(values))
    for i in range(0, len(values), batch):
        for k in record(values[i:i + batch]):
            _price(backend, k, options)
            flat = bool(out) and (k.seconds / k.value
                                  >= (1 - PLATEAU) * out[-1].seconds / out[-1].value)
            out.append(k)
            if chunkable and flat:
                return out
    return out


def refined(backend, record, kernels: list[plan.Kernel], upper: int, chunkable: bool,
            call_s: float, options: dict) -> tuple[list[plan.Kernel], plan.Table]:
    """The table of `kernels`, with rungs added (`record([value])` records one) in the
    middle of the gap of the value whose plan is priced worst against the line between the
    rungs around it, until every value is within TOLERANCE or EXTRA rungs are added. A rung
    that itself costs over TOLERANCE times the line is a step in the cost, not padding (one
    head of attention's scores on VTA: s = 130 costs 2.3x s = 128, as a static build does):
    the gap below it is not split again."""
    steps: set = set()
    for added in range(EXTRA + 1):
        tab = plan.table(kernels, upper, chunkable, call_s, cut_any=True)
        gap = _worst_gap(kernels, tab, steps) if added < EXTRA else None
        if gap is None:
            break
        (a, b), mid = gap, _middle(gap[0].value, gap[1].value)
        (k,) = record([mid])
        _price(backend, k, options)
        if k.seconds > TOLERANCE * _line(a, b, mid):
            steps.add((a.value, mid))
        kernels = sorted(kernels + [k], key=lambda k: k.value)
    tab.basis = "simulated"
    return kernels, tab


def _price(backend, k: plan.Kernel, options: dict) -> None:
    if k.artifact is None:
        k.artifact = backend.build(k.schedule, **options)
    k.seconds = backend.measure(k.artifact).seconds


def _line(a: plan.Kernel, b: plan.Kernel, v: int) -> float:
    return a.seconds + (b.seconds - a.seconds) * (v - a.value) / (b.value - a.value)


def _worst_gap(kernels, tab: plan.Table, steps=frozenset()):
    """The rungs (a, b) around the value priced worst against the line between their
    prices, where that is above TOLERANCE, a rung fits between them and their gap is not
    one of `steps` ((lo, hi) values); None where there is none."""
    worst, gap = TOLERANCE, None
    for a, b in zip(kernels, kernels[1:]):
        if b.value - a.value < 2 or (a.value, b.value) in steps:
            continue
        for v in range(a.value + 1, b.value):
            r = (tab.price(v) - tab.call_seconds) / _line(a, b, v)
            if r > worst:
                worst, gap = r, (a, b)
    return gap


def _middle(lo: int, hi: int) -> int:
    """A rung between lo and hi: their middle, rounded to a multiple of the largest power of
    two at most a quarter of the gap (so rungs fall on whole tiles where the gap is wide)."""
    q = 1 << max(0, int(math.log2(max(1, (hi - lo) // 4))))
    mid = -(-(lo + hi) // (2 * q)) * q
    return min(max(mid, lo + 1), hi - 1)
