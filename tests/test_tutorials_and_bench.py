"""Every tutorial runs to the end, and `python -m tsl.bench --quick` gives verified rows."""

import json
import os
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


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.name for p in TUTORIALS])
def test_tutorial_runs(path):
    r = run([str(path)])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


def test_bench_quick_cpu_json(tmp_path):
    out = tmp_path / "rows.json"
    # One GEMM and one conv row (their peers differ: NumPy + torch linear, NumPy + torch
    # conv2d), each peer timed in 3 fresh processes: the whole quick suite took 96 s of CI.
    r = run(["-m", "tsl.bench", "--targets", "cpu", "--quick", "--ops", "dense,conv2d",
             "--json", str(out)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified" in r.stdout and "speedup" in r.stdout
    assert "[cpu 1/" in r.stderr                        # progress lines
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
