"""Time a peer alone: in a fresh `python -m tsl.bench.alone` process, nothing else running.

Timed in the process that had just run tsl's kernel, or right after another peer, a peer's rate
fell up to 80x behind what the same call gives alone (torch linear 128x768x768: 9.5 GOP/s right
after tsl's kernel, 73.7 GOP/s alone): the other party's worker threads (TVM's pool, OpenBLAS)
spin on for about a second after their last call, and on two cores they take the peer's. So
every peer measurement gets its own process, whose thread pools are sized to the machine's
cores (threadpoolctl for BLAS, torch.set_num_threads) and which waits `timing.SETTLE_SECONDS`
before its timed region; the caller has waited for its own pools before it starts one.

A peer is a *maker*: a function `maker(spec: dict)` returning the call to time, or None where
its library is missing. `time_alone(kind, spec, cores)` names it by a registered kind (`KINDS`,
`register`) or directly as "module:function"; the spec and the result travel as JSON.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

from .. import timing
from ..backends.cpu import peers as cpu_makers
from ..errors import InputError

MIN_SAMPLE_SECONDS = 0.02
KINDS: dict[str, str] = {}  # kind -> "module:function" of its maker


def register(kind: str, maker: str) -> None:
    """Name a maker ("module:function", importable in a fresh process) by `kind`."""
    if ":" not in maker:
        raise InputError(f"peer maker {maker!r} for {kind!r}: expected 'module:function'")
    KINDS[kind] = maker


for _name, _fn in (("numpy gemm", "numpy_gemm"), ("torch conv2d", "torch_conv2d"),
                   ("torch linear", "torch_linear")):
    register(_name, f"{cpu_makers.__name__}:{_fn}")


@dataclass
class Timing:
    """A peer's median seconds per call over `samples`; `rate` = work / seconds when the spec
    says its work (`spec["work"]`, e.g. 2 x MACs); None where the peer is unavailable (`why`)."""
    seconds: float | None
    samples: list[float] = field(default_factory=list)
    rate: float | None = None
    info: dict = field(default_factory=dict)
    why: str | None = None


def time_alone(kind: str, spec: dict, cores: int, repeat: int = 15,
               settle: float | None = None, timeout: float = 600) -> Timing:
    """Time the peer `kind` (a registered kind or "module:function") on `spec` in a fresh
    process with `cores` threads: warm-up calls, a settle pause, `repeat` timed samples (15:
    the median of 7 moved by up to 40% when another process ran for a tenth of a second)."""
    maker = KINDS.get(kind, kind)
    if ":" not in maker:
        raise InputError(f"unknown peer kind {kind!r}; registered: {', '.join(KINDS)} "
                         "(or pass 'module:function')")
    msg = {"maker": maker, "spec": spec, "cores": cores, "repeat": repeat,
           "settle": timing.SETTLE_SECONDS if settle is None else settle}
    env = {k: v for k, v in os.environ.items() if k not in cpu_makers.UNSET}
    env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = str(cores)
    p = subprocess.run([sys.executable, "-m", __name__], input=json.dumps(msg),
                       capture_output=True, text=True, env=env, timeout=timeout)
    lines = p.stdout.strip().splitlines()
    if p.returncode or not lines:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"peer {kind!r} process failed (exit {p.returncode}): {tail}")
    return Timing(**json.loads(lines[-1]))


def _quiesce(cores: int) -> None:
    """Size every thread pool this process loaded to `cores`."""
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(cores)
    except ImportError:
        pass
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(cores)


def _run(msg: dict) -> dict:
    mod, fn = msg["maker"].split(":")
    call = getattr(importlib.import_module(mod), fn)(msg["spec"])
    if call is None:
        return {"seconds": None, "why": f"{msg['maker']}: its library is not installed here"}
    _quiesce(msg["cores"])
    call()  # first-call allocations, JIT, pool start: not in the per-call estimate below
    # Each sample averages enough calls to last MIN_SAMPLE_SECONDS: single sub-millisecond
    # calls on a shared 2-core host read anywhere within 40x of each other. The count comes
    # from calls made for that long (one first call read 5-10x a steady one).
    t0, calls = time.perf_counter(), 0
    while calls < 3 or time.perf_counter() - t0 < MIN_SAMPLE_SECONDS:
        call()
        calls += 1
    number = max(1, math.ceil(MIN_SAMPLE_SECONDS * calls / (time.perf_counter() - t0)))
    time.sleep(msg["settle"])
    ts = []
    with timing.realtime():
        call()  # the pool this process parked during the settle pause, woken untimed
        for _ in range(msg["repeat"]):
            t = time.perf_counter()
            for _ in range(number):
                call()
            ts.append((time.perf_counter() - t) / number)
    sec = statistics.median(ts)
    work = msg["spec"].get("work")
    info = {"blas": cpu_makers.blas_info()}
    if "torch" in sys.modules:
        t = sys.modules["torch"]
        info["torch"] = f"torch {t.__version__}, {t.get_num_threads()} threads"
    return {"seconds": sec, "samples": ts, "rate": work / sec if work else None, "info": info}


if __name__ == "__main__":
    print(json.dumps(_run(json.loads(sys.stdin.read()))), flush=True)


# Fresh processes per peer measurement: on this project's 2-vCPU KVM host a fresh process of
# the same 256^3 NumPy GEMM reads 0.20 or 0.32 ms (about one in six, for seconds at a time,
# threads on both vCPUs either way), so one process is a coin toss of the platform's state
# and the median of three is the peer's rate (tsl's own rows: the median of three rounds).
RUNS = 3


def median_alone(maker: str, spec: dict, cores: int, runs: int = RUNS) -> Timing:
    """The median-rate `Timing` of `runs` fresh processes of one peer (its `info` has the
    rate of each run)."""
    ts = [time_alone(maker, spec, cores) for _ in range(runs)]
    if any(t.seconds is None for t in ts):
        return next(t for t in ts if t.seconds is None)
    ts.sort(key=lambda t: t.seconds)
    mid = ts[len(ts) // 2]
    mid.info["runs_gops"] = [round(t.rate / 1e9, 1) for t in ts if t.rate]
    return mid


def cpu_peers(cores: int):
    """The CPU back end's `benchmark(peers=...)`: each of an operator's peers
    (`tsl.backends.cpu.peers.makers`) timed alone (the median of RUNS fresh processes),
    {name: {"rate", "seconds", "info"}}; peers whose library is missing are left out."""
    def time_peers(op) -> dict:
        sp = {**cpu_makers.spec(op), "work": 2 * op.macs}
        out = {}
        for name, maker in cpu_makers.makers(sp).items():
            t = median_alone(maker, sp, cores)
            if t.seconds is not None:
                out[name] = {"rate": t.rate, "seconds": t.seconds, "info": t.info}
        return out
    return time_peers


def check(rows: list[dict], cores: int, tolerance: float = 0.15,
          again: int = RUNS) -> list[str]:
    """`--check-peers`: time each row's peers `again` times more, each alone in a fresh
    process, and return a line per peer whose in-bench rate is more than `tolerance` away
    from every one of those; each row gets "peer_check": {name: in-bench rate / the median
    re-timed rate}. Several re-timings, for the platform's two states (see RUNS): one
    re-timing flags a state, not a peer timed in another party's wake."""
    flagged = []
    for row in rows:
        if not row.get("peers") or "op_spec" not in row:
            continue
        sp = row["op_spec"]
        row["peer_check"] = {}
        for name, maker in cpu_makers.makers(sp).items():
            if name not in row["peers"]:
                continue
            mine = row["peers"][name]["rate"]
            alone = sorted(time_alone(maker, sp, cores).rate for _ in range(again))
            row["peer_check"][name] = mine / statistics.median(alone)
            if min(abs(mine / r - 1) for r in alone) > tolerance:
                flagged.append(f"{row['op']} {row['shape']} {row['dtype']}: {name} in-bench "
                               f"{mine / 1e9:.1f} GOP/s, alone again "
                               f"{', '.join(f'{r / 1e9:.1f}' for r in alone)} GOP/s "
                               f"({mine / statistics.median(alone) - 1:+.0%} off their median)")
    return flagged
