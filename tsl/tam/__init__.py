"""The Tensor Abstract Machine: machines as data, loaded from TOML."""

from .host import detect
from .loader import builtin_names, load, resolve
from .machine import (ComputeLevel, Machine, MemoryLevel, Mover, TensorPrimitive, VectorUnit,
                      dtype_bytes)

__all__ = ["load", "detect", "builtin_names", "resolve", "Machine", "ComputeLevel", "MemoryLevel",
           "TensorPrimitive", "Mover", "VectorUnit", "dtype_bytes"]
