"""The VTA hardware configuration and the quantities derived from it.

Buffer sizes are log2 of BYTES, as in VTA's `vta_config.json`; every depth, entry size and ISA
field width follows from them the way VTA's `hw_spec.h` derives them, so that one dataclass
describes both the instruction layout and the simulated machine. The last group of fields
(bandwidth, latency, initiation intervals, pipeline fill, clock) is not part of VTA's
configuration: it parameterises the cycle model (see `timing.py`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class VTAConfig:
    log_batch: int = 0
    log_block_in: int = 4
    log_block_out: int = 4
    log_inp_width: int = 3
    log_wgt_width: int = 3
    log_acc_width: int = 5
    log_uop_buff_size: int = 15
    log_inp_buff_size: int = 15
    log_wgt_buff_size: int = 18
    log_acc_buff_size: int = 17
    bus_bytes: int = 8
    dram_bytes_per_cycle: float = 8.0
    dma_latency: int = 64
    gemm_ii: int = 1
    alu_ii: int = 2
    pipeline_fill: int = 4
    clock_hz: float = 100e6

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"VTAConfig.{f.name} must be an int, got {value!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"VTAConfig.{f.name} must be a number, got {value!r}")
            if value < 0:
                raise ValueError(f"VTAConfig.{f.name} must be >= 0, got {value}")
        for name in ("bus_bytes", "dram_bytes_per_cycle", "gemm_ii", "alu_ii", "clock_hz"):
            if getattr(self, name) <= 0:
                raise ValueError(f"VTAConfig.{name} must be > 0, got {getattr(self, name)}")
        # Entries must be whole bytes and every buffer must hold at least one entry, else
        # DRAM element addressing and buffer depths are undefined.
        for buf in ("inp", "wgt", "acc", "out"):
            bits = self._entry_bits(buf)
            if bits % 8:
                raise ValueError(f"VTAConfig: one {buf.upper()} entry is {bits} bits, "
                                 "not a whole number of bytes")
            if self.buffer_bytes(buf) < bits // 8:
                raise ValueError(f"VTAConfig: the {buf.upper()} buffer "
                                 f"({self.buffer_bytes(buf)} bytes) is smaller than one entry "
                                 f"({bits // 8} bytes)")
        if self.buffer_bytes("uop") < self.uop_bytes:
            raise ValueError("VTAConfig: the UOP buffer is smaller than one uop")

    @classmethod
    def from_params(cls, params: dict) -> "VTAConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        for key in params:
            if key not in names:
                raise ValueError(f"unknown VTA configuration key {key!r}; "
                                 f"known keys: {', '.join(sorted(names))}")
        return cls(**params)

    # -- shapes and widths ------------------------------------------------------------------
    @property
    def batch(self) -> int:
        return 1 << self.log_batch

    @property
    def block_in(self) -> int:
        return 1 << self.log_block_in

    @property
    def block_out(self) -> int:
        return 1 << self.log_block_out

    @property
    def inp_width(self) -> int:
        return 1 << self.log_inp_width

    @property
    def wgt_width(self) -> int:
        return 1 << self.log_wgt_width

    @property
    def acc_width(self) -> int:
        return 1 << self.log_acc_width

    @property
    def out_width(self) -> int:
        return self.inp_width

    @property
    def log_out_buff_size(self) -> int:
        return self.log_inp_buff_size

    def _entry_bits(self, buf: str) -> int:
        return {
            "inp": self.batch * self.block_in * self.inp_width,
            "wgt": self.block_out * self.block_in * self.wgt_width,
            "acc": self.batch * self.block_out * self.acc_width,
            "out": self.batch * self.block_out * self.out_width,
        }[buf]

    # -- entry bytes (also the DRAM element sizes) -------------------------------------------
    @property
    def uop_bytes(self) -> int:
        return 4

    @property
    def inp_entry_bytes(self) -> int:
        return self._entry_bits("inp") // 8

    @property
    def wgt_entry_bytes(self) -> int:
        return self._entry_bits("wgt") // 8

    @property
    def acc_entry_bytes(self) -> int:
        return self._entry_bits("acc") // 8

    @property
    def out_entry_bytes(self) -> int:
        return self._entry_bits("out") // 8

    # -- buffer depths -------------------------------------------------------------------------
    def buffer_bytes(self, buf: str) -> int:
        """Size in bytes of buffer `buf` in {"uop", "inp", "wgt", "acc", "out"}."""
        log = {"uop": self.log_uop_buff_size, "inp": self.log_inp_buff_size,
               "wgt": self.log_wgt_buff_size, "acc": self.log_acc_buff_size,
               "out": self.log_out_buff_size}[buf]
        return 1 << log

    @property
    def uop_depth(self) -> int:
        return self.buffer_bytes("uop") // self.uop_bytes

    @property
    def inp_depth(self) -> int:
        return self.buffer_bytes("inp") // self.inp_entry_bytes

    @property
    def wgt_depth(self) -> int:
        return self.buffer_bytes("wgt") // self.wgt_entry_bytes

    @property
    def acc_depth(self) -> int:
        return self.buffer_bytes("acc") // self.acc_entry_bytes

    @property
    def out_depth(self) -> int:
        return self.buffer_bytes("out") // self.out_entry_bytes

    # -- index bits (hw_spec: log2 of the depth) -----------------------------------------------
    @property
    def log_uop_depth(self) -> int:
        return self.uop_depth.bit_length() - 1

    @property
    def log_inp_depth(self) -> int:
        return self.inp_depth.bit_length() - 1

    @property
    def log_wgt_depth(self) -> int:
        return self.wgt_depth.bit_length() - 1

    @property
    def log_acc_depth(self) -> int:
        return self.acc_depth.bit_length() - 1


DEFAULT = VTAConfig()
