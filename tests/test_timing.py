"""tsl.timing: measurements at real-time priority on request, and back to the old policy after."""

import os
import threading

import pytest

from tsl import timing

linux = pytest.mark.skipif(not hasattr(os, "sched_setscheduler"),
                           reason="no sched_setscheduler on this OS (real-time timing is Linux)")


def can_raise() -> bool:
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except PermissionError:
        return False
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    return True


def policy(tid=0) -> int:
    return os.sched_getscheduler(tid)


def test_not_requested_changes_nothing(monkeypatch):
    monkeypatch.delenv(timing.ENV, raising=False)
    before = policy() if hasattr(os, "sched_getscheduler") else None
    with timing.realtime():
        if before is not None:
            assert policy() == before


@linux
def test_requested_raises_every_thread_and_restores_them(monkeypatch):
    if not can_raise():
        pytest.skip("this process lacks CAP_SYS_NICE: real-time priority cannot be tested")
    monkeypatch.setenv(timing.ENV, "realtime")
    started = threading.Event()
    stop = threading.Event()
    tids = {}

    def worker():
        tids["w"] = threading.get_native_id()
        started.set()
        stop.wait(10)

    t = threading.Thread(target=worker)
    with timing.realtime():
        assert policy() == os.SCHED_FIFO
        t.start()  # a thread started inside the block, like a runtime's worker pool
        started.wait(10)
        assert policy(tids["w"]) == os.SCHED_FIFO
    try:
        assert policy() == os.SCHED_OTHER
        assert policy(tids["w"]) == os.SCHED_OTHER
    finally:
        stop.set()
        t.join()


@linux
def test_without_permission_warns_once_and_times(monkeypatch):
    monkeypatch.setenv(timing.ENV, "realtime")
    monkeypatch.setattr(timing, "_warned", False)

    def refuse(*_):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    with pytest.warns(UserWarning, match="CAP_SYS_NICE"):
        with timing.realtime():
            pass
    with timing.realtime():  # no second warning (pytest's -W error would fail here)
        pass


def test_the_time_spent_waiting_for_the_timing_lock_is_counted(tmp_path):
    import fcntl

    path = tmp_path / "lock"
    held, release = threading.Event(), threading.Event()

    def holder():
        with open(path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            held.set()
            release.wait()

    th = threading.Thread(target=holder)
    th.start()
    held.wait()
    threading.Timer(0.2, release.set).start()
    before = timing.waited_seconds()
    with timing.exclusive(str(path)):
        pass
    th.join()
    assert timing.waited_seconds() - before >= 0.15
