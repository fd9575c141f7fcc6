"""VTA task-level pipeline and cycle model.

Three modules (load, compute, store) each run their own instructions in program order and talk
through four dependency-token FIFOs (l2g, g2l, g2s, s2g), docs/vta.md §4. `run_pipeline` plays
that protocol: an instruction issues once every queue it pops is non-empty, and pushes when it
completes. The same loop drives the functional simulator (through `execute`) and, without it,
serves as a data-free cycle estimate for schedule tuning.

Cycle-model assumptions (a model, not RTL; docs/vta.md §5 gives the hardware facts):
- Each module has its own clock. An instruction starts at max(time its module is free, time
  each popped token was pushed); it pushes its tokens when it completes.
- GEMM and ALU: pipeline_fill + iter_out * iter_in * (uop_end - uop_bgn) * II cycles
  (gemm_ii, alu_ii); a GEMM reset uop costs the same as a multiply uop.
- LOAD and STORE: one DMA burst per row, each row costs dma_latency + ceil(row_bytes / bw)
  cycles with bw = min(bus_bytes, dram_bytes_per_cycle); rows are not overlapped (VTA's
  load/store engines issue one row copy after another). Padding entries are written on chip
  at one entry per cycle. A dependency-only LOAD/STORE (x_size 0) and FINISH take 1 cycle.
- Command and token FIFOs are unbounded, so fetch never stalls on a full command queue and the
  model never deadlocks for lack of FIFO space (the Xilinx design holds 512 commands and
  1024 tokens; the behavioural model 8).
- Total cycles = completion of FINISH. FINISH is strict (docs/vta.md §3): the host reads DRAM
  as soon as it executes, so every instruction of every module must happen before it through
  program order and tokens (`run_pipeline` refuses a program where one does not), and FINISH is
  therefore the last instruction to complete.
- GEMM uops are issued without stalls: the codegen orders them so that no uop writes an ACC
  entry one of the two previous uops of the same instruction wrote (the accumulator hazard of
  docs/vta.md §4), and the simulator refuses a program that breaks that rule, so there are no
  hazard stalls to price. The pipeline drains between instructions (pipeline_fill each).
- DRAM is not a shared resource between modules: concurrent load and store DMAs do not slow
  each other down.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from tsl.backends.vta.config import VTAConfig
from tsl.backends.vta.isa import Alu, Finish, Gemm, Load, Mem, Store, elem_bytes, format_insn
from tsl.errors import LoweringError

MODULES = ("load", "compute", "store")

# module -> dependency flag -> token queue (docs/vta.md §4)
DEP_QUEUES = {
    "load": {"pop_next": "g2l", "push_next": "l2g"},
    "compute": {"pop_prev": "l2g", "pop_next": "s2g", "push_prev": "g2l", "push_next": "g2s"},
    "store": {"pop_prev": "g2s", "push_prev": "s2g"},
}
QUEUES = ("l2g", "g2l", "g2s", "s2g")


def module_of(insn) -> str:
    if isinstance(insn, Load):
        return "load" if insn.mem in (Mem.INP, Mem.WGT) else "compute"
    if isinstance(insn, Store):
        return "store"
    if isinstance(insn, (Gemm, Alu, Finish)):
        return "compute"
    raise LoweringError(f"{insn!r} is not a VTA instruction")


def n_uop_execs(insn) -> int:
    """Uop executions of a GEMM/ALU instruction: the trip count of its loop nest."""
    return insn.iter_out * insn.iter_in * max(insn.uop_end - insn.uop_bgn, 0)


def insn_cycles(insn, config: VTAConfig) -> int:
    if isinstance(insn, Gemm):
        return config.pipeline_fill + n_uop_execs(insn) * config.gemm_ii
    if isinstance(insn, Alu):
        return config.pipeline_fill + n_uop_execs(insn) * config.alu_ii
    if isinstance(insn, (Load, Store)):
        if insn.x_size == 0:
            return 1
        bw = min(config.bus_bytes, config.dram_bytes_per_cycle)
        row = config.dma_latency + math.ceil(insn.x_size * elem_bytes(insn.mem, config) / bw)
        entries = ((insn.y_pad0 + insn.y_size + insn.y_pad1)
                   * (insn.x_pad0 + insn.x_size + insn.x_pad1))
        return max(1, insn.y_size * row + entries - insn.y_size * insn.x_size)
    return 1


@dataclass
class Stats:
    """Counters of one run. bytes_read / bytes_written are DRAM traffic per memory type
    (Mem names); busy is the cycles each module spent executing (not waiting)."""
    cycles: int = 0
    busy: dict = field(default_factory=lambda: dict.fromkeys(MODULES, 0))
    gemm_uops: int = 0  # multiply-accumulate uop executions (reset uops not included)
    reset_uops: int = 0
    alu_uops: int = 0
    macs: int = 0
    bytes_read: dict = field(default_factory=lambda: dict.fromkeys((m.name for m in Mem), 0))
    bytes_written: dict = field(default_factory=lambda: dict.fromkeys((m.name for m in Mem), 0))
    insn_counts: dict = field(default_factory=dict)
    clock_hz: float = 100e6

    @property
    def seconds(self) -> float:
        return self.cycles / self.clock_hz

    def summary(self) -> str:
        c = max(self.cycles, 1)
        lines = [f"cycles {self.cycles} ({self.seconds * 1e6:.1f} us at "
                 f"{self.clock_hz / 1e6:g} MHz)",
                 "busy " + ", ".join(f"{m} {b} ({100 * b / c:.0f}%)"
                                     for m, b in self.busy.items()),
                 f"uops gemm {self.gemm_uops} reset {self.reset_uops} alu {self.alu_uops}; "
                 f"MACs {self.macs} ({self.macs / c:.1f}/cycle)",
                 "DRAM read " + ", ".join(f"{k} {v}" for k, v in self.bytes_read.items() if v)
                 + "; written " + ", ".join(f"{k} {v}" for k, v in self.bytes_written.items()
                                            if v),
                 "insns " + ", ".join(f"{k} {v}" for k, v in self.insn_counts.items())]
        return "\n".join(lines)


def _count(stats: Stats, insn, config: VTAConfig):
    name = type(insn).__name__.upper()
    stats.insn_counts[name] = stats.insn_counts.get(name, 0) + 1
    if isinstance(insn, Gemm):
        n = n_uop_execs(insn)
        if insn.reset:
            stats.reset_uops += n
        else:
            stats.gemm_uops += n
            stats.macs += n * config.batch * config.block_in * config.block_out
    elif isinstance(insn, Alu):
        stats.alu_uops += n_uop_execs(insn)
    elif isinstance(insn, (Load, Store)):
        nbytes = insn.y_size * insn.x_size * elem_bytes(insn.mem, config)
        table = stats.bytes_read if isinstance(insn, Load) else stats.bytes_written
        table[insn.mem.name] += nbytes


def check_structure(program: list):
    """Static rules: FINISH ends the program, nothing follows it, and every dependency flag
    names a queue that its module has."""
    if not program or not isinstance(program[-1], Finish):
        raise LoweringError("the program does not end with FINISH"
                            + (f" (last: #{len(program) - 1} {format_insn(program[-1])})"
                               if program else " (empty program)"))
    for k, insn in enumerate(program):
        if isinstance(insn, Finish) and k != len(program) - 1:
            raise LoweringError(f"instruction #{k + 1} ({format_insn(program[k + 1])}) follows "
                                f"FINISH #{k}")
        module = module_of(insn)
        for flag in insn.deps.names():
            if flag not in DEP_QUEUES[module]:
                raise LoweringError(f"instruction #{k} ({format_insn(insn)}) runs on the "
                                    f"{module} module, which has no {flag} queue")


def _check_finish(program: list, per_module: dict, k: int, vc: tuple):
    """FINISH #k with vector clock `vc` ends the run: the first instruction of each module that
    does not happen before it would still be queued or in flight when the host reads DRAM."""
    late = []
    for mi, m in enumerate(MODULES):
        if vc[mi] < len(per_module[m]):
            j = per_module[m][vc[mi]]
            late.append(f"{m} #{j} ({format_insn(program[j])})")
    if late:
        raise LoweringError(f"FINISH #{k} may execute before " + "; ".join(late)
                            + ": nothing orders it before FINISH, so the host could read DRAM "
                            "first (make FINISH pop a token the last STORE pushes, as the "
                            "classic VTA runtime does)")


def run_pipeline(program: list, config: VTAConfig, execute=None) -> Stats:
    """Play the token protocol and the cycle model over `program`.

    `execute(index, insn, vclock)` is called for every instruction in an order that respects
    the tokens; vclock[m] is how many instructions of module MODULES[m] happen before (or are)
    this one through program order and tokens, which is what a race check needs."""
    check_structure(program)
    run = _Pipeline(program, config, execute)
    progress = True
    while progress:
        progress = False
        for mi, m in enumerate(MODULES):
            while run.ptr[m] < len(run.per_module[m]) and run.issue(mi):
                progress = True
    run.check_drained()
    run.stats.cycles = run.free["compute"]  # FINISH's completion (see _check_finish)
    return run.stats


class _Pipeline:
    """Where `run_pipeline` stands: the token queues (each token its push time and the
    pusher's vector clock) and, per module, its instructions in order, the next one (`ptr`),
    when the module is free and its vector clock."""

    def __init__(self, program: list, config: VTAConfig, execute):
        self.program, self.config, self.execute = program, config, execute
        self.stats = Stats(clock_hz=config.clock_hz)
        self.per_module = {m: [] for m in MODULES}
        for k, insn in enumerate(program):
            self.per_module[module_of(insn)].append(k)
        self.queues = {q: deque() for q in QUEUES}
        self.ptr = dict.fromkeys(MODULES, 0)
        self.free = dict.fromkeys(MODULES, 0)
        self.vclock = {m: (0, 0, 0) for m in MODULES}

    def issue(self, mi: int) -> bool:
        """Issue the next instruction of module MODULES[mi] if every queue it pops holds a
        token (else False): pop, execute, time it, push."""
        m = MODULES[mi]
        k = self.per_module[m][self.ptr[m]]
        insn = self.program[k]
        dq, flags = DEP_QUEUES[m], insn.deps.names()
        pops = [dq[f] for f in flags if f.startswith("pop")]
        if any(not self.queues[q] for q in pops):
            return False
        start, vc = self.free[m], list(self.vclock[m])
        for q in pops:
            t, tvc = self.queues[q].popleft()
            start = max(start, t)
            vc = [max(a, b) for a, b in zip(vc, tvc)]
        vc[mi] = self.ptr[m] + 1
        vc = tuple(vc)
        if isinstance(insn, Finish):
            _check_finish(self.program, self.per_module, k, vc)
        if self.execute is not None:
            self.execute(k, insn, vc)
        dur = insn_cycles(insn, self.config)
        self.free[m] = start + dur
        self.stats.busy[m] += dur
        for f in flags:
            if f.startswith("push"):
                self.queues[dq[f]].append((self.free[m], vc))
        _count(self.stats, insn, self.config)
        self.vclock[m] = vc
        self.ptr[m] += 1
        return True

    def check_drained(self):
        """After the last issue: a module with instructions left waits on an empty queue
        (deadlock), or a queue still holds tokens; either is a LoweringError."""
        blocked = []
        for m in MODULES:
            if self.ptr[m] < len(self.per_module[m]):
                k = self.per_module[m][self.ptr[m]]
                insn = self.program[k]
                empty = [DEP_QUEUES[m][f] for f in insn.deps.names()
                         if f.startswith("pop") and not self.queues[DEP_QUEUES[m][f]]]
                blocked.append(f"{m} #{k} ({format_insn(insn)}) waits on empty "
                               f"{', '.join(empty)}")
        if blocked:
            raise LoweringError("deadlock: " + "; ".join(blocked))
        left = [f"{q} ({len(self.queues[q])})" for q in QUEUES if self.queues[q]]
        if left:
            raise LoweringError("tokens left in queues at the end of the program: "
                                + ", ".join(left) + "; every push needs a matching pop, or the "
                                "next program starts with stale tokens")
