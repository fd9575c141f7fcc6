"""The CPU back end's [params]: how LLVM names the target and which features it needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...tam.params import Params


@dataclass(frozen=True, kw_only=True)
class CPUParams(Params):
    """arch: the architecture the host must have ("x86_64", "aarch64"); mtriple / mcpu: what
    LLVM is told when cross-compiling (on the host its own CPU name is used); require: the CPU
    features the file's primitives need (LLVM's names); cpus: LLVM CPU names this file is the
    best description of (host detection prefers it for them); qemu_cpu: the QEMU model an
    emulated run uses; uarch: per micro-architecture rate tables, `[params.uarch.NAME]`
    (their keys are checked by `rates.uarch`, the one reader); prefetch_bytes: how far ahead
    of its loads, in bytes of the packed weight panel, a GEMM's reduction loop prefetches B
    into the L1 (`lowering._prefetch_weights`); 0: no software prefetch, the hardware's alone;
    prefetch_channels: how many channel steps ahead a stride-1 NCHW conv's channel loop
    prefetches its window's input rows into the L1 where one channel's plane is more than
    `prefetch_stride_bytes` (`lowering._prefetch_rows`): each step's rows lie a plane further
    on, a stride longer than the hardware prefetchers follow; 0: none."""

    arch: str = ""
    mtriple: str = ""
    mcpu: str = "generic"
    require: tuple[str, ...] = ()
    cpus: tuple[str, ...] = ()
    qemu_cpu: str = "max"
    uarch: dict[str, dict] = field(default_factory=dict)
    prefetch_bytes: int = 0
    prefetch_channels: int = 0
    prefetch_stride_bytes: int = 0
