"""Micro-kernels for a symbol's range and the decision table that picks them per value.

A micro-kernel here is the family's schedule recorded (knobs chosen by the cost model, or
tuned) at one value of the symbol, a rung of a ladder over [1, upper]. Its model time is
known when it is chosen, so the table is a dynamic programme over every value: value v is
run by the kernel of a value >= v that the model prices lowest, its inputs zero-padded up
to it, or -- above the top rung, where the symbol's axis can be cut (`Dims.chunk_axis`) --
by the top kernel on the first T values and the table again on the other v - T.

Only the top kernel cuts: cutting a value below it into several calls looked free to the
model (its time is the tiles' traffic) and measured up to 2x slower on the CPU (each call
converts its weights and forks the thread pool; dense 768->3072 at m=100 as 32+4+64: 11.7
ms against 5.3 ms static), so below the top a value is one call, padded to the next rung.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ..errors import ScheduleError
from ..primitives.schedule import Schedule
from .calls import CALL_SECONDS

# Chunkable families stop the ladder here (times the granule): larger values are cut in
# chunks this big, so a kernel is not compiled for every size up to the bound; big enough
# that a call's fixed cost is a few percent of its work.
CHUNK_TOP = 1024
# Rungs grow by 3/2 then 4/3 (1, 1.5, 2, 3, 4, ...): no value pads by more than half.


@dataclass
class Kernel:
    value: int  # the symbol's value the kernel is compiled at
    schedule: Schedule
    seconds: float  # the cost model's time of one call
    artifact: object = None  # the back end's artifact, once compiled
    blocks: dict = field(default_factory=dict)  # run-time axes -> the block each pads to
    fn: object = None  # the schedule function (to price the knobs at other values)
    margin: float = 1.0  # a range's second or third kernel: how many times below the others'
    # price the model must put it at a value for the value to run it (`microkernel.second`)
    measured: dict | None = None  # a tuned family's kernel: seconds per value timed

    @property
    def knobs(self) -> dict:
        return dict(self.schedule.knob_values)


@dataclass(frozen=True)
class Range:
    """Values lo..hi run kernel `kernel` first: on all of them, padded (chunk False), or on
    its own value's worth, the rest by the table again (chunk True)."""

    lo: int
    hi: int
    kernel: int
    chunk: bool


@dataclass
class Table:
    ranges: list[Range]
    seconds: object = field(repr=False)  # model time per value: a list, or v -> seconds
    call_seconds: float = CALL_SECONDS  # one call's fixed cost in those times (`calls`)
    basis: str = "model"  # what priced the kernels: "model", or "simulated" (`simulated`)

    def __post_init__(self):
        self._los = [r.lo for r in self.ranges]

    def at(self, v: int) -> Range:
        return self.ranges[bisect.bisect_right(self._los, v) - 1]

    def price(self, v: int) -> float:
        return self.seconds(v) if callable(self.seconds) else self.seconds[v]

    def used(self) -> set[int]:
        return {r.kernel for r in self.ranges}


def ladder(upper: int, granule: int, chunkable: bool, ratio: float = 1.5) -> list[int]:
    """Rungs: granule x 1, 1.5, 2, 3, 4, 6, ... (`ratio` 2: x 1, 2, 4, ...) up to the bound,
    or to CHUNK_TOP granules when values can be cut; the bound itself when below that."""
    top = min(upper, granule * CHUNK_TOP) if chunkable else upper
    rungs, p = set(), 1
    while granule * p < top:
        rungs.add(granule * p)
        if ratio < 2 and granule * p * 3 // 2 < top:
            rungs.add(granule * p * 3 // 2)
        p *= 2
    rungs.add(top)
    return sorted(rungs)


def table(kernels: list[Kernel], upper: int, chunkable: bool,
          call_s: float = CALL_SECONDS, cut_any: bool = False) -> Table:
    """The cheapest plan (each kernel's `seconds` + `call_s` per call: `calls.call_seconds`)
    for every value 1..upper. `cut_any`: every kernel may cut, not only the top (where its
    `seconds` are what a call costs, `simulated`)."""
    top = max(range(len(kernels)), key=lambda n: kernels[n].value)
    cost = [0.0] * (upper + 1)
    first: list[tuple[int, bool]] = [(0, False)] * (upper + 1)
    for v in range(1, upper + 1):
        best = None
        for n, k in enumerate(kernels):
            if k.value >= v:
                c, step = k.seconds + call_s, (n, False)
            elif chunkable and (cut_any or n == top):
                c, step = k.seconds + call_s + cost[v - k.value], (n, True)
            else:
                continue
            if best is None or c < best:
                best, first[v] = c, step
        if best is None:
            raise ScheduleError(f"no kernel covers value {v}: the largest is "
                                f"{kernels[top].value} and values cannot be cut here")
        cost[v] = best
    ranges: list[Range] = []
    for v in range(1, upper + 1):
        if ranges and (ranges[-1].kernel, ranges[-1].chunk) == first[v]:
            ranges[-1] = Range(ranges[-1].lo, v, *first[v])
        else:
            ranges.append(Range(v, v, *first[v]))
    return Table(ranges, cost, call_s)


def pieces(tab: Table, kernels: list[Kernel], v: int) -> list[tuple[int, int]]:
    """The calls that run value v: (kernel index, values it covers), in order."""
    out = []
    while v > 0:
        r = tab.at(v)
        take = kernels[r.kernel].value if r.chunk else v
        out.append((r.kernel, take))
        v -= take
    return out


def describe(tab: Table, kernels: list[Kernel], name: str) -> str:
    """The decision table as text: each range, the kernel it runs and the model's why."""
    lines = [f"{name} -> micro-kernels ({tab.basis} seconds per call: kernel time + "
             f"{tab.call_seconds * 1e6:.0f} us per call)"]
    for n, k in enumerate(kernels):
        mark = "" if n in tab.used() else "  (not used: never the cheapest)"
        rows = f" (any {name}: padded to blocks {k.blocks})" if k.blocks else ""
        lines.append(f"  kernel {n}: chosen at {name}={k.value}{rows}, "
                     f"{k.seconds * 1e3:.4f} ms there, knobs {k.knobs}{mark}")
    for r in tab.ranges:
        k = kernels[r.kernel]
        how = (f"kernel {r.kernel} on {k.value}, the rest by this table" if r.chunk
               else f"kernel {r.kernel}, padded to whole blocks {k.blocks}" if k.blocks
               else f"kernel {r.kernel}, padded to {name}={k.value}")
        span = f"[{r.lo}, {r.hi}]" if r.lo != r.hi else f"{r.lo}"
        lines.append(f"  {name} in {span}: {how}; {tab.basis} {tab.price(r.lo) * 1e3:.4f}"
                     f"..{tab.price(r.hi) * 1e3:.4f} ms")
    return "\n".join(lines)
