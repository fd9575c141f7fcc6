"""A machine's roofline, read from its TAM file, and its picture.

Ceilings come from the file alone: one compute ceiling per operand dtype (the `[peaks]` entry,
or else the fastest primitive for that dtype at `macs_per_cycle` x cores x clock x 2) and one
bandwidth ceiling per memory level that states a `bandwidth` (bytes per cycle to its parent, x
clock, x the level's copies: `instances` x the count of the compute level it is `per`, as
`tsl.tune`'s analytic model counts them). Levels without a bandwidth (registers, fragments)
draw no line. Ceilings with equal values share one line and one label.

Points (`Point`) are whatever a caller places on it (the bench's rows); `kind` picks the marker,
so a measured rate is never drawn like a simulated or modelled one. matplotlib is imported only
when something is drawn, with the Agg back end (files, no display).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .machine import Machine

KINDS = ("measured", "simulated", "model")
MARKERS = {"measured": dict(marker="o", facecolors="C3", edgecolors="C3"),
           "simulated": dict(marker="^", facecolors="C2", edgecolors="C2"),
           "model": dict(marker="s", facecolors="none", edgecolors="C0")}


@dataclass(frozen=True)
class Ceiling:
    label: str  # the dtypes or levels that share it
    value: float  # operations per second, or bytes per second


@dataclass(frozen=True)
class Point:
    intensity: float  # operations per byte at the level that bounds it
    rate: float  # operations per second
    label: str  # short, printed beside the point (the bench uses the row number)
    kind: str  # one of KINDS


def _merge(pairs) -> list[Ceiling]:
    by_value: dict[float, list[str]] = {}
    for name, value in pairs:
        if value > 0:
            by_value.setdefault(value, []).append(name)
    return [Ceiling(", ".join(names), v) for v, names in sorted(by_value.items(), reverse=True)]


def compute_peak(m: Machine, dtype: str) -> float | None:
    """Operations per second for operands of `dtype`: the file's peak, else its fastest
    primitive on every core; None when the machine has neither."""
    if m.peak(dtype):
        return m.peak(dtype)
    p = m.primitive(dtype)
    return 2 * p.macs_per_cycle * m.cores() * m.clock_hz if p else None


def compute_ceilings(m: Machine) -> list[Ceiling]:
    dtypes = list(dict.fromkeys([p.a_dtype for p in m.primitives] + list(m.peaks)))
    return _merge((d, compute_peak(m, d) or 0.0) for d in dtypes)


def level_bandwidth(m: Machine, level: str) -> float:
    """Bytes per second between `level` and its parent, over all its copies (0: not given)."""
    lv = m.memory_level(level)
    per = m.compute_level(lv.per) if lv.per else None
    return lv.bandwidth * m.clock_hz * lv.instances * (per.count if per else 1)


def bandwidth_ceilings(m: Machine) -> list[Ceiling]:
    return _merge((lv.name, level_bandwidth(m, lv.name)) for lv in m.memory)


def _si(x: float, unit: str) -> str:
    for f, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= f:
            return f"{x / f:.3g} {p}{unit}"
    return f"{x:.3g} {unit}"


def plot(m: Machine, path, points: list[Point] = (), title: str | None = None) -> None:
    """Write the roofline of `m` as a PNG at `path`, with `points` on it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comp, bw = compute_ceilings(m), bandwidth_ceilings(m)
    xs = [p.intensity for p in points if p.intensity > 0]
    ridges = [c.value / b.value for c in comp for b in bw]
    lo = min(xs + ridges + [1.0]) / 8
    hi = max(xs + ridges + [1.0]) * 8
    top = max([c.value for c in comp] + [p.rate for p in points])
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=100)
    for n, b in enumerate(bw):  # each slope stops at the highest compute ceiling
        ax.plot([lo, top / b.value], [b.value * lo, top], ls="--", color=f"C{n % 10}", lw=1.2,
                label=f"{b.label}: {_si(b.value, 'B/s')}")
    for n, c in enumerate(comp):
        text = f"{c.label}: {_si(c.value, 'OP/s')}"
        ax.axhline(c.value, color="k", lw=1.5, ls=("-", "-.", ":")[n % 3], label=text)
        ax.annotate(text, (lo, c.value), xytext=(4, 3), textcoords="offset points", fontsize=8)
    for kind in KINDS:
        pts = [p for p in points if p.kind == kind and p.intensity > 0 and p.rate > 0]
        if pts:
            ax.scatter([p.intensity for p in pts], [p.rate for p in pts], s=40, zorder=3,
                       label=f"{kind} rate", **MARKERS[kind])
    # Rows at the same spot share one label ("3,5") rather than overprinting each other.
    spots: dict[tuple[float, float], list[str]] = {}
    for p in points:
        if p.intensity > 0 and p.rate > 0:
            spots.setdefault((p.intensity, p.rate), []).append(p.label)
    for (x, y), labels in spots.items():
        ax.annotate(",".join(labels), (x, y), xytext=(4, 3), textcoords="offset points",
                    fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(min([p.rate for p in points if p.rate > 0] + [c.value for c in comp]) / 30,
                top * 3)
    ax.set_xlabel("arithmetic intensity (operations per byte at the bounding level)")
    ax.set_ylabel("operations per second")
    ax.set_title(title or f"{m.name}: roofline from {Path(m.source).name or 'its TAM'}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", title="ceilings: peaks; B/cycle x clock x copies",
              title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
