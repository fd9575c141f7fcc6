"""Micro-kernels with run-time rows: which schedule serves which range of the symbol.

Each range (lo, hi] of a doubling ladder gets one schedule, chosen DietCode-style by its
cost over the range rather than at one value: the model's candidates at `hi` (the best
ones, and the best of each row block) are priced at sample values of the range, each padded
to that candidate's row block, and the lowest total wins. A big row block is the fastest at
`hi` but pads small values a lot; the samples weigh that.
"""

from __future__ import annotations

import math

from ..errors import ScheduleError
from ..model import evaluate, search
from ..model.search import record_fixed
from . import plan
from .symbolic import blocks_of, padded_op

TOP = 12  # the model's best candidates at the range's top that are priced over the range
SAMPLES = 4  # values per range they are priced at


def padded_price(fam, fn, s, axes, v: int) -> float:
    """Model seconds of schedule `s`'s knobs at value v padded to whole blocks of each
    symbolic axis; inf where those knobs do not record at that size."""
    try:
        t = record_fixed(padded_op(fam, v, blocks_of(s, axes)), s.machine, fn,
                         dict(s.knob_values))
    except ScheduleError:
        return math.inf
    return evaluate(t).seconds


def samples(lo: int, hi: int) -> list[int]:
    """Values spread over (lo, hi], ends included."""
    pts = {lo + 1, hi} | {lo + 1 + (hi - lo - 1) * n // (SAMPLES - 1) for n in range(SAMPLES)}
    return sorted(p for p in pts if lo < p <= hi)


def choose(fam, machine, fn, axes, lo: int, hi: int, fixed: dict | None,
           check) -> plan.Kernel:
    """The kernel for values (lo, hi]: the candidate of least total model time there."""
    name = next(iter(fam.syms))
    choice = search(fam.at(**{name: hi}), machine, fn, fixed, check=check)
    by_block: dict[tuple, object] = {}
    for c in choice.candidates:
        by_block.setdefault(tuple(blocks_of(c.schedule, axes).items()), c)
    pool = {id(c): c for c in choice.candidates[:TOP]} | {id(c): c for c in by_block.values()}
    best, best_cost = None, math.inf
    pts = samples(lo, hi)
    for c in pool.values():
        cost = sum(padded_price(fam, fn, c.schedule, axes, v) for v in pts)
        if cost < best_cost:
            best, best_cost = c, cost
    if best is None or not math.isfinite(best_cost):
        raise ScheduleError(f"{fam}: no schedule of the model's fits every value of "
                            f"{name} in ({lo}, {hi}]")
    s = best.schedule
    return plan.Kernel(hi, s, best.estimate.seconds, blocks=blocks_of(s, axes), fn=fn)


def kernels(fam, machine, fn, axes, rungs: list[int], upper: int, fixed,
            check) -> list[plan.Kernel]:
    """One kernel per range between rungs; the top one's range reaches `upper`."""
    out, lo = [], 0
    for n, hi in enumerate(rungs):
        top = upper if n == len(rungs) - 1 else hi
        k = choose(fam, machine, fn, axes, lo, top, fixed, check)
        out.append(k)
        lo = top
    return out


def table(fam, kernels: list[plan.Kernel]) -> plan.Table:
    """Each range runs its kernel; prices come from the model on demand."""
    ranges, lo = [], 1
    for n, k in enumerate(kernels):
        ranges.append(plan.Range(lo, k.value, n, False))
        lo = k.value + 1
    tab = plan.Table(ranges, None)

    def price(v: int) -> float:
        k = kernels[tab.at(v).kernel]
        return padded_price(fam, k.fn, k.schedule, tuple(k.blocks), v) + plan.CALL_SECONDS
    tab.seconds = price
    return tab
