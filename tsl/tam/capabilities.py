"""What a back end's programs do with a machine's movers: codegen capabilities, not hardware
facts, so a back end declares them (`Backend.capabilities`) and machine files do not. The
schedule's capacity checks and the cost model read them for the machine's back end.

This layer names no back end: the back-end registry (`tsl.backend`, a layer above) tells it
which capabilities a back end declares through `set_finder`, as it does for `Params`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass(frozen=True, kw_only=True)
class Capabilities:
    """How a back end's program copies tiles between a memory level and its parent (by the
    machine's movers); all False is a program that copies each staged tile whole, once per
    iteration of its loops, paying a mover's latency once per copy.

    serial_rows: a 2-D copy is one burst per row, one after another, each paying the mover's
    latency (VTA's LOADs and STOREs as its DMA runs them); False: the latency is paid once
    per copy.
    row_pitch: a 2-D copy takes its rows at any pitch, so the tile of a strided window holds
    only the rows the kernel taps read (`Operator.tile_shape(rows_used=True)`): every other
    input row of a 1x1 stride-2 convolution is skipped, not loaded.
    keeps_tiles: a copy of the region the destination buffer already holds is skipped, so a
    tile staged under loops it does not depend on is loaded once per change, not once per
    iteration (the VTA codegen compares each LOAD with the buffer's last one).
    shares_tiles: virtual threads that need the same region at once (a weight tile of threads
    that split the output rows) read one copy of it, loaded once into one thread's part of the
    buffer, instead of one copy per thread (the VTA codegen compares the threads' LOADs).
    """

    serial_rows: bool = False
    row_pitch: bool = False
    keeps_tiles: bool = False
    shares_tiles: bool = False


NONE = Capabilities()
_finder: Callable[[str], Capabilities | None] | None = None


def set_finder(finder: Callable[[str], Capabilities | None]) -> None:
    """Install how a back end's name maps to its `Capabilities` (None: no such back end)."""
    global _finder
    _finder = finder


def of(backend: str) -> Capabilities:
    """The capabilities back end `backend` declares (none for a back end nobody knows)."""
    return (_finder(backend) if _finder is not None else None) or NONE
