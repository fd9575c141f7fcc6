"""Default knobs are the model's choice: the knobs a user leaves unset are the ones that
minimize `evaluate` over the schedule's own knob space.

A schedule function declares each knob's choices as it runs (`s.knob(name, choices)`), and a
choice may depend on another knob's value (the outer tile multiples of an inner tile). So a
candidate is evaluated by recording the schedule function again with all its knobs fixed;
a candidate that does not fit the machine raises ScheduleError and is dropped. The space is
searched exhaustively when it is small; otherwise from the best of a random sample, by
coordinate descent (every value of one knob at a time, from the space the current best
records; a move that does not fit is retried with one other knob a step smaller; then every
change of two integer knobs that keeps their product) until no move improves. Knobs declared
`refines=True` (a split of the reduction) are not drawn: the others are searched so once per
value of them, in the space that value records (in full for the first value; the others with
an eighth of the samples and starts, each also descending from the best setting of the value
before it). Settings priced within TIE of the best are equal to the model; of them the
register tile reading the fewest operand bytes per MAC comes first (`_near_ties_first`).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Callable

from ..errors import ScheduleError
from ..primitives.schedule import Schedule
from .cost import evaluate, operand_bytes_per_mac
from .estimate import Estimate

EXHAUSTIVE = 384  # spaces up to this many combinations are searched whole
SAMPLE = 128  # random combinations drawn to seed the descent of a larger space
STARTS = 6  # descents started from the best of them
WARM = 3  # best settings of one split's search that seed the next split's
# Estimates within this fraction of the best are equal to the model (`_near_ties_first`).
TIE = 0.005
# ... and ordered by operand bytes only where the reduction is at least this long: the load
# pressure the bytes stand for is the k loop's steady state; at K = 64 or 192 the tile with
# the fewest bytes ran 1.2-1.6x slower than the model's first (fixed costs per tile), at
# K >= 768 0.88-1.0 (2-core Emerald Rapids, benchmarks/README.md "lead40").
LONG_K = 256


def record_fixed(op, machine, fn: Callable, knobs: dict | None) -> Schedule:
    """Run schedule function `fn` with `knobs` (unset knobs take their first choice) and
    validate it: no model involved. Raises ScheduleError when it does not fit."""
    s = Schedule(op, machine, knobs)
    fn(s)
    s.validate()
    return s


@dataclass
class Candidate:
    knobs: dict
    schedule: Schedule
    estimate: Estimate


@dataclass
class Choice:
    """How a schedule's knobs were chosen: the knobs the caller fixed and every candidate the
    model priced, best first."""

    fn: Callable
    fixed: dict
    candidates: list = field(default_factory=list)
    refused: int = 0  # candidates that did not fit the machine
    exhaustive: bool = False

    @property
    def best(self) -> Candidate:
        return self.candidates[0]


class _Search:
    def __init__(self, op, machine, fn, fixed, check):
        self.op, self.machine, self.fn, self.fixed = op, machine, fn, dict(fixed or {})
        self.check = check
        self.seen: dict[tuple, Candidate | None] = {}
        self.why = ""  # the first refusal's reason, for the error when nothing fits
        self.refused = 0  # refusals in the searches of refining knobs' values

    def key(self, knobs: dict) -> tuple:
        return tuple(sorted(knobs.items(), key=lambda kv: kv[0]))

    def price(self, knobs: dict) -> Candidate | None:
        knobs = {**knobs, **self.fixed}
        k = self.key(knobs)
        if k not in self.seen:
            try:
                s = record_fixed(self.op, self.machine, self.fn, knobs)
                if self.check is not None:
                    self.check(s)
            except ScheduleError as e:
                self.seen[k] = None
                self.why = self.why or str(e)
            else:
                # Record again under the knobs the schedule really used (a knob it did not
                # ask for this time is dropped), so that equal schedules share one entry.
                self.seen[k] = Candidate(dict(s.knob_values), s, evaluate(s))
        return self.seen[k]

    def descend(self, start: Candidate) -> Candidate:
        best = start
        for _ in range(8):
            moved = False
            for name in sorted(best.schedule.space):
                if name in self.fixed:
                    continue
                for v in best.schedule.space[name]:
                    c = self.move(best, name, v)
                    if c is not None and c.estimate.seconds < best.estimate.seconds * (1 - 1e-9):
                        best, moved = c, True
            for c in self.trades(best):
                if c.estimate.seconds < best.estimate.seconds * (1 - 1e-9):
                    best, moved = c, True
            if not moved:
                break
        return best

    def trades(self, best: Candidate):
        """`best` with two numeric knobs changed so that their product stays: a tile traded
        between levels or axes (a warp tile of 128 x 32 for 64 x 64 in the same block), which
        moving one knob at a time cannot reach when each move alone is worse."""
        space = best.schedule.space
        names = [n for n in sorted(space) if n not in self.fixed and n in best.knobs
                 and all(type(v) is int and v > 0 for v in space[n])]
        for a, b in itertools.combinations(names, 2):
            product = best.knobs[a] * best.knobs[b]
            for v in space[a]:
                if v != best.knobs[a] and product % v == 0 and product // v in space[b]:
                    c = self.price({**best.knobs, a: v, b: product // v})
                    if c is not None:
                        yield c

    def move(self, best: Candidate, name: str, value) -> Candidate | None:
        """`best` with knob `name` at `value`; when that does not fit, the best of the same
        move with one other knob a step back in its list (spaces list small tiles first), so
        that a tile can grow along one axis while another shrinks to make room."""
        knobs = {**best.knobs, name: value}
        c = self.price(knobs)
        if c is not None or knobs == best.knobs:
            return c
        repaired = []
        for other, choices in best.schedule.space.items():
            if other == name or other in self.fixed or other not in knobs:
                continue
            i = list(choices).index(knobs[other]) if knobs[other] in choices else 0
            if i > 0:
                r = self.price({**knobs, other: choices[i - 1]})
                if r is not None:
                    repaired.append(r)
        return min(repaired, key=lambda r: r.estimate.seconds, default=None)


def search(op, machine, fn: Callable, fixed: dict | None = None, seed: int = 0,
           check: Callable | None = None, effort: float = 1.0,
           starts: tuple[dict, ...] = ()) -> Choice:
    """Price the knob space of `fn` for `op` on `machine` with the knobs in `fixed` held;
    every candidate found, best (fastest under the model) first. `check(schedule)` raises
    ScheduleError for a setting the back end cannot lower (its limits beyond the TAM's).
    `effort` scales the random sample and the descents started from it; `starts`: settings
    priced with the sample (the best of a neighbouring search), so a descent may start there."""
    srch = _Search(op, machine, fn, fixed, check)
    base = srch.price({})
    space = dict(base.schedule.space) if base else _discover(srch)
    free = sorted(n for n in space if n not in srch.fixed)
    exhaustive = math.prod(len(space[n]) for n in free) <= EXHAUSTIVE
    if exhaustive:
        for combo in itertools.product(*(space[n] for n in free)):
            srch.price(dict(zip(free, combo)))
    else:
        later = sorted(n for n in free if base is not None and n in base.schedule.refining)
        if later:
            # Knobs that refine the others' setting (a split of the reduction): the others
            # are searched once per value of these, each value with the space it records
            # (drawn from the joint space, most samples would not fit together).
            warm: tuple[dict, ...] = ()
            for i, combo in enumerate(itertools.product(*(space[n] for n in later))):
                try:  # the first values (no split) in full; the others with an eighth, from
                    # the best settings of the values before as well as their own sample
                    sub = search(op, machine, fn, {**srch.fixed, **dict(zip(later, combo))},
                                 seed, check, effort if i == 0 else effort / 8, warm)
                except ScheduleError:  # nothing fits with these values
                    continue
                warm = tuple(c.knobs for c in sub.candidates[:WARM])
                for c in sub.candidates:
                    srch.seen.setdefault(srch.key(c.knobs), c)
                srch.refused += sub.refused
        else:
            rng = random.Random(seed)
            seeded = [c for c in (srch.price({n: v for n, v in knobs.items() if n in free})
                                  for knobs in starts) if c is not None]
            for _ in range(max(1, round(SAMPLE * effort))):
                srch.price({n: rng.choice(space[n]) for n in free})
            ranked = sorted((c for c in srch.seen.values() if c is not None),
                            key=lambda c: c.estimate.seconds)
            tops = ranked[:max(1, round(STARTS * effort))]
            # The best of the seeded settings descends too, unless the sample's best is it.
            best_seed = min(seeded, key=lambda c: c.estimate.seconds, default=None)
            if best_seed is not None and all(best_seed is not c for c in tops):
                tops.append(best_seed)
            for start in tops:
                srch.descend(start)
    found = {}
    for c in srch.seen.values():
        if c is not None:
            found.setdefault(srch.key(c.knobs), c)
    if not found:
        raise ScheduleError(f"no setting of the knobs {free} of {getattr(fn, '__name__', fn)} "
                            f"fits {op} on {machine.name} (fixed: {srch.fixed or 'none'}); "
                            f"pass knobs= that fit. The first refusal: {srch.why}")
    cands = _near_ties_first(sorted(found.values(), key=lambda c: c.estimate.seconds))
    refused = srch.refused + sum(1 for c in srch.seen.values() if c is None)
    return Choice(fn, srch.fixed, cands, refused, exhaustive)


def _near_ties_first(cands: list) -> list:
    """`cands` (best first) with the candidate whose register tile reads the fewest operand
    bytes per MAC (`cost.operand_bytes_per_mac`) first among those within TIE of the best,
    where the reduction is LONG_K or longer.
    The model prices a tile's operand loads only where they outlast its primitive issues;
    below that they still cost: on an Emerald Rapids host (benchmarks/README.md, enc40) a
    128x768->3072 GEMM ran 7-8% faster with an 8x3 tile than with 8x2, 128x768->768 9-20%
    slower with 4x3, all priced within 0.35% of each other and ordered by the search's
    sample (a bias in the epilogue or not changed which came first); ResNet-18's 28x28 3x3
    convs ran 7-27% faster with the 8-row tiles the rule picks. gemm39's C copy ranked the
    24-accumulator tiles by the same bytes (12x2, 8x3 ahead of 6x4, then 4x6)."""
    best = cands[0]
    if math.prod(a.extent for a in best.schedule.op.axes_of("k")) < LONG_K:
        return cands
    tied = [c for c in cands if c.estimate.seconds <= best.estimate.seconds * (1 + TIE)]

    def moved(c) -> int:  # knobs changed from the best's
        return sum(c.knobs.get(k) != best.knobs.get(k) for k in {*c.knobs, *best.knobs})

    # Only the register tile is what the bytes decide: of the settings with the fewest, the
    # one keeping most of the best's other knobs (its parallel axes, block order).
    first = min(tied, key=lambda c: (round(operand_bytes_per_mac(c.schedule), 9), moved(c)))
    return [first] + [c for c in cands if c is not first]


def _discover(srch: _Search) -> dict:
    """The knob space when the first choices do not fit: fix the knobs one at a time to their
    other choices until some setting records."""
    knobs: dict = {}
    for _ in range(16):
        s = Schedule(srch.op, srch.machine, {**knobs, **srch.fixed})
        try:
            srch.fn(s)
            return dict(s.space)
        except ScheduleError:
            # The knobs recorded before the failure are the ones that caused it: smallest
            # tiles are listed first, so try each knob's other values in turn.
            pending = [n for n in s.space if n not in srch.fixed and n not in knobs]
            if not pending:
                break
            for n in pending:
                knobs[n] = s.space[n][-1]
    raise ScheduleError(f"{getattr(srch.fn, '__name__', srch.fn)} does not record for "
                        f"{srch.op} on {srch.machine.name} with knobs {srch.fixed}")


def choose(op, machine, fn: Callable, fixed: dict | None = None,
           check: Callable | None = None) -> Schedule:
    """The recorded schedule with the unset knobs at the model's choice; `schedule.choice`
    keeps the search (see `explain`)."""
    choice = search(op, machine, fn, fixed, check=check)
    s = choice.best.schedule
    s.choice = choice
    return s


def explain(s: Schedule, top: int = 5) -> str:
    """Why `s` has its knobs: the best `top` candidates the model priced, and what bounds each
    (the level whose traffic, or the compute, sets its time)."""
    choice = getattr(s, "choice", None)
    if choice is None:
        return (f"{s.op} on {s.machine.name}: every knob was given "
                f"({', '.join(f'{k}={v!r}' for k, v in s.knob_values.items())}); the model "
                f"chose nothing.\n{evaluate(s)}")
    head = (f"{s.op} on {s.machine.name}: {len(choice.candidates)} knob settings priced"
            f" ({'the whole space' if choice.exhaustive else 'sampled, then coordinate descent'}"
            f"; {choice.refused} did not fit)"
            + (f", fixed by the caller: {choice.fixed}" if choice.fixed else ""))
    best = choice.best.estimate.seconds
    lines = [head]
    for n, c in enumerate(choice.candidates[:top], 1):
        e = c.estimate
        knobs = ", ".join(f"{k}={v!r}" for k, v in sorted(c.knobs.items())
                          if k not in choice.fixed)
        levels = ", ".join(f"{lv} {t * 1e6:.1f}" for lv, t in e.level_seconds.items())
        levels = f", {levels} us" if levels else ""
        lines.append(f" {n}. {e.seconds * 1e6:10.1f} us ({e.seconds / best:.2f}x)  bound by "
                     f"{e.bound}: compute {e.compute_seconds * 1e6:.1f} us{levels}"
                     f"; {100 * e.utilization:.0f}% of peak\n      {knobs}")
    return "\n".join(lines)
