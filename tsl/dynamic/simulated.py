"""Families on a back end whose measurement is a simulation (`measure` of kind "simulated":
VTA's cycle count), priced by what each kernel's program costs there, not by the model.

A simulated call's cost is exact and deterministic, and cheap to have once the kernel is
built, so the table (`plan.table`) weighs the kernels' simulated times, and may cut a value
into calls of any kernel (`cut_any`): a call's price is then what it costs, where on the CPU
the model missed each call's fixed costs (`plan`'s text). The ladder changes two ways:

- Its top stops where a rung's time per value is within PLATEAU of the rung before it (the
  program is bound by its compute there): larger values are cut into calls of the rungs
  below, whose extra call costs a few percent of such values, instead of compiling the
  largest programs (dense 768->3072 on vta-1x16x16: 11.50 k cycles per row at 512, 11.49 k
  at 1024, which took as long to compile as the 16 rungs below it).
- Where a value is padded (or cut) to a price above TOLERANCE times the line between the
  two rungs around it (what a program of its own would cost, about), a rung is added in the
  middle of that gap, at most EXTRA of them: the gaps of the ratio-1.5 ladder pad a
  compute-bound value by up to half (768->3072 at m = 100 ran the 128 rung, 1.19x its
  static program's cycles; benchmarks/README.md, vta46).
"""

from __future__ import annotations

import math

from . import plan

PLATEAU = 0.02  # a rung this much cheaper per value than the one below it ends the ladder
TOLERANCE = 1.06  # a plan's price over the line between rungs that adds a rung
EXTRA = 10  # rungs added at most


def priced(backend, kernels: list[plan.Kernel], chunkable: bool, options: dict):
    """The kernels built in order of value and their `seconds` the simulated time of a call,
    up to the plateau (`PLATEAU`, chunkable families only: others need the bound's rung)."""
    out = []
    for k in sorted(kernels, key=lambda k: k.value):
        _price(backend, k, options)
        flat = bool(out) and (k.seconds / k.value
                              >= (1 - PLATEAU) * out[-1].seconds / out[-1].value)
        out.append(k)
        if chunkable and flat:
            break
    return out


def refined(backend, add, kernels: list[plan.Kernel], upper: int, call_s: float,
            options: dict) -> tuple[list[plan.Kernel], plan.Table]:
    """The table of `kernels`, with rungs added (`add(value)` records one) in the middle of
    the gap of the value whose plan is priced worst against the line between the rungs
    around it, until every value is within TOLERANCE or EXTRA rungs are added."""
    for _ in range(EXTRA + 1):
        tab = plan.table(kernels, upper, True, call_s, cut_any=True)
        gap = _worst_gap(kernels, tab)
        if gap is None:
            break
        lo, hi = gap
        k = add(_middle(lo, hi))
        _price(backend, k, options)
        kernels = sorted(kernels + [k], key=lambda k: k.value)
    else:
        tab = plan.table(kernels, upper, True, call_s, cut_any=True)
    return kernels, tab


def _price(backend, k: plan.Kernel, options: dict) -> None:
    if k.artifact is None:
        k.artifact = backend.build(k.schedule, **options)
    k.seconds = backend.measure(k.artifact).seconds


def _worst_gap(kernels, tab: plan.Table) -> tuple[int, int] | None:
    """The rungs (lo, hi) around the value priced worst against the line between their
    prices, where that is above TOLERANCE and a rung fits between them."""
    worst, gap = TOLERANCE, None
    for a, b in zip(kernels, kernels[1:]):
        if b.value - a.value < 2:
            continue
        for v in range(a.value + 1, b.value):
            line = a.seconds + (b.seconds - a.seconds) * (v - a.value) / (b.value - a.value)
            r = (tab.price(v) - tab.call_seconds) / line
            if r > worst:
                worst, gap = r, (a.value, b.value)
    return gap


def _middle(lo: int, hi: int) -> int:
    """A rung between lo and hi: their middle, rounded to a multiple of the largest power of
    two at most a quarter of the gap (so rungs fall on whole tiles where the gap is wide)."""
    q = 1 << max(0, int(math.log2(max(1, (hi - lo) // 4))))
    mid = -(-(lo + hi) // (2 * q)) * q
    return min(max(mid, lo + 1), hi - 1)
