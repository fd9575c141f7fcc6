"""The Tensor Abstract Machine: machines as data, loaded from TOML.

Which CPU machine this host is (and its measured rates) is the CPU back end's:
`tsl.backends.cpu.detect()`, `python -m tsl.backends.cpu detect | probe`.
"""

from .loader import builtin_names, load, resolve
from .machine import (ComputeLevel, Machine, MemoryLevel, Mover, TensorPrimitive, VectorUnit,
                      dtype_bytes)

__all__ = ["load", "builtin_names", "resolve", "Machine", "ComputeLevel", "MemoryLevel",
           "TensorPrimitive", "Mover", "VectorUnit", "dtype_bytes"]


def __getattr__(name: str):
    if name == "detect":  # moved: the TAM names no back end
        raise AttributeError("tsl.tam.detect is now tsl.backends.cpu.detect (host detection is "
                             "the CPU back end's)")
    raise AttributeError(f"module 'tsl.tam' has no attribute {name!r}")
