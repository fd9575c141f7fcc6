"""The Tensor Core back end's [params]: the SM's limits and rates the TAM's levels do not carry,
and which PTX features the code generator may use."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...tam.params import Params


@dataclass(frozen=True, kw_only=True)
class TensorCoreParams(Params):
    """arch: the CUDA arch ("sm_80"); cp_async / ldmatrix / mma_sync: PTX features the kernels
    may use (mma_sync: ldmatrix + mma.sync for GEMMs); kernel_gap_seconds: how long after the
    first kernel of a split reduction the second starts; l2_capacity_bytes: L2 size; the
    occupancy limits (max_threads_per_block, max_registers_per_thread, registers_per_sm,
    max_warps_per_sm, smem_bytes_per_sm); l2_bytes_per_s: L2 -> SMs in all;
    l2_sm_bytes_per_cycle: one SM's L2 port; overlap_stall_share: the share of the shorter of
    two nearly equal overlapped paths added as stall; barrier_cycles: one __syncthreads;
    hbm_bytes_per_s: HBM bandwidth; instruction_rate: the share of [peaks] each Tensor Core
    instruction reaches; wmma_shapes / mma_shapes: the PTX shapes per operand type."""

    arch: str
    cp_async: bool = False
    ldmatrix: bool = False
    mma_sync: bool = False
    kernel_gap_seconds: float | None = None  # None: no split reduction is priced
    l2_capacity_bytes: int = 0
    max_threads_per_block: int = 1024
    max_registers_per_thread: int = 255
    registers_per_sm: int
    max_warps_per_sm: int
    smem_bytes_per_sm: int
    l2_bytes_per_s: float
    l2_sm_bytes_per_cycle: float
    overlap_stall_share: float
    barrier_cycles: float
    hbm_bytes_per_s: float
    instruction_rate: dict[str, float] = field(default_factory=dict)
    wmma_shapes: dict[str, str] = field(default_factory=dict)
    mma_shapes: dict[str, str] = field(default_factory=dict)
