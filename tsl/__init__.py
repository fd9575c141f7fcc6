"""tsl: one optimization schedule per operator, compiled for very different ML computers.

    import tsl
    op = tsl.ops.matmul(1024, 1024, 1024, dtype="float32")
    art = tsl.build(op, target="cpu")        # the operator's default TSL schedule
    c = art.run(a, b)

TVM is imported only when something is lowered, so `import tsl` stays fast.
"""

import importlib

from . import model, ops
from .build import build
from .record import schedule
from .errors import (BackendUnavailable, InputError, LoweringError, OptionError, ScheduleError,
                     TAMError, TSLError)
from .primitives.schedule import Loop, Schedule
from .schedules import default_schedule
from .tam import Machine, builtin_names as machines, load as load_machine

# Submodules `tsl.<name>` resolves on first use (PEP 562), so `import tsl; tsl.tune.tune(...)`
# works as the README writes it while `import tsl` imports neither TVM (tsl.relax) nor
# XGBoost (tsl.tune) nor the bench's peers.
LAZY_SUBMODULES = ("backends", "bench", "primitives", "relax", "schedules", "tam", "tune")


def __getattr__(name: str):
    if name in LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'tsl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(LAZY_SUBMODULES))


def verify(artifact, seed: int = 1) -> tuple[bool, float]:
    """Run `artifact` on fresh random inputs and compare with its operator's NumPy reference:
    (ok, error) - max abs difference for integers, relative Frobenius error for floats."""
    return artifact.verify(seed)


__all__ = ["ops", "model", "build", "schedule", "verify", "Schedule", "Loop", "Machine",
           "load_machine", "machines", "default_schedule", "TSLError", "TAMError",
           "ScheduleError", "LoweringError", "BackendUnavailable", "InputError", "OptionError"]
__version__ = "0.1.0"
