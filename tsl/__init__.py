"""tsl: one optimization schedule per operator, compiled for very different ML computers.

    import tsl
    op = tsl.ops.matmul(1024, 1024, 1024, dtype="float32")
    art = tsl.build(op, target="cpu")        # the operator's default TSL schedule
    c = art.run(a, b)

TVM is imported only when something is lowered, so `import tsl` stays fast.
"""

from . import model, ops
from .build import build, schedule
from .errors import (BackendUnavailable, InputError, LoweringError, ScheduleError, TAMError,
                     TSLError)
from .primitives.schedule import Loop, Schedule
from .schedules import default_schedule
from .tam import Machine, builtin_names as machines, load as load_machine



def verify(artifact, seed: int = 1) -> tuple[bool, float]:
    """Run `artifact` on fresh random inputs and compare with its operator's NumPy reference:
    (ok, error) - max abs difference for integers, relative Frobenius error for floats."""
    return artifact.verify(seed)


__all__ = ["ops", "model", "build", "schedule", "verify", "Schedule", "Loop", "Machine",
           "load_machine", "machines", "default_schedule", "TSLError", "TAMError",
           "ScheduleError", "LoweringError", "BackendUnavailable", "InputError"]
__version__ = "0.1.0"
