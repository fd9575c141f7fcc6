"""Timing on a shared host: the timed calls may run at real-time priority.

A parallel kernel's call lasts as long as its slowest worker thread, and on a host where other
processes compete for the cores one worker descheduled for a time slice (milliseconds) stalls a
call that takes a fraction of a millisecond. On a 2-core development host at load 8, a 256³ int8
kernel read between 1.5 and 67 ms against 0.46 ms on the quiet host, and the order of two
knob settings was a coin toss — for the tuner, the model check and the bench alike.

With ``TSL_TIMING=realtime`` in the environment (``--realtime`` on ``python -m tsl.bench`` and
``python -m tsl.tune`` sets it), every thread of the process runs under ``SCHED_FIFO`` while a
measurement runs, so the measured threads preempt ordinary processes, and returns to the
ordinary policy after it; the same 256³ kernel then read 0.45-0.51 ms at load 8, each setting
within 1-4% of itself. Linux keeps its real-time throttling (by default 5% of every second stays
with ordinary processes), so a runaway measurement cannot take the host. It needs the
``CAP_SYS_NICE`` capability (root, or ``setcap cap_sys_nice+ep`` on the interpreter); without
it, timing goes on at ordinary priority after one warning. Worker processes (the NumPy/PyTorch
peers, MetaSchedule's runner) inherit the variable and do the same around their own timings.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings

ENV = "TSL_TIMING"
# A runtime's worker threads (TVM's pool, OpenBLAS) spin for about a second after its last
# call; on 2 cores they slow whatever is timed next. Every party waits this long before its
# timed region.
SETTLE_SECONDS = 1.0
PRIORITY = 1  # the lowest real-time priority: above every ordinary process, below the kernel's
_warned = False


def requested() -> bool:
    return os.environ.get(ENV, "").lower() == "realtime"


def request() -> None:
    """Time at real-time priority from now on, in this process and the ones it starts."""
    os.environ[ENV] = "realtime"


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


def _self() -> int:
    return threading.get_native_id()


@contextlib.contextmanager
def realtime():
    """Run the block with every thread of this process under SCHED_FIFO, when requested (see
    the module's docstring). Threads started inside the block (a runtime's worker pool created
    on its first call) inherit the real-time policy and are returned to the calling thread's
    old policy with the others."""
    global _warned
    if not requested() or not hasattr(os, "sched_setscheduler"):
        yield
        return
    before = {}  # thread -> (policy, priority) to return to
    try:
        for tid in _threads():
            with contextlib.suppress(ProcessLookupError):
                was = (os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority)
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(PRIORITY))
                before[tid] = was
    except PermissionError as e:
        if not _warned:
            warnings.warn(f"{ENV}=realtime: cannot raise this process to real-time priority "
                          f"({e}); timing at ordinary priority (needs CAP_SYS_NICE)",
                          stacklevel=3)
            _warned = True
    try:
        yield
    finally:
        if before:
            this = before.get(_self(), (os.SCHED_OTHER, 0))
            for tid in _threads():
                policy, prio = before.get(tid, this)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.sched_setscheduler(tid, policy, os.sched_param(prio))


LOCK_ENV = "TSL_TIMING_LOCK"
_waited = 0.0  # seconds this process has waited for the lock (`waited_seconds`)


def waited_seconds() -> float:
    """Seconds `exclusive` has waited for the lock in this process so far: what a wall
    time that took the lock (a tuning run's) spent on other processes' measurements."""
    return _waited


@contextlib.contextmanager
def exclusive(path: str | None = None):
    """Hold an exclusive lock on file `path` (default: ``$TSL_TIMING_LOCK``; neither: no lock)
    while a measurement runs, so that cooperating processes sharing a host (several benches,
    a tuner) never time at the same moment."""
    path = path or os.environ.get(LOCK_ENV)
    if not path:
        yield
        return
    import fcntl
    import time

    global _waited
    with open(path, "a") as f:
        t0 = time.perf_counter()
        fcntl.flock(f, fcntl.LOCK_EX)
        _waited += time.perf_counter() - t0
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
