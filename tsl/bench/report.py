"""`python -m tsl.bench --report DIR`: the bench as one page, with pictures.

DIR gets `bench.json` (host + rows, see `rows.py`), one roofline PNG per machine
(`roofline-<machine>.png`: the TAM's ceilings, each row at its arithmetic intensity), one
peers PNG per target (`peers-<target>.png`: tsl's rate over each baseline's, log axis), and the
same content twice: `index.html` (images embedded as data URIs, no JavaScript) and `report.md`
(images beside it, for a terminal or a pull request). Plots use matplotlib's Agg back end.
"""

from __future__ import annotations

import base64
import datetime
import html
import json
import math
import platform
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from ..errors import InputError, TSLError
from ..tam import load as load_machine
from ..tam.roofline import Point, plot as plot_roofline
from .rows import KIND_ORDER

HATCH = {"measured": "", "simulated": "..", "model": "//"}


# -- the document: the same sections render as HTML and as Markdown --------------------------
@dataclass
class Section:
    title: str
    text: list[str] = field(default_factory=list)
    table: tuple[list[str], list[list[str]]] | None = None
    images: list[tuple[str, str]] = field(default_factory=list)  # (file in DIR, caption)


def render_html(title: str, sections: list[Section], outdir: Path) -> str:
    e = html.escape
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>{e(title)}</title>",
           "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;"
           "font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}"
           "img{max-width:100%}</style></head><body>", f"<h1>{e(title)}</h1>"]
    for s in sections:
        out.append(f"<h2>{e(s.title)}</h2>")
        out += [f"<p>{e(t)}</p>" for t in s.text]
        if s.table:
            head, body = s.table
            out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in body]
            out.append("</table>")
        for name, caption in s.images:
            data = base64.b64encode((outdir / name).read_bytes()).decode()
            out.append(f"<figure><img src='data:image/png;base64,{data}' alt='{e(name)}'>"
                       f"<figcaption>{e(caption)}</figcaption></figure>")
    return "\n".join(out + ["</body></html>", ""])


def render_md(title: str, sections: list[Section]) -> str:
    def cell(c: str) -> str:
        return c.replace("|", "\\|").replace("\n", " ")

    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        out += [t + "\n" for t in s.text]
        if s.table:
            head, body = s.table
            out.append("| " + " | ".join(map(cell, head)) + " |")
            out.append("|" + "---|" * len(head))
            out += ["| " + " | ".join(map(cell, r)) + " |" for r in body]
            out.append("")
        for name, caption in s.images:
            out += [f"![{name}]({name})", "", f"*{caption}*", ""]
    return "\n".join(out)


def write_page(title: str, sections: list[Section], outdir: Path) -> None:
    (outdir / "index.html").write_text(render_html(title, sections, outdir))
    (outdir / "report.md").write_text(render_md(title, sections))


def safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


# -- inputs ------------------------------------------------------------------------------------
def host_info() -> dict:
    """CPU model, detected machine and library versions of this host."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       cpu)
    except OSError:
        pass
    from ..backend import resolve_target

    try:
        backend, m = resolve_target("cpu")
        why = backend.unavailable(m)
        detected = m.name + (f" (cannot build here: {why})" if why else
                             f" (rates: {m.provenance})")
    except TSLError as e:
        detected = f"none ({type(e).__name__}: {e})"
    versions = {}
    for dist in ("tsl", "apache-tvm", "jax", "jaxlib", "numpy", "matplotlib"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    return {"cpu": cpu, "detected machine": detected, "python": platform.python_version(),
            "platform": platform.platform(), "versions": versions,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def load(path) -> dict:
    """A bench file: `bench.json` ({"host", "rows"}) or a `--json` list of rows."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read bench results {path}: {e}") from e
    if isinstance(doc, list):
        doc = {"host": {}, "rows": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise InputError(f"{path} is not a bench result: expected a list of rows or "
                         "{\"host\": ..., \"rows\": [...]} as `python -m tsl.bench --json` or "
                         "--report writes")
    return doc


# -- the pictures --------------------------------------------------------------------------------
def roofline_images(rows: list[dict], outdir: Path) -> tuple[list[tuple[str, str]], list[str]]:
    images, notes = [], []
    machines = dict.fromkeys(r["machine"] for r in rows if "machine" in r)
    for name in machines:
        try:
            m = load_machine(name)
        except TSLError as e:
            notes.append(f"{name}: no roofline, its machine file is not here ({e})")
            continue
        pts = [Point(r["intensity"], r["rate"], str(n), r["kind"])
               for n, r in enumerate(rows, 1) if r.get("machine") == name and "intensity" in r]
        file = f"roofline-{safe(name)}.png"
        plot_roofline(m, outdir / file, pts)
        froms = sorted({r["traffic_from"] for r in rows if r.get("machine") == name
                        and "traffic_from" in r})
        images.append((file, f"{name}: ceilings from the machine file; points are rows (numbers "
                             f"as in the table) at their intensity at the bounding level "
                             f"(traffic: {', '.join(froms) or 'none'})."))
    return images, notes


def plot_peers(target: str, rows: list[tuple[int, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, LogLocator

    names = list(dict.fromkeys(name for _, r in rows for name in r["peers"]))
    color = {nm: f"C{i % 10}" for i, nm in enumerate(names)}
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows) + 2), 4.8), dpi=100)
    for x, (n, r) in enumerate(rows):
        for name, p in r["peers"].items():
            xb = x - 0.4 + width * (names.index(name) + 0.5)
            # Bars grow from parity (1x), up when tsl is faster, down when it is slower.
            ax.bar(xb, p["ratio"] - 1, width, bottom=1, color=color[name],
                   hatch=HATCH[p["kind"]], alpha=1.0 if p["kind"] == "measured" else 0.55,
                   edgecolor="k", lw=0.6)
            ax.annotate(f"{p['ratio']:.2f}x", (xb, p["ratio"]), ha="center", fontsize=7,
                        xytext=(0, 2 if p["ratio"] >= 1 else -9), textcoords="offset points")
    ax.axhline(1.0, color="k", lw=1)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=2))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    pad = max(0.0, (3 - len(rows)) / 2)  # a lone row keeps the width of one among three
    ax.set_xlim(-0.5 - pad, len(rows) - 0.5 + pad)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"#{n} {r['op']}\n{r['shape']}\n{r['dtype']}" for n, r in rows],
                       fontsize=7)
    ax.set_ylabel("tsl rate / peer rate (log; >1: tsl faster)")
    ax.set_title(f"{target}: tsl against its peers")
    handles = [Patch(facecolor=color[nm], label=nm) for nm in names]
    kinds = [k for k in KIND_ORDER
             if any(p["kind"] == k for _, r in rows for p in r["peers"].values())]
    handles += [Patch(facecolor="white", edgecolor="k", hatch=HATCH[k], label=f"{k} ratio")
                for k in kinds]
    ax.legend(handles=handles, fontsize=7)
    lo, hi = ax.get_ylim()
    ax.set_ylim(min(lo, 0.5), max(hi, 2.0) * 1.3)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def peers_images(rows: list[dict], outdir: Path) -> list[tuple[str, str]]:
    images = []
    for target in dict.fromkeys(r["target"] for r in rows):
        mine = [(n, r) for n, r in enumerate(rows, 1) if r["target"] == target and r.get("peers")]
        if mine:
            file = f"peers-{safe(target)}.png"
            plot_peers(target, mine, outdir / file)
            images.append((file, f"{target}: tsl's rate over each peer's, per row; solid bars "
                                 "are measured on both sides, dotted simulated, hatched "
                                 "modelled; rows without a peer are left out."))
    return images


# -- the page --------------------------------------------------------------------------------
def host_section(host: dict) -> Section:
    if not host:
        return Section("Host", ["not recorded (a `--json` file has rows only)"])
    body = [[k, str(v)] for k, v in host.items() if k != "versions"]
    body += [[f"{k} version", v] for k, v in host.get("versions", {}).items()]
    return Section("Host", table=(["item", "value"], body))


def row_cells(n: int, row: dict) -> list[str]:
    cells = fmt(row)
    intensity = f"{row['intensity']:.3g} @{row['bound_level']}" if "intensity" in row else ""
    return [str(n)] + cells[:4] + [row.get("kind", ""), intensity, *cells[4:8],
                                   row.get("bound", ""), *cells[8:]]


def write_report(doc: dict, outdir) -> Path:
    """Write the report of a bench document ({"host", "rows"}) into `outdir`; return the HTML
    page's path."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    rows = doc["rows"]
    (outdir / "bench.json").write_text(json.dumps(doc, indent=1, default=float))
    head = ["#", *COLUMNS[:4], "kind", "intensity (OP/B)", *COLUMNS[4:8], "bound",
            *COLUMNS[8:]]
    roofs, notes = roofline_images(rows, outdir)
    if not roofs and not notes:
        notes = ["no row ran, so no machine has points to draw"]
    kinds = (f"kind: how the time was obtained ({', '.join(KIND_ORDER)}); a ratio is as weak as "
             "its weaker side. Intensity: useful operations per byte at the level that bounds the "
             "row; bound: the lower roofline ceiling there.")
    sections = [host_section(doc.get("host", {})),
                Section("Rows", [kinds], table=(head, [row_cells(n, r)
                                                        for n, r in enumerate(rows, 1)])),
                Section("Roofline per machine", notes, images=roofs),
                Section("Peers per target", images=peers_images(rows, outdir))]
    write_page("tsl bench report", sections, outdir)
    return outdir / "index.html"


# -- the bench's text table (what `python -m tsl.bench` prints) -------------------------------
COLUMNS = ("op", "shape", "dtype", "target", "verified", "time", "rate", "peak%", "baseline",
           "speedup", "notes")


def fmt(row: dict) -> list[str]:
    if "skipped" in row:
        return [row["op"], "-", "-", row["target"], "skipped", "", "", "", "", "", row["skipped"]]
    if "failed" in row:
        return [row["op"], row["shape"], row["dtype"], row["target"], "FAILED", "", "", "", "",
                "", row["failed"][:160]]
    if "cycles" in row:
        t = f"{row['cycles']:,} cyc"
    elif row.get("estimated"):
        t = f"~{row['seconds'] * 1e3:.3f} ms (est.)"
    else:
        t = f"{row['seconds'] * 1e3:.3f} ms"
    sp = row.get("speedup")
    verified = {True: "yes", False: "NO", None: "n/a"}[row["verified"]]
    notes = row.get("checks") or row.get("notes") or ""
    if "kernel_seconds" in row:
        notes = "; ".join(x for x in [f"kernel only {row['kernel_seconds'] * 1e3:.3f} ms, weight "
                                      f"prep, once: {row['weight_prep_seconds'] * 1e3:.2f} ms "
                                      f"({'+'.join(row['bound_inputs']) or 'nothing bound'})", notes]
                          if x)
    others = [f"{r['ratio']:.2f}x {name}" for name, r in row.get("peers", {}).items()
              if name != row.get("baseline")]
    if others or row.get("blas"):
        notes = "; ".join(x for x in ["vs " + ", ".join(others) if others else "",
                                      row.get("blas", ""), notes] if x)
    if row["verified"] is None:
        notes = f"{notes}; not run here: {row['unverified']}"
    if row.get("peak_under_read"):
        notes = (f"{row['peak_under_read'] - 1:.0%} above the {row['rates']} peak, which "
                 f"under-read this host (peak% against the row's rate); {notes}")
    return [row["op"], row["shape"], row["dtype"], row["target"], verified,
            t, f"{row['rate'] / 1e9:.1f} GOP/s",
            f"{row['pct_peak']:.1f}" + ("!" if row.get("peak_under_read") else ""),
            row.get("baseline") or "-", f"{sp:.2f}x" if sp is not None else "-", notes[:200]]


def summary(rows: list[dict]) -> list[str]:
    """One line per target: rows verified, and the geometric mean of tsl's ratio to its peer."""
    out = []
    for target in dict.fromkeys(r["target"] for r in rows):
        mine = [r for r in rows if r["target"] == target]
        if all("skipped" in r for r in mine):
            out.append(f"{target}: skipped ({mine[0]['skipped']})")
            continue
        ok = sum(r.get("verified") is True for r in mine)
        ratios = [r["speedup"] for r in mine if r.get("speedup")]
        peers = sorted({r["baseline"] for r in mine if r.get("speedup")})
        geo = (f"geo-mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x "
               f"{' / '.join(peers)} over {len(ratios)} rows" if ratios else "no peer ratio")
        rates = sorted({r["rates"] for r in mine if "rates" in r})
        out.append(f"{target}: {ok}/{len(mine)} rows verified, {geo}"
                   + (f"; peaks: {'/'.join(rates)}" if rates else ""))
    return out


def print_table(rows: list[dict]) -> None:
    print_cells(list(COLUMNS), [fmt(r) for r in rows])


def print_cells(head: list[str], body: list[list[str]]) -> None:
    cells = [head] + body
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    for n, c in enumerate(cells):
        print("  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
