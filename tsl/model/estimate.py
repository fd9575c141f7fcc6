"""`Estimate`: what every cost report in tsl is, whether it comes from the analytic model, a
simulator or a clock.

One type for all: `tsl.model.evaluate(s)` returns it (kind "model"), the VTA simulator's cycle
count returns it (kind "simulated"), a timed CPU run returns it (kind "measured"). A back end
puts what only it knows (simulator counters, occupancy, ptxas registers) in `detail`; those
fields also read as attributes (`est.stats`, `est.occupancy`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("model", "simulated", "measured")


@dataclass
class Estimate:
    """Seconds of one run of an operator and where they go.

    traffic: bytes moved into each memory level over the whole run (by level name).
    level_seconds: time of each data path, named by the level the data streams out of (the
    model's paths; a simulator's modules); compute_seconds the tensor primitive's (and vector
    units') time. bound: the path or "compute" that sets the time. utilization: useful MACs
    per second over the machine's peak for the dtype.
    """

    seconds: float
    kind: str = "model"
    machine: str = ""
    clock_hz: float = 0.0
    bound: str = ""
    macs: int = 0
    padded_macs: int = 0
    peak_macs_per_s: float = 0.0
    compute_seconds: float = 0.0
    traffic: dict = field(default_factory=dict)
    level_seconds: dict = field(default_factory=dict)
    pipelined: bool = False
    notes: list = field(default_factory=list)
    detail: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Estimate kind must be one of {KINDS}, got {self.kind!r}")

    def __getattr__(self, name):
        # Only called for names that are not fields: a back end's detail field.
        detail = self.__dict__.get("detail")
        if detail is not None and name in detail:
            return detail[name]
        raise AttributeError(f"Estimate has no field or detail {name!r}")

    @property
    def cycles(self) -> int:
        """Seconds at the machine's clock, in cycles (0 when no clock is known)."""
        return round(self.seconds * self.clock_hz) if self.clock_hz else 0

    @property
    def utilization(self) -> float:
        """Useful MACs per second as a fraction of the machine's peak (0 when unknown)."""
        if not self.peak_macs_per_s or not self.seconds:
            return 0.0
        return self.macs / self.seconds / self.peak_macs_per_s

    @property
    def pct_peak(self) -> float:
        return 100.0 * self.utilization

    @property
    def waste(self) -> float:
        """Fraction of the MACs performed that are padding."""
        return 1 - self.macs / self.padded_macs if self.padded_macs else 0.0

    def with_(self, **changes) -> "Estimate":
        """A copy with some fields changed (detail merged)."""
        d = dict(self.__dict__)
        detail = {**d.pop("detail"), **changes.pop("detail", {})}
        d.update(changes)
        return Estimate(**d, detail=detail)

    def __str__(self) -> str:
        label = {"model": "model estimate", "simulated": "simulated", "measured": "measured"}
        head = f"{label[self.kind]} on {self.machine}: "
        head += (f"{self.cycles:,} cycles = {self.seconds * 1e3:.3f} ms"
                 if self.kind != "measured" and self.clock_hz else f"{self.seconds * 1e3:.3f} ms")
        if self.peak_macs_per_s:
            head += f", {self.pct_peak:.1f}% of peak"
        if self.bound:
            head += f", bound by {self.bound}"
        lines = [head]
        if self.padded_macs:
            lines.append(f"  MACs {self.macs:,} ({self.padded_macs:,} performed, "
                         f"{100 * self.waste:.1f}% padding): compute "
                         f"{self.compute_seconds * 1e6:.1f} us")
        if self.traffic:
            lines.append("  moved into: " + ", ".join(f"{lv} {b / 1e6:.3f} MB"
                                                      for lv, b in self.traffic.items()))
        if self.level_seconds:
            lines.append("  time per path: " + ", ".join(f"{lv} {t * 1e6:.1f} us"
                                                         for lv, t in self.level_seconds.items()))
        if self.level_seconds or self.compute_seconds:
            lines.append("  movement overlaps compute (pipelined)" if self.pipelined
                         else "  movement and compute add up (not pipelined)")
        lines += [f"  {n}" for n in self.notes]
        for k, v in self.detail.items():
            text = str(v)
            lines.append(f"  {k}: " + (text if "\n" not in text
                                       else "\n    " + text.replace("\n", "\n    ")))
        return "\n".join(lines)
