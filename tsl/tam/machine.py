"""The Tensor Abstract Machine: one frozen dataclass per hardware concept.

A `Machine` is plain data. Schedules read it (capacities, primitive shapes, compute levels) and
back ends lower against it; nothing here knows any particular chip. Machines are loaded from
TOML files by `tsl.tam.load` (see `loader.py` for the file format and its validation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..errors import TAMError
from .params import Params

OPERANDS = ("A", "B", "C")
MEMORY_ROLES = ("global", "scratchpad", "operand", "accumulator")
COMPUTE_ROLES = ("core", "subcore", "lane")
PRIMITIVE_KINDS = ("matmul",)
# Element types a primitive or a peak may name; the spellings are TVM's.
DTYPES = {
    "int4": 0.5, "uint4": 0.5, "int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float16": 2, "bfloat16": 2, "float32": 4,
    "float64": 8,
}


def dtype_bytes(dtype: str) -> float:
    return DTYPES[dtype]


@dataclass(frozen=True)
class ComputeLevel:
    """A level of parallel compute, outermost first: cores of a CPU, SMs/blocks and warps of a
    GPU, VTA's single core (whose `count` is its virtual threads), TPU TensorCores."""

    name: str
    role: str
    count: int
    bind: str = ""  # how the back end maps a loop onto it; opaque to schedules
    # True: the instances take turns on one set of units (VTA's virtual threads): running a
    # loop over them hides one instance's data movement behind another's compute, it does not
    # add compute throughput.
    virtual: bool = False
    # Cycles to start the instances once (a CPU thread pool's fork and join): paid again on
    # every iteration of the loops around a loop run over this level.
    launch_cycles: float = 0.0


@dataclass(frozen=True)
class MemoryLevel:
    """A memory level. `capacity` is bytes per instance; `instances` counts copies per instance
    of the compute level named by `per`; `holds` lists the operand roles (A, B, C) it may keep."""

    name: str
    role: str
    capacity: int
    holds: tuple[str, ...]
    parent: str | None = None
    instances: int = 1
    per: str | None = None
    bandwidth: float = 0.0  # bytes per cycle between this level and its parent
    alignment: int = 1
    managed: bool = True  # False: a hardware cache; tiles fit it, nothing is copied into it

    def may_hold(self, operand: str) -> bool:
        return operand in self.holds


@dataclass(frozen=True)
class TensorPrimitive:
    """A fixed-shape matrix instruction C[m,n] += A[m,k] * B[k,n] (a 16x16x16 mma, VTA's
    1x16x16 GEMM, a 16x4 VNNI dot, an MXU pass). `layout_b` says how B must be laid out in its
    level: "kn" (row-major K x N), "nk" (transposed), or a blocked form the back end packs to."""

    name: str
    kind: str
    m: int
    n: int
    k: int
    a_dtype: str
    b_dtype: str
    acc_dtype: str
    a_level: str
    b_level: str
    c_level: str
    layout_a: str = "mk"
    layout_b: str = "kn"
    macs_per_cycle: float = 0.0  # per instance of the compute level that issues it
    latency: int = 1
    issued_by: str | None = None  # compute level name; default: the innermost one
    # How a back end emits the primitive: an instruction kind it knows (e.g. a CPU's "fma",
    # "dot4", "madd2") and, where the kind needs one, the target intrinsic it calls.
    instruction: str = ""
    intrinsic: str = ""
    # Bytes of c_level the instruction needs besides the accumulator tile (x86 vpmaddwd writes
    # its products to a register of their own before they are added).
    scratch: int = 0

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.m, self.n, self.k)

    def accepts(self, a_dtype: str, b_dtype: str) -> bool:
        return self.a_dtype == a_dtype and self.b_dtype == b_dtype


@dataclass(frozen=True)
class Mover:
    """A data path between two memory levels (DMA engine, cp.async, load/store unit). What a
    back end's programs do with it (rows one by one, at a pitch, copies skipped or shared) is
    the back end's, `tsl.tam.capabilities.Capabilities`."""

    name: str
    src: str
    dst: str
    dims: int = 1
    padding: bool = False
    bytes_per_cycle: float = 0.0
    latency: int = 0  # cycles before the data of a transfer starts to flow
    # Bytes per cycle the other way, dst -> src (a core's stores: one port where loads have
    # two); 0: as bytes_per_cycle.
    store_bytes_per_cycle: float = 0.0
    # Bytes per cycle of the loads where the operands are read unpacked, where they lie (a
    # GEMM whose B is an activation read in place: each reduction step loads a row of it and
    # broadcasts one element of each of A's rows); 0: as bytes_per_cycle.
    unpacked_bytes_per_cycle: float = 0.0


@dataclass(frozen=True)
class VectorUnit:
    """An element-wise unit that works on a memory level (VTA ALU in ACC, TPU VPU, SIMD)."""

    name: str
    level: str
    lanes: int
    ops: tuple[str, ...]
    dtypes: tuple[str, ...]
    ops_per_cycle: float = 0.0


@dataclass(frozen=True)
class Machine:
    """A whole TAM. `peaks` maps an accumulate dtype pair key (the primitive's a_dtype) to
    operations per second (a MAC is two); `params` holds the back end's typed parameters (an
    LLVM CPU name, a CUDA arch, a DRAM bandwidth: its `Params` dataclass, checked at load);
    `sources` says where the figures come from and what the file does not model."""

    name: str
    backend: str
    clock_hz: float
    compute: tuple[ComputeLevel, ...]
    memory: tuple[MemoryLevel, ...]
    primitives: tuple[TensorPrimitive, ...]
    movers: tuple[Mover, ...] = ()
    vectors: tuple[VectorUnit, ...] = ()
    peaks: Mapping[str, float] = field(default_factory=dict)
    params: Params = field(default_factory=Params)
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=dict)
    source: str = ""
    notes: tuple[str, ...] = ()  # how this machine was arrived at (e.g. host detection)
    # Where the clock, rates and peaks come from: "file" (as written), or what a back end
    # made of them for this host (the CPU's: "built-in", "probed"); a bench row prints it.
    provenance: str = "file"

    # -- lookups used by schedules and back ends -------------------------------------------
    def memory_level(self, name: str) -> MemoryLevel:
        for lv in self.memory:
            if lv.name == name:
                return lv
        raise TAMError(f"machine {self.name!r} has no memory level {name!r}; it has "
                       f"{[lv.name for lv in self.memory]}")

    def compute_level(self, name_or_role: str) -> ComputeLevel | None:
        for lv in self.compute:
            if lv.name == name_or_role or lv.role == name_or_role:
                return lv
        return None

    def levels(self, role: str, operand: str | None = None) -> tuple[MemoryLevel, ...]:
        """Memory levels of `role`, outermost first, that may hold `operand` (any if None)."""
        return tuple(lv for lv in self.memory
                     if lv.role == role and (operand is None or lv.may_hold(operand)))

    def primitive(self, a_dtype: str, b_dtype: str | None = None) -> TensorPrimitive | None:
        """The primitive that takes these operand dtypes with the most MACs per cycle."""
        found = [p for p in self.primitives if p.accepts(a_dtype, b_dtype or a_dtype)]
        return max(found, key=lambda p: p.macs_per_cycle, default=None)

    def primitive_named(self, name: str) -> TensorPrimitive:
        for p in self.primitives:
            if p.name == name:
                return p
        raise TAMError(f"machine {self.name!r} has no tensor primitive {name!r}; it has "
                       f"{[p.name for p in self.primitives]}")

    def peak(self, dtype: str) -> float | None:
        """Peak operations per second for operands of `dtype` (None if the file gives none)."""
        return self.peaks.get(dtype)

    def cores(self) -> int:
        lv = self.compute_level("core")
        return lv.count if lv else 1
