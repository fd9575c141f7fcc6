"""TVM MetaSchedule on the same operator, for comparison with `tsl.tune`.

MetaSchedule (`tvm.s_tir.meta_schedule.tune_tir`) tunes the operator's own TE definition (the
PrimFunc tsl lowers from, unpadded, inputs in their natural layouts) for the same LLVM target
tsl compiles for, with the given number of measured trials; its best schedule is compiled,
checked against the NumPy reference and timed with TVM's `time_evaluator`. MetaSchedule's
builder and runner need `psutil` and `cloudpickle` (`pip install tsl[tune]`).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass

from ..errors import BackendUnavailable, LoweringError
from ..timing import realtime

BUILD_TIMEOUT_S = 600
RUN_TIMEOUT_S = 120


@dataclass
class MetaScheduleResult:
    executable: object  # what tvm.compile returned for MetaSchedule's best schedule
    tune_seconds: float  # wall-clock of tune_tir
    trials: int  # records in its database
    verified: bool
    error: float

    def time(self, op, number: int = 5, repeat: int = 5) -> float:
        """Median seconds of one call on random inputs."""
        import tvm

        dev = tvm.cpu(0)
        args = _tensors(op, op.random_inputs(7), dev)
        f = self.executable.jit().time_evaluator("main", dev, number=number, repeat=repeat)
        with realtime():
            return float(f(*args).median)


def tune(op, machine, trials: int, seed: int = 0, trials_per_iter: int = 16,
         work_dir: str | None = None) -> MetaScheduleResult:
    """Tune `op` with MetaSchedule for CPU `machine` (its LLVM target and core count)."""
    try:
        import cloudpickle  # noqa: F401 - MetaSchedule's local builder/runner need both
        import psutil  # noqa: F401
    except ImportError as e:
        raise BackendUnavailable(f"MetaSchedule needs psutil and cloudpickle: pip install "
                                 f"'tsl[tune]' ({e})") from e
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from ..backends.cpu import codegen
    from ..backends.cpu.runtime import set_threads

    set_threads(machine.cores())
    target = codegen.target(machine)
    func = op.prim_func()
    # Imported on first use inside tune_tir (TuneContext); parsing every TVMScript intrinsic
    # (CUDA's alone ~90 s of CPU) is a one-time cost of this process, not tuning.
    import tvm.s_tir.tensor_intrin  # noqa: F401
    with tempfile.TemporaryDirectory(prefix="tsl-ms-") as tmp:
        t0 = time.perf_counter()
        # Worker processes import TVM before their first build: the default 30 s build timeout
        # fails every build of the first batch on such a host.
        try:
            db = ms.tune_tir(func, target, work_dir or tmp, max_trials_global=trials,
                             num_trials_per_iter=min(trials_per_iter, trials),
                             builder=ms.builder.LocalBuilder(timeout_sec=BUILD_TIMEOUT_S,
                                                             f_build=_build_function()),
                             runner=ms.runner.LocalRunner(timeout_sec=RUN_TIMEOUT_S,
                                                          f_run_evaluator=_run_evaluator()),
                             num_tuning_cores=machine.cores(), seed=seed)
            wall = time.perf_counter() - t0
            sch = ms.tir_integration.compile_tir(db, func, target)
            n = len(db.get_all_tuning_records())
        except Exception as e:  # noqa: BLE001 - MetaSchedule raises TVM's own error types
            from ..lower import _first_line

            raise LoweringError(f"MetaSchedule on {op} failed: {_first_line(e)}") from e
    if sch is None:
        raise LoweringError(f"MetaSchedule found no valid schedule for {op} in {trials} trials")
    ex = tvm.compile(sch.mod, target=target)
    xs = op.random_inputs(1)
    args = _tensors(op, xs, tvm.cpu(0))
    ex.jit()["main"](*args)
    ok, err = op.check(args[-1].numpy(), op.reference(*xs))
    return MetaScheduleResult(ex, wall, n, bool(ok), err)


def _build_function():
    """MetaSchedule's `default_build` without its `import tvm.s_tir.tensor_intrin`.

    LocalBuilder starts a new pool of worker processes for every batch, and `default_build`
    imports every back end's tensor intrinsics in each worker (over 2 minutes of CPU here, CUDA's
    intrinsics alone 90 s) before building; on 2 cores that was most of MetaSchedule's tuning
    time. The import only registers intrinsics by name for scheduling, which happens in this
    process; the module a worker builds already holds the tensorized bodies, so the build is the
    same. Nested, so that cloudpickle sends it by value (the worker does not import tsl)."""

    def build(mod, target, _params):
        from tvm.driver import build as tvm_build
        from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

        mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
        return tvm_build(mod, target=target)

    return build


def _run_evaluator():
    """MetaSchedule's `default_run_evaluator`, timed like tsl's kernels: under
    `tsl.timing.realtime` when TSL_TIMING=realtime (the runner's worker inherits the variable),
    so that both tuners measure their candidates the same way. Nested, like `_build_function`."""

    def run(rt_mod, device, evaluator_config, repeated_args):
        from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common

        from tsl.timing import realtime

        with realtime():
            return run_evaluator_common(rt_mod, device, evaluator_config, repeated_args)

    return run


def _tensors(op, xs, dev):
    import tvm

    return [tvm.runtime.tensor(x, dev) for x in xs] + [
        tvm.runtime.empty(op.output.shape, op.output.dtype, dev)]
