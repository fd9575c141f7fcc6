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


def padded_schedule(fam, fn, s, axes, v: int):
    """Schedule `s`'s knobs recorded at value v padded to whole blocks of each symbolic
    axis (what its kernel runs at v); None where those knobs do not record at that size."""
    try:
        return record_fixed(padded_op(fam, v, blocks_of(s, axes)), s.machine, fn,
                            dict(s.knob_values))
    except ScheduleError:
        return None


def padded_price(fam, fn, s, axes, v: int) -> float:
    """Model seconds of `padded_schedule` (inf where it does not record)."""
    t = padded_schedule(fam, fn, s, axes, v)
    return math.inf if t is None else evaluate(t).seconds


def samples(lo: int, hi: int) -> list[int]:
    """Values spread over (lo, hi], ends included."""
    pts = {lo + 1, hi} | {lo + 1 + (hi - lo - 1) * n // (SAMPLES - 1) for n in range(SAMPLES)}
    return sorted(p for p in pts if lo < p <= hi)


def pool(fam, machine, fn, axes, hi: int, fixed: dict | None, check,
         top: int = TOP) -> list:
    """The model's candidates at `hi` worth pricing over a range below it: its `top` best
    and the best of each row block (a small block pads small values least)."""
    name = next(iter(fam.syms))
    choice = search(fam.at(**{name: hi}), machine, fn, fixed, check=check)
    by_block: dict[tuple, object] = {}
    for c in choice.candidates:
        by_block.setdefault(tuple(blocks_of(c.schedule, axes).items()), c)
    return list(({id(c): c for c in choice.candidates[:top]}
                 | {id(c): c for c in by_block.values()}).values())


def choose(fam, machine, fn, axes, lo: int, hi: int, fixed: dict | None,
           check) -> plan.Kernel:
    """The kernel for values (lo, hi]: the candidate of least total model time there."""
    best, best_cost = None, math.inf
    pts = samples(lo, hi)
    for c in pool(fam, machine, fn, axes, hi, fixed, check):
        cost = sum(padded_price(fam, fn, c.schedule, axes, v) for v in pts)
        if cost < best_cost:
            best, best_cost = c, cost
    if best is None or not math.isfinite(best_cost):
        raise ScheduleError(f"{fam}: no schedule of the model's fits every value of "
                            f"{next(iter(fam.syms))} in ({lo}, {hi}]")
    s = best.schedule
    return plan.Kernel(hi, s, best.estimate.seconds, blocks=blocks_of(s, axes), fn=fn)


def ranges(rungs: list[int], upper: int) -> list[tuple[int, int]]:
    """(lo, hi] of each kernel of a ladder: one range per rung, the top one reaching
    `upper`."""
    tops = [upper if n == len(rungs) - 1 else hi for n, hi in enumerate(rungs)]
    return list(zip([0] + tops[:-1], tops))


def kernels(fam, machine, fn, axes, rungs: list[int], upper: int, fixed,
            check, tuned: dict | None = None) -> list[plan.Kernel]:
    """One kernel per range between rungs; the top one's range reaches `upper`. `tuned`:
    {range top: knobs} measured by `tsl.tune` (those ranges skip the model's search)."""
    out = []
    for lo, hi in ranges(rungs, upper):
        if tuned and hi in tuned:
            out.append(with_knobs(fam, machine, fn, axes, hi, tuned[hi]))
        else:
            out.append(choose(fam, machine, fn, axes, lo, hi, fixed, check))
    return out


def with_knobs(fam, machine, fn, axes, hi: int, knobs: dict) -> plan.Kernel:
    """The kernel for a range of top `hi` recorded with `knobs` (all of them given)."""
    from ..record import record

    s = record(fam.at(**{next(iter(fam.syms)): hi}), machine, fn, knobs)
    s.as_written = True
    return plan.Kernel(hi, s, evaluate(s).seconds, blocks=blocks_of(s, axes), fn=fn)


def table(fam, kernels: list[plan.Kernel],
          call_s: float = plan.CALL_SECONDS) -> plan.Table:
    """Each range runs its kernel; prices come from the model on demand."""
    rows, lo = [], 1
    for n, k in enumerate(kernels):
        rows.append(plan.Range(lo, k.value, n, False))
        lo = k.value + 1
    tab = plan.Table(rows, None, call_s)

    def price(v: int) -> float:
        k = kernels[tab.at(v).kernel]
        return padded_price(fam, k.fn, k.schedule, tuple(k.blocks), v) + call_s
    tab.seconds = price
    return tab
