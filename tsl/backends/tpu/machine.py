"""The TPU back end's [params]: a TensorCore's facts the TAM's levels do not carry (after JAX
Pallas' `tpu_info.TpuInfo`) and the Mosaic kernel detail of the cost model (model.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ...tam.params import Params


@dataclass(frozen=True, kw_only=True)
class TPUParams(Params):
    """generation: the TPU generation; mxu_count / mxu_shape: MXUs per TensorCore and their
    (rows, columns); hbm_bytes_per_s: HBM bandwidth; vmem_physical_bytes / vmem_scoped_bytes:
    VMEM per TensorCore and the budget a kernel is given; tiling: (sublanes, lanes) every 2-D
    tile's last two dims pad to; native_tile: that tile per dtype; mxu_fill_cycles: fixed cycles
    of one dot; mxu_weight_push_cycles: cycles to push one weight tile; vmem_bytes_per_cycle:
    VMEM <-> vector registers; grid_step_cycles: the fixed cost of one grid step; uncertain:
    which figures are estimates, not published."""

    generation: int
    mxu_count: int
    mxu_shape: tuple[int, ...]
    hbm_bytes_per_s: float
    vmem_physical_bytes: int
    vmem_scoped_bytes: int
    tiling: tuple[int, ...]
    native_tile: dict[str, tuple[int, ...]]
    mxu_fill_cycles: int
    mxu_weight_push_cycles: int
    vmem_bytes_per_cycle: float
    grid_step_cycles: int
    uncertain: tuple[str, ...] = ()
