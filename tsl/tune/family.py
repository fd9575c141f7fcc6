"""A tuned family's database entry (#25 part 3): its key, and the knobs a build takes from it.

    res = tsl.tune.tune(fam, "cpu", trials=128, database=db)   # fam: an operator with a sym
    art = tsl.build(fam, "cpu", knobs=db)                       # the tuned kernels, any value

A family built with run-time rows runs one kernel per range (lo, hi] of its symbol
(`tsl.dynamic.microkernel.ranges`); tuning measures candidates for each range at the range's
sample values (`microkernel.samples`). Every measurement is a record of ONE key, the
family's: the operator at value 1 with the symbol, its bound and the parameters it stands
for in place of a shape, then machine, machine file hash, schedule name and schedule source
hash (with tsl's version) as for any key. A record's knobs are {"knobs": the schedule's,
"top": the range's hi, "value": the value it was timed at}, and "at": the value inside the
range its knobs are recorded at, where they do not record at hi (`Measured.at`), and
"untuned" on the kernel an untuned build runs at hi (`Measured.untuned`). A range's tuned
knobs are those of least total time over all its samples, with up to two kernels beside
where other candidates are faster at some of them by more than NOISE (`beside`), and the
untuned top where measured, which runs the values none of them is timed NOISE below
(`best_knobs`); records of the same family made for another bound, or by another source of
the schedule, are reported (a warning) and not used.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

# NOISE: a kernel beside a range's best only where it beats the best (and those beside it)
# by more than this at one of its samples at least, the margin by which the build's split
# moves a value off the range's first kernel
from ..dynamic.microkernel import MEASURED_NOISE as NOISE
from ..ops.sym import Sym
from .keys import Key, knobs_key, machine_hash, schedule_hash, schedule_name, signature

BESIDE = 2  # kernels beside the best: as many as an untuned build runs beside its top


def family_key(fam, machine, fn) -> Key:
    name, sym = next(iter(fam.syms.items()))
    params = ",".join(p for p, v in fam.dims.items() if isinstance(v, Sym))
    op = f"family {name}<={sym.upper} in {params}: {signature(fam.at(**{name: 1}))}"
    return Key(op, machine.name, machine_hash(machine), schedule_name(fn), schedule_hash(fn))


def ranges(fam) -> list[tuple[int, int, list[int]]]:
    """(lo, hi, sample values) of each kernel's range, as a build with run-time rows makes
    them."""
    from ..dynamic import microkernel, symbolic_ladder

    upper = next(iter(fam.syms.values())).upper
    return [(lo, hi, microkernel.samples(lo, hi))
            for lo, hi in microkernel.ranges(symbolic_ladder(upper), upper)]


@dataclass
class Measured:
    """One candidate of one range: seconds per sample value (`error` when it failed)."""

    top: int
    knobs: dict
    seconds: dict = field(default_factory=dict)
    error: str | None = None
    # The value inside the range the knobs are recorded at, where they do not record at the
    # top: a symbol in two axes blocks them for its value (attention's 7 column blocks of 16
    # at s = 107 do not divide 128); its kernel still runs any value, padded
    at: int | None = None
    untuned: bool = False  # the kernel an untuned build runs at the range's top

    def record_knobs(self, v: int) -> dict:
        """The knobs of a database record of this candidate timed at v."""
        return ({"knobs": self.knobs, "top": self.top, "value": v}
                | ({"at": self.at} if self.at is not None else {})
                | ({"untuned": True} if self.untuned else {}))

    def total(self, pts) -> float | None:
        """Seconds summed over `pts`; None unless every one was timed."""
        if self.error is not None or any(v not in self.seconds for v in pts):
            return None
        return sum(self.seconds[v] for v in pts)


def measured(db, key: Key) -> dict[tuple, Measured]:
    """The family's records by (range top, knobs): each candidate's timings."""
    out: dict[tuple, Measured] = {}
    for r in db.records(key):
        if r.lost or not isinstance(r.knobs.get("knobs"), dict):
            continue
        k = (int(r.knobs["top"]), knobs_key(r.knobs["knobs"]))
        m = out.setdefault(k, Measured(k[0], r.knobs["knobs"], at=r.knobs.get("at"),
                                       untuned=bool(r.knobs.get("untuned"))))
        if r.ok:
            m.seconds[int(r.knobs["value"])] = r.seconds
        else:
            m.error = r.error
    return out


def best_knobs(db, fam, machine, fn) -> dict[int, list[Measured]] | None:
    """{range top: its kernels}, for the ranges the database measured completely: the
    candidate of least total time over the range's samples and `beside`'s, after the
    untuned top where it was measured; None when there are none (what does not apply is
    reported)."""
    key = family_key(fam, machine, fn)
    _report_other_bounds(db, key)
    db.report_stale(key)
    got = measured(db, key)
    out = {}
    for _, hi, pts in ranges(fam):
        done = [m for (top, _), m in got.items() if top == hi and m.total(pts) is not None]
        if done:
            top = min(done, key=lambda m: m.total(pts))
            ks = [top] + beside(top, done, pts)
            # the untuned top first where measured: the build runs a value on another kernel
            # only where its timings are more than NOISE below the first's; a best total 5%
            # below it ran 1.05 of static at s = 128 (attention's (64, 128]), the untuned
            # top 1.00-1.04 (lead46)
            untuned = [m for m in done if m.untuned]
            out[hi] = untuned[:1] + [m for m in ks if m not in untuned]
    return out or None


def beside(top: Measured, done: list[Measured], pts) -> list[Measured]:
    """Up to BESIDE candidates a build runs beside `top` on a range's values, each the one
    that takes most time off the range's samples where it beats `top` and those already
    chosen by more than NOISE at a sample: a build splits the range between them by their
    timings (`tsl.dynamic.microkernel`), so a candidate of a smaller row block runs the values
    the top's block pads (a 64-trial tune at m = 100 picks another kernel than the one least
    over (64, 128]: benchmarks/README.md, tune41); up to BESIDE, as an untuned build runs a
    top, a second and a third."""
    floor = dict(top.seconds)
    out: list[Measured] = []
    for _ in range(BESIDE):
        beats = [m for m in done if m is not top and m not in out
                 and any(m.seconds[v] * (1 + NOISE) < floor[v] for v in pts)]
        if not beats:
            break
        out.append(max(beats, key=lambda m: sum(max(0.0, floor[v] - m.seconds[v])
                                                 for v in pts)))
        floor = {v: min(floor[v], out[-1].seconds[v]) for v in pts}
    return out


def _report_other_bounds(db, key: Key) -> None:
    stem = re.sub(r"<=\d+ in", "<=* in", key.op)
    others = sorted({k.op.split(":")[0] for k in db.keys() if k != key
                     and re.sub(r"<=\d+ in", "<=* in", k.op) == stem
                     and (k.machine, k.schedule) == (key.machine, key.schedule)})
    if others:
        warnings.warn(f"tuning database {db.path}: records for {', '.join(others)} are for "
                      f"another bound than {key.op.split(':')[0]}; not used: tune this "
                      f"family", stacklevel=4)
