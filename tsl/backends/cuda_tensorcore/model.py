"""A performance model of one Tensor Core kernel: what the emitted instruction, the occupancy,
the L2 -> SM and shared-memory traffic of each tile, the barriers and the pipeline fill allow.

It is a model (`kind = "model"`), not a measurement. Per SM and per k-step of a block tile
(BM x BN x BK, W warps, S pipeline stages) it takes the slowest of

    tensor   BM*BN*BK MACs / (primitive MACs/clk x rate of the emitted instruction x
             min(1, resident warps / 4 sub-partitions)), plus the fragment-load latency of
             each 16-deep slice, divided by the warps per sub-partition that hide it
    shared   (BM + BN) * BK bytes written by cp.async + W * (WM + WN) * BK bytes read into
             fragments, at the shared level's bytes/clk
    L2       (BM + BN) * BK bytes at this SM's share of the L2 -> SM bandwidth

and adds what a block cannot overlap with its own work, divided over the blocks resident on
the SM (they hide each other's stalls): a barrier per k-step, the pipeline fill (the copy
latency of the first stage), and the epilogue (WMMA: each accumulator fragment goes through
shared memory between two barriers; mma.sync / wgmma: stored from the registers). Blocks run in waves of (SMs x blocks per SM); the last wave runs
with as many blocks per SM as it has. The result is floored by the HBM traffic.

`upper_bound_seconds` is the roofline of the emitted instruction (its rate x the busy share of
the last wave, or HBM): no kernel issuing that instruction can be faster, so a rate computed
from it is an upper bound, labelled so.

Every rate is machine data: [peaks], the primitive's macs_per_cycle, [params] instruction_rate,
l2_bytes_per_s, barrier_cycles, and the movers' latencies (tensorcore-*.toml).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import TAMError
from ...tam.machine import dtype_bytes

SUBPARTITIONS = 4  # warp schedulers (and Tensor Cores) per SM on sm_70 .. sm_90


@dataclass(frozen=True)
class Tile:
    """What the model needs of a kernel: its block tile and launch."""

    block_m: int  # output rows of a block (batch x rows for batched operators)
    block_n: int
    block_k: int  # reduction elements per pipelined step
    k_steps: int
    warps: int
    warp_m: int  # output rows of one warp's accumulator tile
    warp_n: int
    stages: int
    blocks: int
    in_bytes: float
    acc_bytes: float
    instruction: str  # "wmma", "mma_sync" or "wgmma": what the kernel issues


def tile_of(schedule, kernel) -> Tile:
    """The block and warp tile of a lowered schedule (from its loop nest: the loops inside the
    one bound to blocks make a block's tile, those inside the warp loop a warp's)."""
    s, op = schedule, schedule.op
    ext = s.padded_extents()
    core = _parallel_index(s, "core")
    sub = _parallel_index(s, "subcore")
    block = _extents_inside(s, core)
    warp = _extents_inside(s, sub) if sub is not None else block
    staged = [st.at for st in s.stages if st.level.role == "scratchpad"]
    pipelined = next((lp for lp in s.loops if lp.stages > 1), None)
    step_at = pipelined or (staged[0] if staged else None)
    k_total = math.prod(ext[a] for a in ext if s.role_of(a) == "k")
    if step_at is not None:
        inside = s.loops.index(step_at) + 1
        k_step = math.prod(lp.extent for lp in s.loops[inside:]
                           for a in lp.axes[:1] if s.role_of(a) == "k")
    else:
        k_step = k_total
    rows = ("m", "b")
    warps = math.prod(int(d) for d in kernel.block) // 32
    return Tile(
        block_m=math.prod(v for a, v in block.items() if s.role_of(a) in rows),
        block_n=math.prod(v for a, v in block.items() if s.role_of(a) == "n"),
        block_k=k_step, k_steps=max(k_total // max(k_step, 1), 1), warps=warps,
        warp_m=math.prod(v for a, v in warp.items() if s.role_of(a) in rows),
        warp_n=math.prod(v for a, v in warp.items() if s.role_of(a) == "n"),
        stages=pipelined.stages if pipelined else 1, blocks=math.prod(kernel.grid),
        in_bytes=dtype_bytes(op.dtype), acc_bytes=dtype_bytes(op.acc_dtype),
        instruction=instruction_of(kernel.source))


def instruction_of(source: str) -> str:
    """The Tensor Core instruction a CUDA source issues."""
    if "wgmma.mma_async" in source:
        return "wgmma"
    if "mma.sync.aligned" in source:
        return "mma_sync"
    return "wmma"


def _parallel_index(s, role: str) -> int | None:
    return next((i for i, lp in enumerate(s.loops) if lp.parallel
                 and s.machine.compute_level(lp.parallel).role == role), None)


def _extents_inside(s, index: int | None) -> dict[str, int]:
    """Per axis, the product of the loop extents inside loop `index` (the whole axis when
    None)."""
    ext = s.padded_extents()
    if index is None:
        return dict(ext)
    out = {a: 1 for a in ext}
    for lp in s.loops[index + 1:]:
        for part in lp.parts or (lp,):
            out[part.axes[0]] *= part.extent
    return out


@dataclass(frozen=True)
class Model:
    """The modelled time of one kernel on one machine, and the terms it is made of."""

    machine: str
    instruction: str
    instruction_rate: float  # fraction of the dtype's peak the instruction reaches
    peak: float  # the dtype's peak (operations per second)
    flops: float
    padded_flops: float
    blocks_per_sm: int
    sms: int
    waves: float
    step_cycles: dict  # per k-step of one block: tensor / shared / l2 (bandwidth terms)
    exposed_cycles: dict  # per block, not overlapped with its own work: barriers, fill, epilogue
    cycles: float
    clock_hz: float
    hbm_seconds: float
    kind: str = "model"

    @property
    def seconds(self) -> float:
        return max(self.cycles / self.clock_hz, self.hbm_seconds)

    @property
    def limiter(self) -> str:
        if self.hbm_seconds >= self.cycles / self.clock_hz:
            return "HBM"
        return max(self.step_cycles, key=self.step_cycles.get)

    @property
    def wave_efficiency(self) -> float:
        """The busy share of the SMs over the kernel, a block using at most one SM."""
        per_sm = self.waves * self.blocks_per_sm  # blocks per SM if one ran at a time
        return per_sm / math.ceil(per_sm - 1e-9)

    @property
    def upper_bound_seconds(self) -> float:
        """The emitted instruction's roofline: nothing issuing it can be faster."""
        rate = self.peak * self.instruction_rate * self.wave_efficiency
        return max(self.padded_flops / rate, self.hbm_seconds)

    @property
    def rate(self) -> float:
        return self.flops / self.seconds

    @property
    def upper_bound_rate(self) -> float:
        return self.flops / self.upper_bound_seconds

    def __str__(self) -> str:
        step = ", ".join(f"{k} {v:.0f}" for k, v in self.step_cycles.items())
        exposed = ", ".join(f"{k} {v:.0f}" for k, v in self.exposed_cycles.items())
        return "\n".join([
            f"model on {self.machine}: {self.seconds * 1e6:.1f} us, {self.rate / 1e12:.1f} "
            f"TFLOP/s = {100 * self.rate / self.peak:.0f}% of the {self.peak / 1e12:.0f} "
            f"TFLOP/s peak (limited by {self.limiter})",
            f"  upper bound: {self.upper_bound_rate / 1e12:.1f} TFLOP/s ({self.instruction} at "
            f"{100 * self.instruction_rate:.0f}% of peak, "
            f"{100 * self.wave_efficiency:.0f}% of the last wave busy)",
            f"  per k-step of a block (cycles): {step}; per block, exposed: {exposed}",
            f"  {self.blocks_per_sm} block(s)/SM, {self.waves:.2f} waves on {self.sms} SMs"])


def model(machine, tile: Tile, flops: float, padded_flops: float, blocks_per_sm: int,
          hbm_bytes: float, dtype: str) -> Model:
    """The modelled time of a kernel with block tile `tile` on `machine` (see the module)."""
    p = machine.params
    prim = machine.primitive(dtype)
    rates = p.get("instruction_rate", {})
    if tile.instruction not in rates:
        raise TAMError(f"{machine.name}: [params.instruction_rate] has no rate for "
                       f"{tile.instruction!r}")
    irate = float(rates[tile.instruction])
    sms = machine.cores()
    smem_bw = machine.levels("scratchpad")[0].bandwidth
    l2_per_sm = float(p["l2_bytes_per_s"]) / machine.clock_hz / sms
    barrier = float(p["barrier_cycles"])
    copy_latency = next((mv.latency for mv in machine.movers if mv.dst == "smem"), 0)
    frag_latency = next((mv.latency for mv in machine.movers if mv.src == "smem"), 0)
    t = tile
    step_bytes = (t.block_m + t.block_n) * t.block_k * t.in_bytes
    fragment_reads = t.warps * (t.warp_m + t.warp_n) * t.block_k * t.in_bytes
    c_tile = t.block_m * t.block_n * t.acc_bytes
    fragments = (t.warp_m // 16) * (t.warp_n // 16)
    if t.instruction == "wmma":  # each fragment through shared memory, between two barriers
        epilogue = 2 * fragments * barrier + 2 * c_tile / smem_bw + c_tile / l2_per_sm
    else:  # straight from the registers
        epilogue = c_tile / l2_per_sm

    def wave_cycles(per_sm: int) -> tuple[float, dict, dict]:
        per_sub = per_sm * t.warps / SUBPARTITIONS  # warps per scheduler
        # A warp loads its fragments for a 16-deep slice, then issues the mma on them: with
        # no other warp on its scheduler, the load latency is not hidden.
        step = {"tensor": t.block_m * t.block_n * t.block_k
                / (prim.macs_per_cycle * irate * min(1.0, per_sub))
                + t.block_k // 16 * frag_latency / max(1.0, per_sub),
                "shared": (step_bytes + fragment_reads) / smem_bw,
                "l2": step_bytes / l2_per_sm}
        exposed = {"barriers": t.k_steps * (barrier + frag_latency),
                   "fill": copy_latency + (t.stages - 1) * step_bytes / l2_per_sm,
                   "epilogue": epilogue}
        # `per_sm` blocks share the SM's rates; each block's stalls are hidden by the others'
        # work, but a block never finishes before its own work plus its own stalls.
        work = per_sm * t.k_steps * max(step.values())
        stalls = sum(exposed.values())
        total = max(work + stalls / per_sm, stalls + t.k_steps * max(step.values()))
        return total, step, exposed

    resident = sms * blocks_per_sm
    full, rest = divmod(t.blocks, resident)
    cycles, step, exposed = wave_cycles(blocks_per_sm)
    cycles *= full
    if rest:
        last, step_last, exposed_last = wave_cycles(math.ceil(rest / sms))
        cycles += last
        if not full:
            step, exposed = step_last, exposed_last
    return Model(machine.name, t.instruction, irate, machine.peak(dtype), flops, padded_flops,
                 blocks_per_sm, sms, t.blocks / resident, step, exposed, cycles,
                 machine.clock_hz, hbm_bytes / float(p["hbm_bytes_per_s"]))
