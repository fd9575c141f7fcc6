"""The VTA back end's [params]: the hardware configuration the TAM's levels do not carry, and
the cycle model of the simulator."""

from __future__ import annotations

from dataclasses import dataclass

from ...tam.params import Params


@dataclass(frozen=True, kw_only=True)
class VTAParams(Params):
    """log_uop_buff_size: log2 bytes of the micro-op buffer (not an operand level of the TAM);
    bus_bytes: the AXI bus width; dram_bytes_per_cycle: what DRAM delivers; dma_latency_cycles:
    latency of one DMA burst (one per row); gemm_ii_cycles / alu_ii_cycles: cycles between two
    GEMM / ALU uops; pipeline_fill_cycles: cycles to fill the GEMM/ALU pipeline per instruction.
    """

    log_uop_buff_size: int
    bus_bytes: int
    dram_bytes_per_cycle: float
    dma_latency_cycles: int
    gemm_ii_cycles: int
    alu_ii_cycles: int
    pipeline_fill_cycles: int

    def vta_config(self) -> dict:
        """The fields under the names of VTA's own configuration (`VTAConfig.from_params`)."""
        return {"log_uop_buff_size": self.log_uop_buff_size, "bus_bytes": self.bus_bytes,
                "dram_bytes_per_cycle": self.dram_bytes_per_cycle,
                "dma_latency": self.dma_latency_cycles, "gemm_ii": self.gemm_ii_cycles,
                "alu_ii": self.alu_ii_cycles, "pipeline_fill": self.pipeline_fill_cycles}
