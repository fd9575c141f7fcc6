"""TSL: the schedule object and its primitives."""

from .layout import Blocked
from .schedule import Loop, Schedule, Stage, Step

__all__ = ["Schedule", "Loop", "Stage", "Step", "Blocked"]
