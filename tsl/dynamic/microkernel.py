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

So the top's kernel stays, and where its blocks pad a range's values a second kernel of a
smaller block (`second`) runs just those the model prices it MARGIN below the top at: there
the padded rows are a difference the model sees (768->3072 at m = 100 / 200 / 333: 1.12 /
1.11 / 1.44 of static -> 0.99 / 1.00 / 1.03; benchmarks/README.md, dyn39). Both come from
the search at the top, so their blocks suit the top's value; a third (`third`), the model's
best at the sample inside the range its two serve worst, runs the values around that sample
it is priced MARGIN below them at (attention's scores at s = 100: 1.07-1.17 of static on
the top's blocks, 0.96 on the third's; dyn45). A tuned range (`tsl.tune` of the family)
runs the kernels it measured instead, split by their timings.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ScheduleError
from ..model import evaluate, search
from ..model.search import record_fixed
from . import jobs, plan
from .symbolic import blocks_of, padded, padded_op

TOP = 12  # the model's best candidates at a range's top that the family tuner measures
SAMPLES = 4  # values per range a candidate is checked (and tuned) at
# A tuned range's value runs another measured kernel than the range's first (the untuned
# top, where the tuning measured it) only where its timings are lower by more than this: a
# kernel timed again read a few percent apart (the least of 5 calls, at real-time priority
# under the timing lock), and the untuned top is what a static build at the top runs.
MEASURED_NOISE = 0.05
# Values up to SMALL each get a kernel of their own: there a GEMM's row block is its register
# tile, which a static build sizes to the value (5 rows at m = 5); m = 5 padded to a 4- or
# 8-row block measured 1.2-1.6x the static call (dense 768->3072, Xeon and Zen 4). A range's
# second kernel has blocks of at least SMALL as well: one of 2 rows (the model's pick for
# m in (8, 16] of 768->3072) ran m = 10-14 at 1.10-1.27 of static, its top's block 0.96-1.10.
SMALL = 6
# A value runs its range's second kernel only where the model prices it this many times
# below the top's kernel there: between kernels it prices within a few percent its ranking
# is no better than chance (dense 3072->768 at m = 333: a second kernel priced 5% below the
# top's ran 1.25x its time; 768->3072 at m = 100-333, priced 20-50% below, 0.8x).
MARGIN = 1.1
# ... except where the model prices the second no dearer per padded element than the top
# (within this fraction) and its blocks pad the value less: then the price difference is
# the padding alone, which the model counts exactly, not a ranking of near-equal knobs.
# Attention's scores at s = 333 (Zen 4): the top's 16 x 64 blocks (336 x 384) against the
# second's 8 x 32 (336 x 352), priced 8.2% below for 9.1% less padded work, ran 0.91 of
# static against the top's 1.01 (benchmarks/README.md, dyn44); dense 3072->768 at m = 333
# (Xeon), priced 5% below for 9.1% less work (3.6% dearer per row), ran 1.25x (dyn39).
SAME_WORK = 0.01


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
           check) -> list[plan.Kernel]:
    """The kernels for values (lo, hi]: the model's best at `hi` whose knobs record at every
    sample value of the range, padded to their blocks (see the module's text), where that
    block pads some sample `second`'s kernel for the values it pads, and `third`'s."""
    name = next(iter(fam.syms))
    pts = samples(lo, hi)
    found = search(fam.at(**{name: hi}), machine, fn, fixed, check=check).candidates
    for c in found:
        if all(padded_schedule(fam, fn, c.schedule, axes, v) is not None for v in pts):
            top = plan.Kernel(hi, c.schedule, c.estimate.seconds,
                              blocks=blocks_of(c.schedule, axes), fn=fn)
            ks = [top] + second(fam, fn, axes, pts, top, found)
            return ks + third(fam, machine, fn, axes, lo, hi, ks, fixed, check)
    raise ScheduleError(f"{fam}: no schedule of the model's fits every value of {name} in "
                        f"({lo}, {hi}]")


def second(fam, fn, axes, pts: list[int], top: plan.Kernel, found) -> list[plan.Kernel]:
    """[a kernel] for the values of a range that the top's blocks pad, or [] where none is
    worth it: of `_others`, the one that lowers the model's time summed over the sample
    values `pts` most, each value priced on whichever of the two kernels is cheaper there
    (padded to its blocks, by the candidate's margin). The top stays for the values its
    blocks fit: the model misjudges knobs it rates near-equal (the module's text), so a
    second kernel runs only where padding makes the difference."""
    padding = [v for v in pts if any(padded(v, b) != v for b in top.blocks.values())]
    if not padding:
        return []
    base = {v: padded_price(fam, fn, top.schedule, axes, v) for v in padding}
    best, gain = None, 0.0
    for c, margin in _others(top, found, axes):
        g = sum(max(0.0, base[v] - margin * padded_price(fam, fn, c.schedule, axes, v))
                for v in padding)
        if g > gain:
            best, gain = (c, margin), g
    if best is None:
        return []
    c, margin = best
    return [plan.Kernel(top.value, c.schedule, c.estimate.seconds,
                        blocks=blocks_of(c.schedule, axes), fn=fn, margin=margin)]


def third(fam, machine, fn, axes, lo: int, hi: int, ks: list[plan.Kernel],
          fixed: dict | None, check) -> list[plan.Kernel]:
    """[a kernel] for the values around the sample inside the range that the range's
    kernels `ks` (its top and second) serve worst, or []: the model's best at that sample,
    where it lowers the model's time over the values it can serve (`reach`), each value
    priced on it only where the model puts it MARGIN below what `ks` run there. The top's
    candidates have the blocks that suit the top: attention's scores at s = 100 ran the
    top's 8 x 32 blocks (104 x 128) at 1.07-1.17 of static; the model's best at 107 (4 x
    112 blocks, as at 100) ran 0.96 (benchmarks/README.md, dyn45). One search per range:
    the sample served worst is the one whose model time exceeds most what its own
    (unpadded) work takes at the top's rate at `hi` (the time the range's kernels lose
    there), and none where they run it within MARGIN of that rate (the range's largest
    value's: the model prices no smaller value's best at a lower one)."""
    name = next(iter(fam.syms))
    prices = _Prices(fam)
    inside = samples(lo, hi)[1:-1]
    if not inside or len(axes) < 2:
        # One symbolic axis: the top's search offers a kernel of every row block, and the
        # second takes the one its padding calls for; the columns' blocks of a symbol in
        # two axes are the ones that suit the top's value (no 112 at 128)
        return []
    unit = dict.fromkeys(axes, 1)  # blocks of 1: a value's own (unpadded) work
    rate = ks[0].seconds / work(hi, unit)
    v = max(inside, key=lambda v: _now(ks, v, prices) - rate * work(v, unit))
    if _now(ks, v, prices) < MARGIN * rate * work(v, unit):
        return []  # no search: the model's best at v is not priced below the top's rate
    c = search(fam.at(**{name: v}), machine, fn, fixed, check=check).candidates[0]
    k = plan.Kernel(v, c.schedule, c.estimate.seconds, blocks=blocks_of(c.schedule, axes),
                    fn=fn, margin=MARGIN)
    if any(k.blocks == o.blocks for o in ks):
        return []
    gain = sum(max(0.0, _now(ks, w, prices) - MARGIN * prices(k, w))
               for w in reach(k, lo, hi) if not _whole(w, ks[0]))
    return [k] if gain > 0 else []


def _now(ks: list[plan.Kernel], v: int, prices) -> float:
    """The model's time at v of the kernel a range's top and second run it on."""
    return min(prices(k, v) for k in _runnable(ks, v, prices))


def reach(k: plan.Kernel, lo: int, hi: int) -> range:
    """The values of (lo, hi] in the block of k's largest block that holds its own value:
    beyond it the kernel pads by a whole block more (a kernel of the model's best at a value
    suits the values around it)."""
    step = max(k.blocks.values())
    end = padded(k.value, step)
    return range(max(lo + 1, end - step + 1), min(hi, end) + 1)


def _runnable(ks: list[plan.Kernel], v: int, prices) -> list[plan.Kernel]:
    """The kernels of a range's top and second that may run value v (`_split`'s rule)."""
    if len(ks) < 2:
        return ks
    top, sec = ks[:2]
    t, s = prices(top, v), prices(sec, v)
    return ks[:2] if s * margin_at(t, s, work(v, top.blocks), work(v, sec.blocks),
                                   sec.margin) < t else [top]


def _whole(v: int, top: plan.Kernel) -> bool:
    """Whether v is whole blocks of the top's: there the top is what a static build at v
    would run, and it runs v."""
    return all(padded(v, b) == v for b in top.blocks.values())


class _Prices:
    """padded_price of a kernel at a value, cached by the padded extents it runs there."""

    def __init__(self, fam):
        self.fam, self.cache = fam, {}

    def __call__(self, k: plan.Kernel, v: int) -> float:
        key = (id(k), tuple(padded(v, b) for b in k.blocks.values()))
        if key not in self.cache:
            self.cache[key] = padded_price(self.fam, k.fn, k.schedule, tuple(k.blocks), v)
        return self.cache[key]


def margin_at(top_s: float, second_s: float, top_work: int, second_work: int,
              margin: float) -> float:
    """How many times below the top's price (model seconds at a value, and the padded work
    there) a range's second kernel must be priced to run the value: its `margin`, or 1
    where its blocks pad the value less at the top's price per padded element (within
    SAME_WORK: the price difference is the padding)."""
    same = second_s / second_work <= (1 + SAME_WORK) * top_s / top_work
    return 1.0 if second_work < top_work and same else margin


def work(v: int, blocks: dict) -> int:
    """The symbolic axes' padded extents at v, multiplied: what a kernel of these blocks
    computes at v (the other axes are the same for every kernel of a family)."""
    return math.prod(padded(v, b) for b in blocks.values())


def _others(top: plan.Kernel, found, axes) -> list[tuple]:
    """(candidate, margin): the model's best at the top of each other block of at least
    SMALL rows, at MARGIN; and where the top runs its blocks inside another axis
    (`_blocks_inside`), its regroupings (one knob moved, blocks that divide the top's: the
    same tiles, fewer to a block) at 1: between a schedule and its own regrouping the padded
    rows are the difference the model prices (3072->768 at m = 200: the top's knobs with
    32-row blocks, priced 9.5% below the top's, ran 0.87x; dyn39)."""
    out: dict[tuple, tuple] = {}
    for c in found:
        blocks = blocks_of(c.schedule, axes)
        key = tuple(blocks.items())
        if key == tuple(top.blocks.items()) or min(blocks.values()) < SMALL:
            continue
        moved = sum(c.knobs.get(k) != v for k, v in top.knobs.items())
        if (moved == 1 and all(top.blocks[a] % b == 0 for a, b in blocks.items())
                and _blocks_inside(top.schedule, axes)):
            out.setdefault((key, 1.0), (c, 1.0))
        out.setdefault((key, MARGIN), (c, MARGIN))
    return list(out.values())


def _blocks_inside(s, axes) -> bool:
    """Whether the outermost loop runs another output axis before the symbolic ones (a
    GEMM's columns outermost): regrouping such a top's rows ran 0.88-1.06 of static at every
    m tried, a rows-outermost top's 1.14-1.60 (dyn38; 768->3072 at 333: 1.156, dyn39)."""
    roles = {a.name: a.role for a in s.op.axes}
    order = [a for a in s.loops[0].axes if roles[a] in ("m", "n")]
    return bool(order) and order[0] not in axes


def ranges(rungs: list[int], upper: int) -> list[tuple[int, int]]:
    """(lo, hi] of each kernel of a ladder: one range per rung, the top one reaching
    `upper`."""
    tops = [upper if n == len(rungs) - 1 else hi for n, hi in enumerate(rungs)]
    return list(zip([0] + tops[:-1], tops))


def kernels(fam, machine, fn, axes, rungs: list[int], upper: int, fixed,
            check, tuned: dict | None = None) -> list[list[plan.Kernel]]:
    """Per range between rungs (the top one's reaching `upper`) its kernels: the top's, and
    a second for the values it pads (`choose`; the ranges' searches in parallel, `jobs`).
    `tuned`: {range top: knobs, or the kernels `tsl.tune` measured for it as
    `tsl.tune.family.Measured`s} (those ranges skip the model's search)."""
    spans = ranges(rungs, upper)
    todo = [(lo, hi) for lo, hi in spans if not (tuned and hi in tuned)]
    chosen = dict(zip(todo, _chosen(fam, machine, fn, axes, todo, fixed, check)))
    return [_tuned(fam, machine, fn, axes, hi, tuned[hi]) if (lo, hi) not in chosen
            else chosen[lo, hi] for lo, hi in spans]


def _tuned(fam, machine, fn, axes, hi: int, given) -> list[plan.Kernel]:
    """A tuned range's kernels: one of the knobs given, or one per measured candidate
    (each with its timings, which `table` splits the range by)."""
    if isinstance(given, dict):
        return [with_knobs(fam, machine, fn, axes, hi, given)]
    out = [with_knobs(fam, machine, fn, axes, hi, m.knobs, m.at) for m in given]
    for k, m in zip(out, given):
        k.measured = dict(m.seconds)
    return out


def _chosen(fam, machine, fn, axes, todo: list, fixed, check) -> list[list[plan.Kernel]]:
    """`choose` of each range of `todo`: in forked workers, which send back each kernel's
    knobs and margin, recorded again here (the same schedules and model times); or here."""
    def task(span):
        return [(k.value, k.knobs, k.margin)
                for k in choose(fam, machine, fn, axes, *span, fixed, check)]
    got = jobs.mapped(task, todo)
    if got is None:
        return [choose(fam, machine, fn, axes, lo, hi, fixed, check) for lo, hi in todo]
    return [[_recorded(fam, machine, fn, axes, *k) for k in ks] for ks in got]


def _recorded(fam, machine, fn, axes, value: int, knobs: dict, margin: float) -> plan.Kernel:
    """The kernel `choose` made at `value` with `knobs` (the schedule's own: every knob it
    asked for), recorded again."""
    s = record_fixed(fam.at(**{next(iter(fam.syms)): value}), machine, fn, knobs)
    return plan.Kernel(value, s, evaluate(s).seconds, blocks=blocks_of(s, axes), fn=fn,
                       margin=margin)


def with_knobs(fam, machine, fn, axes, hi: int, knobs: dict,
               at: int | None = None) -> plan.Kernel:
    """The kernel for a range of top `hi` recorded with `knobs` (all of them given) at hi,
    or at value `at` inside the range (knobs that block a symbol in two axes for a value
    inside: `tsl.tune.family.Measured.at`)."""
    from ..record import record

    s = record(fam.at(**{next(iter(fam.syms)): at or hi}), machine, fn, knobs)
    s.as_written = True
    return plan.Kernel(hi, s, evaluate(s).seconds, blocks=blocks_of(s, axes), fn=fn)


def table(fam, per_range: list[list[plan.Kernel]],
          call_s: float = plan.CALL_SECONDS) -> tuple[list[plan.Kernel], plan.Table]:
    """The kernels in one list and the table over them: a range with one kernel runs it on
    every value; with two, each value runs the one the model prices lower padded there
    (`_split`); a third (chosen at a value inside the range: `third`) then takes the values
    of its reach the model prices it MARGIN below the others at (`_with_third`)."""
    kernels, rows, lo = [], [], 1
    for ks in per_range:
        first = len(kernels)
        kernels += ks
        hi = ks[0].value
        own = [k for k in ks if k.value == hi]
        if all(k.measured for k in ks) and len(ks) > 1:
            rows += _split_measured(ks, lo, hi, first)
            lo = hi + 1
            continue
        span = (_split(fam, own, lo, hi, first) if len(own) == 2
                else [plan.Range(lo, hi, first, False)])
        rows += _with_third(fam, ks, span, first) if len(ks) > len(own) else span
        lo = hi + 1
    merged: list[plan.Range] = []
    for r in rows:
        if merged and merged[-1].kernel == r.kernel:
            r = plan.Range(merged[-1].lo, r.hi, r.kernel, False)
            merged.pop()
        merged.append(r)
    tab = plan.Table(merged, None, call_s)

    def price(v: int) -> float:
        k = kernels[tab.at(v).kernel]
        return padded_price(fam, k.fn, k.schedule, tuple(k.blocks), v) + call_s
    tab.seconds = price
    return kernels, tab


def _split(fam, ks: list[plan.Kernel], lo: int, hi: int, first: int) -> list[plan.Range]:
    """Values lo..hi between a range's top kernel ks[0] and its second ks[1]: in each of the
    top's blocks the top's time is one price and the second's grows with the value, so the
    second runs the block's values up to the last it is priced lower at (a binary search),
    the top the rest."""
    top, sec = ks
    step = max(top.blocks.values())
    prices = _Prices(fam)

    def cheaper(v: int) -> bool:
        return len(_runnable(ks, v, prices)) == 2
    rows, a = [], lo
    while a <= hi:
        b = min(hi, padded(a, step))
        # The second is cheaper up to x, not beyond y; never on a whole number of the top's
        # blocks, where the top's kernel is what a static build at that value would be.
        x, y = a - 1, b - 1 if b == padded(b, step) else b
        while x < y:
            mid = (x + y + 1) // 2
            x, y = (mid, y) if cheaper(mid) else (x, mid - 1)
        if x >= a:
            rows.append(plan.Range(a, x, first + 1, False))
        if x < b:
            rows.append(plan.Range(x + 1, b, first, False))
        a = b + 1
    return rows


def _with_third(fam, ks: list[plan.Kernel], rows: list[plan.Range],
                first: int) -> list[plan.Range]:
    """`rows` (a range's values on its top and second) with the values of the third's
    `reach` that the model prices it its margin below the kernel they run, moved to it;
    never a whole number of the top's blocks."""
    prices = _Prices(fam)
    lo, hi, n3 = rows[0].lo, rows[-1].hi, first + len(ks) - 1
    pick = {v: r.kernel for r in rows for v in range(r.lo, r.hi + 1)}
    for v in reach(ks[-1], lo - 1, hi):
        if (not _whole(v, ks[0])
                and ks[-1].margin * prices(ks[-1], v) < prices(ks[pick[v] - first], v)):
            pick[v] = n3
    # one row per value: `table` merges neighbours that run the same kernel
    return [plan.Range(v, v, pick[v], False) for v in range(lo, hi + 1)]


def _split_measured(ks: list[plan.Kernel], lo: int, hi: int,
                    first: int) -> list[plan.Range]:
    """Values lo..hi of a tuned range, each on the kernel whose timings (`_line`) put it
    fastest there, where they put it more than MEASURED_NOISE below the range's first
    kernel's, else on the first: the measurements decide, not the model, which misranks
    near-equal knobs (the module's text) and a tuned range's kernels are such knobs; and
    readings that close do not order two kernels (attention's (64, 128]: a kernel read as
    fast as the untuned top at s = 128 ran 1.05 of the static tune there, the top 1.00-1.04;
    benchmarks/README.md, lead46)."""
    lines = [_line(k) for k in ks]

    def pick(v: int) -> int:
        t = [line(v) for line in lines]
        j = min(range(len(ks)), key=t.__getitem__)
        return j if t[j] * (1 + MEASURED_NOISE) < t[0] else 0
    return [plan.Range(v, v, first + pick(v), False) for v in range(lo, hi + 1)]


def _line(k: plan.Kernel):
    """v -> seconds: a least-squares line through the kernel's timings against the rows
    it runs (each value padded to its blocks: its work grows with those, its fixed cost
    does not); proportional to them where the samples pad to one size."""
    xs = [work(v, k.blocks) for v in k.measured]
    ts = list(k.measured.values())
    if len(set(xs)) < 2:
        per_row = sum(ts) / sum(xs)
        return lambda v: per_row * work(v, k.blocks)
    slope, fixed = np.polyfit(xs, ts, 1)
    return lambda v: fixed + slope * work(v, k.blocks)
