"""`python -m tsl.bench --compare OLD NEW [--threshold F] [--report DIR]`: what got faster or
slower between two bench runs.

Rows are matched by (op, shape, dtype, target). The ratio is new time / old time (> 1: slower).
Its noise band is the sum of both rows' relative half-spreads over their repeated timings
(`rows.noise`; 0 for a simulation or a model, which give the same number every time). A row is

    regression    slower by more than the band plus the threshold: the exit status is 1
    broken        verified (or built) before, failed or skipped now: the exit status is 1
    slower        slower beyond the band, within the threshold
    faster        faster beyond the band
    same          within the band
    incomparable  timed differently (measured against modelled): no ratio is made
    added/removed in one file only

and they are listed in that order, the largest ratio first within a group.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from .report import Section, load, print_cells, write_page
from .rows import noise, row_kind

ORDER = ("regression", "broken", "slower", "faster", "same", "incomparable", "added", "removed")
GATING = ("regression", "broken")


@dataclass
class Match:
    key: tuple[str, str, str, str]
    old: dict | None
    new: dict | None
    status: str
    ratio: float | None = None
    band: float = 0.0
    note: str = ""


def key(row: dict) -> tuple[str, str, str, str]:
    return (row["op"], row["shape"], row["dtype"], row["target"])


def index(rows: list[dict], path) -> dict:
    out = {}
    for r in rows:
        if key(r) in out and "skipped" not in r:
            raise InputError(f"{path}: two rows for {' '.join(key(r))}; compare needs one per "
                             "(op, shape, dtype, target)")
        out[key(r)] = r
    return out


def ran(row: dict) -> bool:
    return "seconds" in row and row.get("verified") is not False


def kind(row: dict) -> str:
    return row.get("kind") or row_kind(row)


def match(k, old: dict | None, new: dict | None, threshold: float) -> Match:
    if new is None:
        return Match(k, old, None, "removed")
    if old is None:
        return Match(k, None, new, "added")
    if not ran(new):
        why = new.get("failed") or new.get("skipped") or "not verified"
        return (Match(k, old, new, "broken", note=why) if ran(old)
                else Match(k, old, new, "incomparable", note=f"did not run in either: {why}"))
    if not ran(old):
        return Match(k, old, new, "added", note="did not run before")
    if kind(old) != kind(new):
        return Match(k, old, new, "incomparable", note=f"old {kind(old)}, new {kind(new)}")
    ratio = new["seconds"] / old["seconds"]
    band = noise(old) + noise(new)
    if ratio > 1 + band + threshold:
        status = "regression"
    elif ratio > 1 + band:
        status = "slower"
    elif ratio < 1 - band:
        status = "faster"
    else:
        status = "same"
    return Match(k, old, new, status, ratio, band, kind(new))


def compare(old_rows: list[dict], new_rows: list[dict], threshold: float,
            paths=("old", "new")) -> list[Match]:
    if threshold < 0:
        raise InputError(f"--threshold must be a fraction >= 0 (0.05 = 5% slower), got {threshold}")
    old, new = index(old_rows, paths[0]), index(new_rows, paths[1])
    ms = [match(k, old.get(k), new.get(k), threshold) for k in dict.fromkeys([*old, *new])]
    return sorted(ms, key=lambda m: (ORDER.index(m.status), -(m.ratio or 0)))


def _time(row: dict | None) -> str:
    if not row or "seconds" not in row:
        return "-"
    return f"{row['cycles']:,} cyc" if "cycles" in row else f"{row['seconds'] * 1e3:.4g} ms"


def table(ms: list[Match]) -> tuple[list[str], list[list[str]]]:
    head = ["status", "op", "shape", "dtype", "target", "old", "new", "new/old", "noise band",
            "note"]
    body = [[m.status, *m.key, _time(m.old), _time(m.new),
             f"{m.ratio:.3f}" if m.ratio is not None else "-",
             f"±{100 * m.band:.1f}%" if m.ratio is not None else "-", m.note] for m in ms]
    return head, body


def plot(ms: list[Match], path: Path) -> None:
    """Horizontal bars of new/old per matched row on a log axis, the noise band as an error
    bar, regressions in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    rated = [m for m in ms if m.ratio is not None]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.32 * len(rated)), dpi=100)
    colors = {"regression": "C3", "slower": "C1", "faster": "C2", "same": "0.6"}
    for y, m in enumerate(reversed(rated)):
        ax.barh(y, m.ratio - 1, left=1, color=colors[m.status], height=0.6)
        ax.plot(m.ratio, y, "|", color="k", ms=10)  # a "same" row shows its ratio too
        ax.annotate(f"{m.ratio:.3f} {m.status}", (max(m.ratio, 1 + m.band), y), xytext=(6, -3),
                    textcoords="offset points", fontsize=7)
        if m.band:
            # A band over 100% (a very noisy row) is drawn down to 0.05x on the log axis.
            ax.errorbar(1, y, xerr=[[min(m.band, 0.95)], [m.band]], color="k", capsize=3, lw=1)
    ax.axvline(1, color="k", lw=1)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_yticks(range(len(rated)))
    ax.set_yticklabels([" ".join(m.key) for m in reversed(rated)], fontsize=7)
    ax.set_xlabel("new time / old time (log; >1: slower); whiskers: noise band")
    lo = min([m.ratio for m in rated] + [max(1 - m.band, 0.05) for m in rated] + [0.9])
    hi = max([m.ratio for m in rated] + [1 + m.band for m in rated] + [1.1])
    ax.set_xlim(lo / 1.1, hi * 1.4)
    ax.set_xticks([t for t in (0.05, 0.1, 0.25, 0.5, 0.7, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 2, 4, 10)
                   if lo / 1.1 <= t <= hi * 1.4])
    ax.set_title("bench compare")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def write(ms: list[Match], old_path, new_path, threshold: float, outdir) -> Path:
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    counts = ", ".join(f"{sum(m.status == s for m in ms)} {s}" for s in ORDER
                       if any(m.status == s for m in ms))
    gate = [m for m in ms if m.status in GATING]
    verdict = (f"FAIL: {len(gate)} row(s) regressed beyond the noise band + {threshold:.0%}"
               if gate else f"pass: nothing slower than the noise band + {threshold:.0%}")
    images = []
    if any(m.ratio is not None for m in ms):
        plot(ms, outdir / "compare.png")
        images.append(("compare.png", "new/old per row; whiskers are the noise band"))
    how = ("Rows are matched by (op, shape, dtype, target); new/old is the ratio of times "
           "(> 1: slower); the noise band is the sum of both rows' relative half-spreads over "
           "their repeated timings (0 for simulated and modelled rows). Regression: slower than "
           f"the band + {threshold:.0%}; broken: ran before, fails or is skipped now.")
    sections = [Section("Summary", [f"old: {old_path}", f"new: {new_path}", counts, verdict,
                                    how]),
                Section("Rows, regressions first", table=table(ms), images=images)]
    write_page("tsl bench compare", sections, outdir)
    return outdir / "index.html"


def main(old_path, new_path, threshold: float, report_dir=None) -> int:
    """The `--compare` command: print the table, write the page, 1 on a regression."""
    try:
        ms = compare(load(old_path)["rows"], load(new_path)["rows"], threshold,
                     (old_path, new_path))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    head, body = table(ms)
    print_cells(head, body)
    if report_dir:
        print(f"report: {write(ms, old_path, new_path, threshold, report_dir)}")
    gate = [m for m in ms if m.status in GATING]
    if gate:
        print(f"{len(gate)} regression(s) beyond the noise band + {threshold:.0%}",
              file=sys.stderr)
    return 1 if gate else 0
