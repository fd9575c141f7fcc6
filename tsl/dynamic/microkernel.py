"""Micro-kernels with run-time rows: which schedule serves which range of the symbol.

Each range (lo, hi] of the ladder gets one kernel: the model's best schedule at `hi` (what a
static build of `hi` runs) among those that record at every value of the range; a value runs
its range's kernel, padded to its blocks. Three ways to weigh the padding of the range's
lower values measured slower on a Xeon (AVX-512; benchmarks/README.md, dyn37), because the
model misjudges knobs it rates near-equal: pricing the candidates over sample values of the
range (DietCode-style, each padded to its row block) picked knobs the model rated 0.5-1%
better that ran 1.3-1.7x slower than the static build's (dense 768->3072 at m = 16, 31, 64,
333, 512); running each value on whichever compiled kernel the model prices least padded (a
lower range's smaller block) ran 1.1-1.4x slower than the range's own kernel at m = 33, 65,
100, 129; and the top's knobs with the rows' outer tile cut (block 32 -> 8, the model +1%
at the top) won at m = 100 of 768->3072 but lost 10-30% at m = 128 and 333 elsewhere.
"""

from __future__ import annotations

import math

from ..errors import ScheduleError
from ..model import evaluate, search
from ..model.search import record_fixed
from . import plan
from .symbolic import blocks_of, padded_op

TOP = 12  # the model's best candidates at a range's top that the family tuner measures
SAMPLES = 4  # values per range a candidate is checked (and tuned) at


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
    """The kernel for values (lo, hi]: the model's best at `hi` whose knobs record at every
    sample value of the range, padded to their blocks (see the module's text)."""
    name = next(iter(fam.syms))
    pts = samples(lo, hi)
    for c in search(fam.at(**{name: hi}), machine, fn, fixed, check=check).candidates:
        if all(padded_schedule(fam, fn, c.schedule, axes, v) is not None for v in pts):
            s = c.schedule
            return plan.Kernel(hi, s, c.estimate.seconds, blocks=blocks_of(s, axes), fn=fn)
    raise ScheduleError(f"{fam}: no schedule of the model's fits every value of {name} in "
                        f"({lo}, {hi}]")


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
