"""The bench report: rooflines from the TAM, peers charts, the HTML/Markdown page, and compare.

Plots are rendered from tests/data/bench_fixture.json (rows of `--quick` runs on this host's CPU,
VTA, TPU and Tensor Cores, and a skipped target) and read back with matplotlib."""

import base64
import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

import tsl
from tsl.bench import compare, report, rows
from tsl.bench.__main__ import main as bench_main
from tsl.tam import roofline
from tsl.tam.__main__ import main as tam_main

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "bench_fixture.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC, path
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, (path, img.shape)
    assert img.std() > 0.01, f"{path} is blank"


@pytest.fixture
def doc():
    return report.load(FIXTURE)


# -- the machine's roofline ----------------------------------------------------------------
def test_ceilings_come_from_the_machine_file():
    vta = tsl.load_machine("vta-1x16x16")
    assert roofline.compute_ceilings(vta) == [roofline.Ceiling("int8", 5.12e10)]
    # dram: 8 B/cycle at 100 MHz; the scratchpads: 8 B/cycle per virtual thread, two of them.
    assert roofline.bandwidth_ceilings(vta) == [roofline.Ceiling("inp, wgt, acc", 1.6e9),
                                                roofline.Ceiling("dram", 8e8)]
    cpu = tsl.load_machine("x86-avx512")
    assert [c.label for c in roofline.compute_ceilings(cpu)] == ["uint8, int8",
                                                                "float32, bfloat16"]
    # Registers state no bandwidth and draw no line; levels of one bandwidth share a line
    # (the file's L3 and DRAM both 16 B/cycle).
    assert {c.label for c in roofline.bandwidth_ceilings(cpu)} == {"l1", "l2", "dram, l3"}


def test_bound_is_the_lower_ceiling_at_the_rows_intensity():
    m = tsl.load_machine("tpu-v5e")  # 197 TOP/s bf16, 819 GB/s HBM: ridge at ~240 OP/B
    low = rows.bound_of(m, "bfloat16", 1e9, {"hbm": 1e8})
    assert low == {"bound_level": "hbm", "intensity": 10.0, "bound": "hbm"}
    assert rows.bound_of(m, "bfloat16", 1e12, {"hbm": 1e9})["bound"] == "compute"


def test_tam_show_plot(tmp_path, capsys):
    out = tmp_path / "roof.png"
    assert tam_main(["show", "tensorcore-sm80", "--plot", str(out)]) == 0
    assert "roofline:" in capsys.readouterr().out
    assert_png(out)
    assert tam_main(["show", "nosuch", "--plot", str(tmp_path / "x.png")]) == 2
    assert not (tmp_path / "x.png").exists()


# -- the page ----------------------------------------------------------------------------------
def test_report_from_fixture(doc, tmp_path):
    page = report.write_report(doc, tmp_path)
    machines = {r["machine"] for r in doc["rows"] if "machine" in r}
    targets = {r["target"] for r in doc["rows"] if r.get("peers")}
    pngs = ([tmp_path / f"roofline-{m}.png" for m in machines]
            + [tmp_path / f"peers-{t}.png" for t in targets])
    assert len(pngs) == 8 and sorted(pngs) == sorted(tmp_path.glob("*.png"))
    for p in pngs:
        assert_png(p)
    html = page.read_text()
    md = (tmp_path / "report.md").read_text()
    assert "<script" not in html.lower()
    for p in pngs:  # embedded in the page, referenced beside the Markdown
        assert base64.b64encode(p.read_bytes()).decode() in html
        assert f"]({p.name})" in md
    for text in (doc["host"]["cpu"], doc["host"]["versions"]["apache-tvm"], "skipped"):
        assert text in html and text in md
    for r in doc["rows"]:
        assert r["shape"] in md and r["target"] in html
        if "intensity" in r:
            assert f"{r['intensity']:.3g} @{r['bound_level']}" in md
    assert json.loads((tmp_path / "bench.json").read_text()) == json.loads(
        json.dumps(doc, default=float))


def test_roofline_points_are_told_apart_by_kind(doc, tmp_path):
    """Measured, simulated and modelled points use different markers, labels are row numbers."""
    kinds = {r["kind"] for r in doc["rows"] if "kind" in r}
    assert kinds == {"measured", "simulated", "model"}
    assert len({tuple(sorted(roofline.MARKERS[k].items())) for k in kinds}) == 3
    pts = [roofline.Point(1.0, 1e9, "1", "measured"), roofline.Point(1.0, 1e9, "2", "model")]
    roofline.plot(tsl.load_machine("vta-1x16x16"), tmp_path / "r.png", pts)
    assert_png(tmp_path / "r.png")


def test_load_rejects_what_is_not_a_bench_result(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": 3}')
    with pytest.raises(tsl.InputError, match="not a bench result"):
        report.load(bad)
    with pytest.raises(tsl.InputError, match="cannot read"):
        report.load(tmp_path / "missing.json")


# -- compare ----------------------------------------------------------------------------------
def _write(tmp_path, name, doc) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def _row(doc, target, op):
    return next(r for r in doc["rows"] if r["target"] == target and r["op"] == op)


def test_compare_identical_runs_pass(doc, tmp_path, capsys):
    old = _write(tmp_path, "old.json", doc)
    assert bench_main(["--compare", old, old]) == 0
    ms = compare.compare(doc["rows"], doc["rows"], 0.05)
    assert {m.status for m in ms} == {"same", "incomparable"}  # the skipped row is not compared


def test_compare_regression_first_and_gates(doc, tmp_path, capsys):
    new = copy.deepcopy(doc)
    slow = _row(new, "vta-1x16x16", "dense")  # simulated: no noise band, any change is real
    slow["seconds"] *= 1.10
    slow["cycles"] = round(slow["cycles"] * 1.10)
    fast = _row(new, "tpu-v5e", "dense")
    fast["seconds"] /= 2
    old_p, new_p = _write(tmp_path, "old.json", doc), _write(tmp_path, "new.json", new)
    out = tmp_path / "diff"
    assert bench_main(["--compare", old_p, new_p, "--threshold", "0.05", "--report",
                       str(out)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[2].startswith("regression") and "1x1000x512" in printed[2]
    assert any(ln.startswith("faster") and "128x768x768" in ln for ln in printed)
    assert_png(out / "compare.png")
    html, md = (out / "index.html").read_text(), (out / "report.md").read_text()
    assert base64.b64encode((out / "compare.png").read_bytes()).decode() in html
    assert "FAIL" in md and md.index("| regression |") < md.index("| faster |")
    # 10% slower is within a 20% threshold: listed as slower, exit status 0.
    assert bench_main(["--compare", old_p, new_p, "--threshold", "0.2"]) == 0
    assert any(ln.startswith("slower") for ln in capsys.readouterr().out.splitlines())


def test_compare_noise_band_from_repeated_measurements(doc):
    old, new = copy.deepcopy(doc), copy.deepcopy(doc)
    _row(old, "x86-avx2", "dense")["samples"] = [3.4e-4, 3.5e-4, 3.8e-4]  # +-5.7%
    row = _row(new, "x86-avx2", "dense")
    row["samples"] = [3.5e-4, 3.5e-4, 3.5e-4]
    row["seconds"] = _row(old, "x86-avx2", "dense")["seconds"] * 1.05

    def dense():
        return next(m for m in compare.compare(old["rows"], new["rows"], 0.0)
                    if m.key[0] == "dense" and m.key[3] == "x86-avx2")

    m = dense()
    assert m.status == "same" and math.isclose(m.band, 0.4 / 7) and math.isclose(m.ratio, 1.05)
    row["seconds"] *= 1.05  # now 10.25% slower: beyond the band
    assert dense().status == "regression"
    assert rows.noise(_row(doc, "vta-1x16x16", "dense")) == 0  # simulated: no noise


def test_compare_never_divides_measured_by_modelled_and_flags_breakage(doc, tmp_path):
    new = copy.deepcopy(doc)
    _row(new, "x86-avx2", "dense")["kind"] = "model"
    broken = _row(new, "tpu-v5e", "dense")
    broken.update(verified=False, failed="LoweringError: example")
    del broken["seconds"]
    ms = {(m.key[3], m.key[0], m.key[2]): m for m in compare.compare(doc["rows"], new["rows"],
                                                                      0.05)}
    inc = ms[("x86-avx2", "dense", "float32")]
    assert inc.status == "incomparable" and inc.ratio is None and "measured" in inc.note
    assert ms[("tpu-v5e", "dense", "bfloat16")].status == "broken"
    assert bench_main(["--compare", _write(tmp_path, "o.json", doc),
                       _write(tmp_path, "n.json", new)]) == 1


def test_compare_bad_input(tmp_path, capsys):
    assert bench_main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    assert "cannot read bench results" in capsys.readouterr().err
    with pytest.raises(tsl.InputError, match="threshold"):
        compare.compare([], [], -0.1)


# -- end to end ----------------------------------------------------------------------------
def test_bench_report_command(tmp_path):
    """`python -m tsl.bench --report DIR` on a target that runs anywhere (TPU: XLA on the CPU)."""
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "tsl.bench", "--targets", "tpu-v5e", "--quick",
                        "--report", str(out)], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((out / "bench.json").read_text())
    assert doc["host"]["detected machine"] and doc["host"]["versions"]["numpy"]
    for row in doc["rows"]:
        assert row["kind"] == "model" and row["traffic_from"] == "estimate"
        assert row["intensity"] == pytest.approx(row["flops"]
                                                 / row["traffic"][row["bound_level"]])
        assert row["traffic"]["hbm"] > 0  # tsl.model's traffic, level by level
        assert row["peers"][row["baseline"]]["kind"] == "model"
    for name in ("index.html", "report.md", "roofline-tpu-v5e.png", "peers-tpu-v5e.png"):
        assert (out / name).exists()
    assert_png(out / "roofline-tpu-v5e.png")
