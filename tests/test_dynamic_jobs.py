"""A family build's model searches run in forked workers (`tsl.dynamic.jobs`): the same
kernels and dispatch tables as the searches in one process, and no search repeated."""

import sys

import pytest

import tsl
from tsl.dynamic import jobs
from tsl.errors import InputError
from tsl.ops import sym

search_module = sys.modules["tsl.model.search"]


def _built(fam):
    art = tsl.build(fam, "cpu")
    return ([(r.lo, r.hi, r.kernel, r.chunk) for r in art.table.ranges],
            [(k.value, k.knobs, k.blocks, k.seconds, k.margin, k.schedule.as_written)
             for k in art.kernels])


def _searched_here(monkeypatch) -> list:
    """The operators this process's model searches price (workers' searches are not seen)."""
    ops = []
    real = search_module.search

    def counted(op, *args, **kwargs):
        ops.append(str(op))
        return real(op, *args, **kwargs)
    monkeypatch.setattr(search_module, "search", counted)
    monkeypatch.setattr("tsl.dynamic.microkernel.search", counted)
    return ops


@pytest.mark.parametrize("make", [
    lambda: tsl.ops.dense(sym("m", upper=40), 48, 96, epilogue=tsl.ops.bias()),  # run-time rows
    lambda: tsl.ops.batch_matmul(2, sym("s", upper=24), sym("s", upper=24), 16,
                                 transpose_b=True),  # one kernel per rung
])
def test_searches_in_workers_give_the_kernels_and_table_of_one_process(make, monkeypatch):
    monkeypatch.setenv(jobs.ENV, "1")
    serial = _built(make())
    monkeypatch.delenv(jobs.ENV)
    monkeypatch.setattr(jobs, "workers", lambda n: min(n, 2))  # fork even on a 1-core host
    searched = _searched_here(monkeypatch)
    forked = _built(make())
    assert forked == serial
    # Every range's (or rung's) search ran in a worker; a per-rung family still searches
    # its granule here (the value 1 its ladder is made of).
    assert len(searched) <= 1


def test_a_family_with_run_time_rows_searches_each_range_once(monkeypatch):
    """One search per range of its ladder, none more: not the value-1 search that sizes a
    per-rung ladder's granule, which such a family does not use."""
    monkeypatch.setenv(jobs.ENV, "1")
    searched = _searched_here(monkeypatch)
    fam = tsl.ops.dense(sym("m", upper=40), 48, 96)
    art = tsl.build(fam, "cpu")
    tops = sorted({k.value for k in art.kernels})
    top_level = [s for s in searched if s in {str(fam.at(m=v)) for v in tops}]
    assert sorted(top_level) == sorted(str(fam.at(m=v)) for v in tops)


def test_workers_follow_tsl_jobs_and_refuse_a_bad_value(monkeypatch):
    monkeypatch.setenv(jobs.ENV, "1")
    assert jobs.workers(8) == 1 and jobs.mapped(abs, [-1, -2]) is None
    monkeypatch.setenv(jobs.ENV, "two")
    with pytest.raises(InputError, match="TSL_JOBS"):
        jobs.workers(8)


def test_no_fork_in_a_process_that_loaded_jax(monkeypatch):
    """JAX's runtime threads may hold locks at a fork (JAX warns of deadlocks): with JAX
    loaded the searches stay in this process, whatever the cores; without, they may not."""
    import sys
    import types

    monkeypatch.delenv(jobs.ENV, raising=False)
    monkeypatch.setattr(jobs.os, "sched_getaffinity", lambda _: {0, 1, 2, 3}, raising=False)
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    assert jobs.workers(8) == 4
    monkeypatch.setitem(sys.modules, "jax", types.ModuleType("jax"))
    assert jobs.workers(8) == 1 and jobs.mapped(abs, [-1, -2]) is None


def test_a_map_runs_in_other_processes_and_keeps_the_order(monkeypatch):
    import os

    monkeypatch.setattr(jobs, "workers", lambda n: min(n, 2))
    got = jobs.mapped(lambda x: (x * x, os.getpid()), list(range(6)))
    assert [g[0] for g in got] == [x * x for x in range(6)]
    assert os.getpid() not in {g[1] for g in got}


def test_a_worker_s_error_reaches_the_caller_with_its_type(monkeypatch):
    """A range no schedule fits raises ScheduleError in its worker; the build (and the Relax
    bridge, which reports it as the reason tsl left the function to TVM) gets that type."""
    from tsl.errors import ScheduleError

    def refuse(x):
        raise ScheduleError(f"nothing fits {x}")
    monkeypatch.setattr(jobs, "workers", lambda n: min(n, 2))
    with pytest.raises(ScheduleError, match="nothing fits"):
        jobs.mapped(refuse, [1, 2])
