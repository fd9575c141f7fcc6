"""Every tutorial runs to the end, and `python -m tsl.bench --quick` gives verified rows."""

import functools
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("*.py"))


def run(args, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable] + args, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900, **kw)


# Run in this process: its kernels are those of test_relax.py's int8 ResNet-18 (the same
# small model), whose searches and builds tsl keeps per process (`tsl.relax.swap`); in a fresh
# process they were about a third of the suite's largest test.
IN_PROCESS = {"05_relax.py"}


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.name for p in TUTORIALS])
def test_tutorial_runs(path, monkeypatch):
    if path.name in IN_PROCESS:
        monkeypatch.syspath_prepend(str(path.parent))
        monkeypatch.setattr(sys, "argv", [str(path)])
        runpy.run_path(str(path), run_name="__main__")
        return
    r = run([str(path)])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


def test_bench_quick_cpu_json(tmp_path, monkeypatch, capsys):
    from tsl.bench import alone
    from tsl.bench.__main__ import main

    out = tmp_path / "rows.json"
    # One GEMM and one conv row (their peers differ: NumPy + torch linear, NumPy + torch
    # conv2d), each peer timed in one fresh process, not the bench's three (their median is
    # test_bench_checks.py's), and the bench's main in this process (`python -m tsl.bench` is
    # the next test's): 12 fresh processes made this the file's slowest test.
    monkeypatch.setattr(alone, "median_alone", functools.partial(alone.median_alone, runs=1))
    rc = main(["--targets", "cpu", "--quick", "--ops", "dense,conv2d", "--json", str(out)])
    r = capsys.readouterr()
    assert rc == 0, r.out + r.err
    assert "verified" in r.out and "speedup" in r.out
    assert "[cpu 1/" in r.err                           # progress lines
    rows = json.loads(out.read_text())
    assert sorted(row["op"] for row in rows) == ["conv2d", "dense"]
    for row in rows:
        assert {"op", "shape", "dtype", "target", "verified", "seconds", "baseline",
                "speedup"} <= set(row)
        assert row["verified"] is True and row["seconds"] > 0
        assert row["baseline"].startswith("numpy") and row["speedup"] > 0


def test_bench_unknown_target_is_reported_not_crashed():
    r = run(["-m", "tsl.bench", "--targets", "nosuch", "--quick"])
    assert r.returncode == 0
    assert "skipped" in r.stdout and "unknown machine 'nosuch'" in r.stdout
