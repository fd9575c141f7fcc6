"""Runners: where `tsl.tune` builds and measures a batch of configurations.

Every runner takes a batch of recorded schedules and returns one `Outcome` per schedule, in
order. `LocalRunner` builds and measures in this process, `PoolRunner` in worker processes (the
"remote" of the simulated VTA and of the modelled targets: measurement there is CPU work in
Python), `tsl.tune.rpc.RPCRunner` on devices registered with a TVM RPC tracker.

Measurement itself happens in one place, `measure_artifact`: a back end that says how to
measure its artifacts (`backend.measure`: simulated cycles, an estimate) is asked; otherwise
the artifact is timed. Before it is measured, every artifact is checked against the NumPy
reference on random inputs: a configuration that computes a wrong result is a failure.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..backend import Backend, resolve_target
from ..errors import BackendUnavailable, TSLError
from ..primitives.schedule import Schedule
from ..timing import exclusive
from .database import signature


@dataclass(frozen=True)
class Outcome:
    """What measuring one configuration gave. `lost`: the device went away while measuring it
    (not a property of the configuration: a later run measures it again)."""

    value: float | None = None
    kind: str = "seconds"
    seconds: float | None = None
    error: str | None = None
    device: str = "local"
    lost: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and self.seconds is not None and math.isfinite(self.seconds)


def measure_artifact(backend: Backend, art, inputs) -> tuple[float, str, float]:
    """(value, kind, seconds) of one artifact: the back end's measurement, an Estimate of kind
    "measured" (seconds), "simulated" (counted in cycles) or "model" (seconds of the model).
    `inputs` are the operator's, already checked against NumPy by the caller."""
    m = backend.measure(art)
    if m.kind == "simulated":
        return float(m.cycles), "cycles", float(m.seconds)
    return float(m.seconds), "seconds" if m.kind == "measured" else "model", float(m.seconds)


_REFERENCES: dict = {}  # (operator signature, seed) -> (inputs, NumPy result); the last few


def _reference(op, seed: int):
    key = (signature(op), seed)
    if key not in _REFERENCES:
        if len(_REFERENCES) >= 4:
            _REFERENCES.pop(next(iter(_REFERENCES)))
        xs = op.random_inputs(seed)
        _REFERENCES[key] = (xs, op.reference(*xs))
    return _REFERENCES[key]


def wrong_result(art, seed: int) -> str | None:
    """None when the artifact matches the NumPy reference on random inputs, else why not. The
    inputs and the reference are computed once per operator (a 1024^3 reference takes longer
    than the kernel's measurement)."""
    xs, want = _reference(art.op, seed)
    ok, err = art.op.check(art.run(*xs), want)
    return None if ok else f"wrong result: error {err:.3g} against the NumPy reference"


def build_and_measure(schedule: Schedule, check: bool = True, seed: int = 0,
                      device: str = "local") -> Outcome:
    """Build `schedule` with its machine's back end, check it, measure it. TSL's own errors
    (a tile the back end refuses, a wrong result) are a failed Outcome, not an exception."""
    backend, _ = resolve_target(schedule.machine)
    try:
        art = backend.build(schedule)
        if check:
            bad = wrong_result(art, seed + 1)
            if bad:
                return Outcome(error=bad, device=device)
        xs = schedule.op.random_inputs(seed)
        with exclusive():  # the timing lock, when one is set (`tsl.timing`): not the build
            value, kind, seconds = measure_artifact(backend, art, xs)
    except BackendUnavailable:
        raise
    except TSLError as e:
        return Outcome(error=f"{type(e).__name__}: {_first_line(e)}", device=device)
    return Outcome(value, kind, seconds, device=device)


class Runner:
    """Builds and measures batches of schedules. `parallelism`: how many it measures at once
    (the tuner makes its batches at least that large)."""

    parallelism: int = 1

    def run(self, schedules: list[Schedule], schedule_fn) -> list[Outcome]:
        """Outcomes of `schedules` (all recorded by `schedule_fn`), in order."""
        raise NotImplementedError

    def close(self) -> None:
        """Release workers and sessions (the runner cannot be used afterwards)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LocalRunner(Runner):
    """In this process, one configuration after the other."""

    def __init__(self, check: bool = True, seed: int = 0):
        self.check, self.seed = check, seed

    def run(self, schedules, schedule_fn):
        return [build_and_measure(s, self.check, self.seed) for s in schedules]


class PoolRunner(Runner):
    """`workers` processes (spawned, each with its own TVM) build and measure in parallel.
    A worker that dies takes only its configuration with it (recorded as lost); the pool is
    started again for the next batch."""

    def __init__(self, workers: int | None = None, check: bool = True, seed: int = 0):
        self.parallelism = workers or os.cpu_count() or 1
        self.check, self.seed = check, seed
        self._pool = None

    def _executor(self):
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.parallelism,
                                             mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def run(self, schedules, schedule_fn):
        import cloudpickle
        from concurrent.futures.process import BrokenProcessPool

        pool = self._executor()
        futs = [pool.submit(_pool_job, cloudpickle.dumps(
            (s.op, s.machine, schedule_fn, dict(s.knob_values), self.check, self.seed)))
            for s in schedules]
        out = []
        for f in futs:
            try:
                out.append(f.result())
            except BrokenProcessPool as e:
                out.append(Outcome(error=f"worker process died: {e}", device="pool", lost=True))
        if any(o.lost for o in out):
            self.close()
        return out

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def _pool_job(payload: bytes) -> Outcome:
    import cloudpickle

    from ..record import record

    op, machine, fn, knobs, check, seed = cloudpickle.loads(payload)
    return build_and_measure(record(op, machine, fn, knobs), check, seed,
                             device=f"pool-{os.getpid()}")


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__
