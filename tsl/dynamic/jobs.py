"""The cost model's searches of one family build, run on the cores this process may use.

A family build searches the knob space once per range of its symbol (13 searches for a
dense family up to 512, ~85% of its build; the dynamic-seq BERT layer's six families: 90,
~35 of its ~52 s on a 2-core Xeon). The searches are independent and deterministic, and
pure Python (the model prices recorded schedules; nothing is compiled), so forked workers
run them and send back only the knobs each chose: the parent records those again, which
gives the very schedules and model times a serial build gets (tests assert the tables
equal).

`TSL_JOBS=<n>` caps the workers (1: everything in this process). Where fork is not
available, or one worker would do, the searches run here; and where this process has loaded
JAX (the TPU back end), whose runtime threads may hold locks at the fork (JAX itself warns that
a forked child may deadlock), they run here too.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import warnings
from typing import Callable, Sequence

ENV = "TSL_JOBS"

_TASK: list = []  # the running map's task, inherited by the forked workers


def workers(n: int) -> int:
    """Processes for `n` tasks: the cores this process may use, capped by TSL_JOBS."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call on this platform
        cores = os.cpu_count() or 1
    cap = os.environ.get(ENV, "").strip()
    if cap:
        if not cap.isdigit() or int(cap) < 1:
            from ..errors import InputError
            raise InputError(f"{ENV}={cap!r}: give a positive number of processes")
        cores = min(cores, int(cap))
    if "fork" not in multiprocessing.get_all_start_methods() or "jax" in sys.modules:
        return 1
    return max(1, min(n, cores))


def mapped(task: Callable, items: Sequence) -> list | None:
    """[task(x) for x in items] computed in forked workers, or None where one process
    would run them (the caller then runs them itself, keeping its own objects).
    `items` and the results cross processes: plain data only."""
    jobs = workers(len(items))
    if jobs < 2 or _TASK:  # a map inside a worker's task runs in that worker
        return None
    _TASK.append(task)
    try:
        with warnings.catch_warnings():
            # Python >= 3.12 warns of fork() beside threads (TVM's pool, once a kernel ran):
            # a worker runs only the model's Python and takes none of their locks.
            warnings.filterwarnings("ignore", ".*use of fork\\(\\) may lead to deadlocks",
                                    DeprecationWarning)
            with multiprocessing.get_context("fork").Pool(jobs) as pool:
                return pool.map(_run, items, chunksize=1)
    finally:
        _TASK.clear()


def _run(x):
    return _TASK[0](x)
