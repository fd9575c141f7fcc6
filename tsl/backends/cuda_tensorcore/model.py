"""A performance model of one Tensor Core kernel: what the emitted instruction, the occupancy,
the L2 -> SM and shared-memory traffic of each tile, the barriers and the pipeline fill allow.

It is a model (`kind = "model"`), not a measurement, and it is the price of a schedule both
for the knob search (`schedule_program`, registered with tsl.model: the block tile, warps and
pipeline depth are its choice) and for the built artifact (`price` with ptxas' registers).
Per SM and per k-step of a block tile (BM x BN x BK, W warps, S pipeline stages) it takes

    tensor   BM*BN*BK MACs / (primitive MACs/clk x rate of the emitted instruction x
             min(1, resident warps / 4 sub-partitions)), plus the fragment-load latency of
             each 16-deep slice, divided by the warps per sub-partition that hide it
    shared   (BM + BN) * BK bytes written by cp.async + W * (WM + WN) * BK bytes read into
             fragments, at the shared level's bytes/clk
    L2       (BM + BN) * BK bytes at this SM's share of the L2 -> SM bandwidth (the L2's
             bandwidth over the SMs that have blocks in this wave, at most the SM's port)

the slowest of them plus `overlap_stall_share` x the second slowest x their ratio (paths of nearly
equal time stall each other); an unpipelined kernel (S = 1) copies, then computes. It adds
what a block cannot overlap with its own work, divided over the blocks resident on the SM
(they hide each other's stalls): a barrier per k-step, the pipeline fill (the copy latency of
the first stage), the copy latency the S - 1 steps ahead do not cover, and the epilogue (WMMA:
each accumulator fragment goes through shared memory between two barriers; mma.sync / wgmma:
stored from the registers). Blocks per SM come from registers, shared memory and warps
(`occupancy`); blocks run in waves of (SMs x blocks per SM), the last wave with as many blocks
per SM as it has, on as many SMs (wave quantization: a grid of 3 blocks uses 3 SMs). The result
is floored by the HBM traffic. A split reduction (split-K: `parts` blocks per output tile, each
over its part of the reduction) writes its partial sums in place of the output, and adds a
second kernel: the launch gap of a dependent kernel plus its traffic (the partials read, the
output written) from the L2 when they fit there, else from HBM (`kernel_gap_seconds`,
`l2_capacity_bytes`).

`upper_bound_seconds` is the roofline of the emitted instruction (its rate x the busy share of
the last wave, or HBM): no kernel issuing that instruction can be faster, so a rate computed
from it is an upper bound, labelled so.

Every rate is machine data: [peaks], the primitive's macs_per_cycle, [params] instruction_rate,
l2_bytes_per_s, l2_sm_bytes_per_cycle, overlap_stall_share, barrier_cycles, the occupancy limits, and
the movers' latencies (tensorcore-*.toml).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import TAMError
from ...model import Program, register_program
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


def tile_of(schedule, instruction: str) -> Tile:
    """The block and warp tile of a recorded schedule (from its loop nest: the loops inside the
    one bound to blocks make a block's tile, those inside the warp loop a warp's; the loops
    bound to blocks and warps make the launch), issuing `instruction`."""
    s, op = schedule, schedule.op
    ext = s.padded_extents()
    core = _parallel_index(s, "core")
    sub = _parallel_index(s, "subcore")
    block = _extents_inside(s, core)
    warp = _extents_inside(s, sub) if sub is not None else block
    staged = [st.at for st in s.stages if st.level.role == "scratchpad"]
    pipelined = next((lp for lp in s.loops if lp.stages > 1), None)
    step_at = pipelined or (staged[0] if staged else None)
    # A split reduction's part per block (split_reduction: each block sums one part).
    k_total = math.prod(ext[a] for a in ext if s.role_of(a) == "k") // s.split_parts
    if step_at is not None:
        inside = s.loops.index(step_at) + 1
        k_step = math.prod(lp.extent for lp in s.loops[inside:]
                           for a in lp.axes[:1] if s.role_of(a) == "k")
    else:
        k_step = k_total
    rows = ("m", "b")
    return Tile(
        block_m=math.prod(v for a, v in block.items() if s.role_of(a) in rows),
        block_n=math.prod(v for a, v in block.items() if s.role_of(a) == "n"),
        block_k=k_step, k_steps=max(k_total // max(k_step, 1), 1),
        warps=_parallel_extent(s, "subcore"),
        warp_m=math.prod(v for a, v in warp.items() if s.role_of(a) in rows),
        warp_n=math.prod(v for a, v in warp.items() if s.role_of(a) == "n"),
        stages=pipelined.stages if pipelined else 1, blocks=_parallel_extent(s, "core"),
        in_bytes=dtype_bytes(op.dtype), acc_bytes=dtype_bytes(op.acc_dtype),
        instruction=instruction)


def _parallel_extent(s, role: str) -> int:
    """Instances of the loops spread over compute level `role` (blocks, warps per block)."""
    return math.prod(lp.extent for lp in s.loops if lp.parallel
                     and s.machine.compute_level(lp.parallel).role == role)


def planned_instruction(machine, op) -> str:
    """The Tensor Core instruction the lowering emits for `op` on `machine` (before it runs):
    ldmatrix + mma.sync where the machine asks for it (`mma_sync`) for the GEMM family,
    warp-level WMMA otherwise (conv2d's window tile, machines without the parameter)."""
    if (machine.params.mma_sync and op.name != "conv2d"
            and op.dtype in ("float16", "bfloat16", "int8")):
        return "mma_sync"
    return "wmma"


# Registers a thread needs besides its fragments (addresses, loop counters, the swizzle's
# offsets), fitted on ptxas -v of the default suite for sm_80 (32..64-square warp tiles).
REGISTER_OVERHEAD = 56


def registers(tile: Tile, k_slice: int = 16) -> int:
    """32-bit registers per thread, modelled: the warp's accumulator tile, its A and B
    fragments for one `k_slice`-deep step, and `REGISTER_OVERHEAD` (ptxas gives the real count
    once the kernel is compiled)."""
    t = tile
    frag = (t.warp_m * t.warp_n * t.acc_bytes
            + (t.warp_m + t.warp_n) * k_slice * t.in_bytes) / 4 / 32
    return math.ceil(frag) + REGISTER_OVERHEAD


STATIC_SHARED_MAX = 48 * 1024  # static __shared__ arrays of one kernel (CUDA's limit)


def epilogue_shared_bytes(tile: Tile) -> int:
    """The WMMA epilogue's static shared tile: one 16 x 16 fragment per warp, but s_tir sizes
    the buffer over every warp's position in the block (warp offsets plus one fragment, per
    axis)."""
    if tile.instruction != "wmma":
        return 0
    rows = tile.block_m - tile.warp_m + 16
    cols = tile.block_n - tile.warp_n + 16
    return int(rows * cols * tile.acc_bytes)


def row_padding(machine, op, operand: str, row: int) -> int:
    """Bytes the lowering adds to each `row`-element row of an operand's shared tile: 16 for
    the 8-bit tiles ldmatrix reads (A; B given as [N, K]) in rows of a power of two of 128
    bytes or more, so that the 8 rows of one ldmatrix fall in 8 different bank groups (TVM's
    swizzle pass does not take 8-bit tiles)."""
    if (planned_instruction(machine, op) != "mma_sync" or dtype_bytes(op.dtype) != 1
            or (operand == "B" and not op.params.get("transpose_b"))):
        return 0
    return 16 if row >= 128 and row & (row - 1) == 0 else 0


def shared_bytes(schedule, tile: Tile) -> int:
    """Shared memory of a block: every staged A / B tile (with its rows' padding) times its
    pipeline's buffers, and for WMMA the accumulator tile its epilogue goes through."""
    s = schedule
    staged = sum((st.bytes + st.elements // tile.block_k
                  * row_padding(s.machine, s.op, st.operand, tile.block_k)) * st.at.stages
                 for st in s.stages if st.level.role == "scratchpad")
    return int(staged + epilogue_shared_bytes(tile))


@dataclass(frozen=True)
class Occupancy:
    """Blocks resident on one SM and what bounds them."""

    threads: int
    registers: int
    registers_from: str  # "ptxas" or "model"
    shared_bytes: int
    blocks_per_sm: int
    limited_by: str  # "registers", "shared memory" or "warps"
    max_warps: int

    @property
    def fraction(self) -> float:
        """Resident warps over the SM's maximum."""
        return self.blocks_per_sm * self.threads / 32 / self.max_warps


def occupancy(machine, threads: int, regs: int, smem: int, regs_from: str) -> Occupancy:
    """Blocks per SM allowed by registers (allocated 8 per thread at a time, 255 at most),
    shared memory (each block also reserves 1 KiB) and warps; at least one (a block that does
    not fit at all is refused before: codegen.check_fits, `check`)."""
    p = machine.params
    alloc = min(math.ceil(regs / 8) * 8, int(p.max_registers_per_thread))
    by = {"registers": int(p.registers_per_sm) // max(alloc * threads, 1),
          "shared memory": int(p.smem_bytes_per_sm) // (smem + 1024),
          "warps": int(p.max_warps_per_sm) // max(threads // 32, 1)}
    limit = min(by, key=by.get)
    return Occupancy(threads, regs, regs_from, smem, max(by[limit], 1), limit,
                     int(p.max_warps_per_sm))


def hbm_bytes(schedule, resident: int) -> int:
    """HBM traffic of a launch whose blocks run in waves of `resident` (SMs x blocks per SM)
    in launch order: the L2 cache lets a wave read each A row panel and B column panel it
    touches once; the output is written once (a split reduction's GEMM kernel: its partial
    sums, `partial_bytes`)."""
    s, op = schedule, schedule.op
    ext = s.padded_extents()
    block = _extents_inside(s, _parallel_index(s, "core"))
    cols = math.prod(ext[a] // block[a] for a in ext if s.role_of(a) == "n")
    rows = math.prod(ext[a] // block[a] for a in ext if s.role_of(a) in ("m", "b"))
    a, b = (op.footprint(x, ext) * dtype_bytes(op.input(x).dtype) for x in ("A", "B"))
    # A split reduction's GEMM kernel writes partial sums; its second kernel does the rest.
    out = partial_bytes(s) if s.split_parts > 1 else output_bytes(s)
    # A split reduction's blocks are launched part by part (its loop is outermost in the
    # grid): a wave reads a part of the row and column panels of as many tiles.
    waves = math.ceil(s.split_parts * rows * cols / resident)
    per_wave = (min(rows, math.ceil(resident / cols)) * a / rows
                + min(cols, resident) * b / cols) / s.split_parts
    return int(max(a + b, min(a * cols + b * rows, waves * per_wave)) + out)


def partial_bytes(schedule) -> int:
    """A split reduction's partial sums: parts x the padded output, in the accumulator's
    dtype (0 without a split)."""
    s = schedule
    if s.split_parts == 1:
        return 0
    return s.split_parts * s.op.footprint("C", s.padded_extents()) * dtype_bytes(s.op.acc_dtype)


def output_bytes(schedule) -> int:
    """The padded output written, and the epilogue's other inputs (a bias) read."""
    op = schedule.op
    return (op.footprint("C", schedule.padded_extents()) * dtype_bytes(op.out_dtype)
            + sum(math.prod(t.shape) * dtype_bytes(t.dtype) for t in op.inputs
                  if t.role not in ("A", "B")))


def sum_bytes(schedule) -> int:
    """What the second kernel of a split reduction moves: it reads the partial sums and the
    epilogue's other inputs (a bias), and writes the output (0 without a split)."""
    return partial_bytes(schedule) + output_bytes(schedule) if schedule.split_parts > 1 else 0


def price(schedule, instruction: str | None = None, regs: int | None = None,
          smem: int | None = None) -> tuple[Model, Occupancy]:
    """The model of the kernel `schedule` lowers to, with its occupancy: from the schedule
    alone (the knob search prices every candidate so), or with what the compiled kernel
    reports (its instruction, ptxas' registers, its shared memory)."""
    s, m = schedule, schedule.machine
    t = tile_of(s, instruction or planned_instruction(m, s.op))
    k_slice = 32 if t.instruction == "mma_sync" and s.op.dtype == "int8" else 16
    occ = occupancy(m, 32 * t.warps, regs if regs is not None else registers(t, k_slice),
                    smem if smem is not None else shared_bytes(s, t),
                    "ptxas" if regs is not None else "model")
    padded = 2.0 * math.prod(s.padded_extents().values())
    hbm = hbm_bytes(s, occ.blocks_per_sm * m.cores())
    return model(m, t, 2.0 * s.op.macs, padded, occ.blocks_per_sm, hbm, s.op.dtype,
                 parts=s.split_parts, sum_bytes=sum_bytes(s)), occ


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
    # A split reduction: partial sums per output, and the second kernel that adds them (its
    # launch gap, and its traffic at the rate of where the partials are).
    parts: int = 1
    sum_gap_seconds: float = 0.0
    sum_traffic_seconds: float = 0.0
    kind: str = "model"

    @property
    def sum_seconds(self) -> float:
        return self.sum_gap_seconds + self.sum_traffic_seconds

    @property
    def seconds(self) -> float:
        return max(self.cycles / self.clock_hz, self.hbm_seconds) + self.sum_seconds

    @property
    def limiter(self) -> str:
        """What bounds the GEMM kernel (a split reduction's sum kernel is added to it)."""
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
        """The emitted instruction's roofline: nothing issuing it can be faster (with a split
        reduction, nor without moving its partial sums once more)."""
        rate = self.peak * self.instruction_rate * self.wave_efficiency
        return max(self.padded_flops / rate, self.hbm_seconds) + self.sum_traffic_seconds

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
            f"  {self.blocks_per_sm} block(s)/SM, {self.waves:.2f} waves on {self.sms} SMs"]
            + ([f"  split reduction: {self.parts} partial sums per output, added by a second "
                f"kernel: {self.sum_seconds * 1e6:.2f} us ({self.sum_gap_seconds * 1e6:.2f} "
                f"launch gap + {self.sum_traffic_seconds * 1e6:.2f} traffic)"]
               if self.parts > 1 else []))


@dataclass(frozen=True)
class _SMRates:
    """What a block of a kernel is timed with on one SM (from the machine file): the
    primitive's MACs per cycle at `irate` of them for the tile's instruction, shared memory
    and L2 bytes per cycle, barrier and latency cycles."""

    sms: int
    macs_per_cycle: float
    irate: float
    smem_bw: float
    l2_port: float
    l2_total: float
    barrier: float
    stall: float
    copy_latency: float
    frag_latency: float

    def l2_per_sm(self, active: int) -> float:
        """The L2 serves the SMs that have blocks; each at most at its own port's rate."""
        return min(self.l2_port, self.l2_total / max(min(active, self.sms), 1))


def _sm_rates(machine, tile: Tile, dtype: str) -> _SMRates:
    p = machine.params
    rates = p.instruction_rate
    if tile.instruction not in rates:
        raise TAMError(f"{machine.name}: [params.instruction_rate] has no rate for "
                       f"{tile.instruction!r}")
    return _SMRates(sms=machine.cores(), macs_per_cycle=machine.primitive(dtype).macs_per_cycle,
                    irate=float(rates[tile.instruction]),
                    smem_bw=machine.levels("scratchpad")[0].bandwidth,
                    l2_port=float(p.l2_sm_bytes_per_cycle),
                    l2_total=float(p.l2_bytes_per_s) / machine.clock_hz,
                    barrier=float(p.barrier_cycles), stall=float(p.overlap_stall_share),
                    copy_latency=next((mv.latency for mv in machine.movers
                                       if mv.dst == "smem"), 0),
                    frag_latency=next((mv.latency for mv in machine.movers
                                       if mv.src == "smem"), 0))


def _wave_cycles(r: _SMRates, t: Tile, per_sm: int, active: int) -> tuple[float, dict, dict]:
    """One wave: `per_sm` blocks of tile `t` on each of `active` SMs: (cycles, per k-step
    cycles of each path, exposed cycles per block)."""
    step_bytes = (t.block_m + t.block_n) * t.block_k * t.in_bytes
    fragment_reads = t.warps * (t.warp_m + t.warp_n) * t.block_k * t.in_bytes
    c_tile = t.block_m * t.block_n * t.acc_bytes
    fragments = (t.warp_m // 16) * (t.warp_n // 16)
    l2 = r.l2_per_sm(active)
    if t.instruction == "wmma":  # each fragment through shared memory, between 2 barriers
        epilogue = 2 * fragments * r.barrier + 2 * c_tile / r.smem_bw + c_tile / l2
    else:  # straight from the registers
        epilogue = c_tile / l2
    per_sub = per_sm * t.warps / SUBPARTITIONS  # warps per scheduler
    # A warp loads its fragments for a 16-deep slice, then issues the mma on them: with
    # no other warp on its scheduler, the load latency is not hidden.
    step = {"tensor": t.block_m * t.block_n * t.block_k
            / (r.macs_per_cycle * r.irate * min(1.0, per_sub))
            + t.block_k // 16 * r.frag_latency / max(1.0, per_sub),
            "shared": (step_bytes + fragment_reads) / r.smem_bw,
            "l2": step_bytes / l2}
    # The three paths overlap, but not perfectly: when the two slowest take nearly the
    # same time each waits on the other now and then (params.overlap_stall_share of the
    # shorter, growing with the balance).
    first, second = sorted(step.values())[-2:][::-1]
    step_time = first + r.stall * second ** 2 / first
    if t.stages == 1:  # unpipelined: a step's copy, then its compute
        step_time = step["l2"] + max(step["tensor"], step["shared"])
    # The copy of step i + stages - 1 is issued at step i: the block waits for what is
    # left of its latency after the stages - 1 steps in between (all of it unpipelined).
    between = (t.stages - 1) * per_sm * step_time
    exposed = {"barriers": t.k_steps * (r.barrier + r.frag_latency),
               "fill": r.copy_latency + (t.stages - 1) * step_bytes / l2,
               "copy wait": (t.k_steps - 1) * max(0.0, r.copy_latency - between),
               "epilogue": epilogue}
    # `per_sm` blocks share the SM's rates; each block's stalls are hidden by the others'
    # work, but a block never finishes before its own work plus its own stalls.
    work = per_sm * t.k_steps * step_time
    stalls = sum(exposed.values())
    total = max(work + stalls / per_sm, stalls + t.k_steps * step_time)
    return total, step, exposed


def _sum_kernel(machine, parts: int, sum_bytes: float) -> tuple[float, float]:
    """(launch gap, traffic) seconds of the second kernel of a split reduction that adds
    `parts` partial sums (`sum_bytes` moved); (0, 0) without one."""
    p = machine.params
    if parts <= 1:
        return 0.0, 0.0
    if p.kernel_gap_seconds is None:
        raise TAMError(f"{machine.name}: a split reduction's second kernel needs "
                       f"[params] kernel_gap_seconds (and l2_capacity_bytes)")
    # The partial sums were just written: read from the L2 if they fit in it.
    resident_l2 = sum_bytes <= float(p.l2_capacity_bytes)
    return (float(p.kernel_gap_seconds),
            sum_bytes / float(p.l2_bytes_per_s if resident_l2 else p.hbm_bytes_per_s))


def model(machine, tile: Tile, flops: float, padded_flops: float, blocks_per_sm: int,
          hbm_bytes: float, dtype: str, parts: int = 1, sum_bytes: float = 0.0) -> Model:
    """The modelled time of a kernel with block tile `tile` on `machine` (see the module);
    with `parts` > 1 it computes partial sums, and a second kernel that moves `sum_bytes`
    adds them."""
    r = _sm_rates(machine, tile, dtype)
    t = tile
    resident = r.sms * blocks_per_sm
    full, rest = divmod(t.blocks, resident)
    cycles, step, exposed = _wave_cycles(r, t, blocks_per_sm, r.sms)
    cycles *= full
    if rest:
        last, step_last, exposed_last = _wave_cycles(r, t, math.ceil(rest / r.sms), rest)
        cycles += last
        if not full:
            step, exposed = step_last, exposed_last
    gap, traffic = _sum_kernel(machine, parts, sum_bytes)
    return Model(machine.name, t.instruction, r.irate, machine.peak(dtype), flops, padded_flops,
                 blocks_per_sm, r.sms, t.blocks / resident, step, exposed, cycles,
                 machine.clock_hz, hbm_bytes / float(machine.params.hbm_bytes_per_s), parts,
                 gap, traffic)


def schedule_program(schedule) -> Program:
    """A schedule's price for `tsl.model.evaluate` (and so the knob search): this module's
    model of the kernel it lowers to, not the generic model of its staged tiles (which knows
    nothing of warps per scheduler, occupancy or waves)."""
    mod, occ = price(schedule)
    return Program(transfers=(), compute_cycles=mod.seconds * mod.clock_hz,
                   padded_macs=int(mod.padded_flops / 2), bound=mod.limiter,
                   notes=(f"{occ.blocks_per_sm} block(s)/SM of {occ.threads} threads, "
                          f"{occ.registers} registers ({occ.registers_from}), "
                          f"{occ.shared_bytes} B shared (limited by {occ.limited_by}); "
                          f"{mod.waves:.2f} waves",),
                   detail={"model": mod, "occupancy": occ.fraction,
                           "blocks_per_sm": occ.blocks_per_sm},
                   pipelined=any(lp.stages > 1 for lp in schedule.loops))


register_program("cuda_tensorcore", schedule_program)
