"""Lowered TIR -> a VTA program (instructions, micro-op kernels, DRAM plan).

The codegen reads the scheduled TIR (see `lowering.py`) in two passes:

1. `read_tir` turns it into a tree of loops and four kinds of leaves, every buffer index an
   affine function of the loops: copies into a scratchpad (-> LOAD), `tsl_vta_reset` and
   `tsl_vta_gemm` calls (-> GEMM), and the epilogue block (-> LOAD ACC of the bias, ALU, STORE).
   A leaf owns the chain of loops that hold only it; the other loops are walked.
2. `emit` walks the tree with concrete loop values. A leaf instance becomes instructions: its
   own loops are folded into a GEMM/ALU loop nest (the two outermost become iter_out/iter_in,
   the rest a uop kernel) or into 2-D DMAs. Tiles sit in scratchpad slots: one per virtual
   thread and per pipeline stage, so thread t's loads overlap thread t'-s compute and the
   loads of step i+1 overlap the compute of step i. Virtual threads are interleaved leaf by leaf
   (each leaf is emitted for every thread before the next one), as TVM's virtual-thread
   injection does, except that a thread's accumulator reset waits until its first GEMM and
   the copies of one step are issued thread by thread (the first thread's tiles first). A
   region that several threads need at once is loaded once, into one thread's slot, and read
   by all of them (`share_tiles`).
   An input tile holds only the rows the GEMMs read (every stride-th row of a strided 1x1
   window, loaded at a multiple of the row pitch), and a LOAD of the region a buffer already
   holds is skipped (a weight tile staged under the output row loop is loaded once).
   Micro-op kernels are loaded by one LOAD UOP per fill of the UOP buffer
   (`_batch_uop_loads`), not one per kernel as TVM's runtime (and the classic program) does.

Dependency tokens are then derived from what each instruction reads and writes in the
scratchpads (`add_tokens`): a read after a write, or a write after a read, that crosses modules
becomes a token, keeping only the ones not implied by program order within a module.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from ...errors import LoweringError, ScheduleError, TAMError
from .config import VTAConfig
from .isa import (Alu, AluOp, Deps, Finish, Gemm, Load, Mem, Store, encode, encode_uops,
                  format_insn, to_words)
from .intrinsics import GEMM_EXTERN, RESET_EXTERN
from .lowering import STAGES, VTHREADS
from .timing import insn_cycles, module_of

ENTRY_DIMS = {"inp": 1, "wgt": 2, "acc": 1}  # trailing buffer dims that make one entry
MEM_OF = {"inp": Mem.INP, "wgt": Mem.WGT, "acc": Mem.ACC}
ITER_MAX = (1 << 14) - 1
DONE = [("done", 0, 1)]  # a pseudo scratchpad: STOREs write it, FINISH reads it
HAZARD_DISTANCE = 2  # a GEMM uop may not write an ACC entry one of the 2 uops before it wrote
DRAM_ALIGN = 4096  # every kernel argument starts on this byte boundary (a multiple of any entry)


def machine_config(machine) -> VTAConfig:
    """The VTA hardware configuration a TAM describes: shapes from the GEMM primitive, buffer
    sizes from its three levels (capacity per virtual thread x threads), the cycle model from
    [params]."""
    p = machine.primitives[0]
    threads = machine.cores()

    def log2(v, what):
        if v <= 0 or v & (v - 1):
            raise TAMError(f"{machine.source or machine.name}: {what} = {v} is not a power of "
                           "two, as VTA's buffers and blocks must be")
        return v.bit_length() - 1

    def buf(level):
        lv = machine.memory_level(level)
        return log2(lv.capacity * (threads if lv.per else 1), f"{level} buffer bytes")

    bits = {"int8": 3, "int32": 5}
    try:
        return VTAConfig.from_params(dict(
            log_batch=log2(p.m, "primitive m"), log_block_in=log2(p.k, "primitive k"),
            log_block_out=log2(p.n, "primitive n"), log_inp_width=bits[p.a_dtype],
            log_wgt_width=bits[p.b_dtype], log_acc_width=bits[p.acc_dtype],
            log_inp_buff_size=buf(p.a_level), log_wgt_buff_size=buf(p.b_level),
            log_acc_buff_size=buf(p.c_level), clock_hz=machine.clock_hz, **machine.params.vta_config()))
    except (KeyError, ValueError, TypeError) as e:
        raise TAMError(f"{machine.source or machine.name}: not a VTA configuration: {e}") from None


# -- affine index forms ------------------------------------------------------------------------
class Aff:
    """const + sum(coef * loop) over `LoopNode`s."""

    __slots__ = ("const", "terms")

    def __init__(self, const=0, terms=None):
        self.const = const
        self.terms = {k: v for k, v in (terms or {}).items() if v}

    def __add__(self, o):
        t = dict(self.terms)
        for k, v in o.terms.items():
            t[k] = t.get(k, 0) + v
        return Aff(self.const + o.const, t)

    def scale(self, c):
        return Aff(self.const * c, {k: v * c for k, v in self.terms.items()})

    def at(self, env, zero=()) -> int:
        """Value with loops in `env` set, loops in `zero` (and any other) at 0."""
        return self.const + sum(c * (l.at(env, zero) if isinstance(l, Opaque) else env.get(l, 0))
                                for l, c in self.terms.items() if l not in zero)

    def loops(self, env=()):
        """The terms over loops (not in `env`) that the instruction's loops walk."""
        return {l: v for l, v in self.terms.items() if isinstance(l, LoopNode) and l not in env}

    def span(self, loops) -> int:
        """1 + the largest offset the given loops add (coefficients are non-negative)."""
        return 1 + sum(self.terms.get(l, 0) * (l.extent - 1) for l in loops)


@dataclass(eq=False)
class Opaque:
    """floor(arg / c) or arg mod c of loops that are walked (given values) before use: a fused
    loop's parts, for instance. It must not involve a leaf's own loops."""

    arg: Aff
    c: int
    mod: bool

    def at(self, env, zero=()) -> int:
        if any(l in zero for l in self.arg.terms):
            raise LoweringError("a scratchpad address divides a loop that VTA has to iterate")
        v = self.arg.at(env)
        return v % self.c if self.mod else v // self.c


def affine(e, env) -> Aff:
    from tvm import tirx

    if isinstance(e, tirx.IntImm):
        return Aff(int(e.value))
    if isinstance(e, tirx.Var):
        if e not in env:
            raise LoweringError(f"index uses {e.name}, which is no loop of the kernel")
        return env[e]
    if isinstance(e, (tirx.Add, tirx.Sub)):
        b = affine(e.b, env)
        return affine(e.a, env) + (b if isinstance(e, tirx.Add) else b.scale(-1))
    if isinstance(e, tirx.Mul):
        a, b = affine(e.a, env), affine(e.b, env)
        if a.terms and b.terms:
            raise LoweringError(f"index {e} is not affine")
        return a.scale(b.const) if not b.terms else b.scale(a.const)
    if isinstance(e, (tirx.FloorDiv, tirx.FloorMod)) and isinstance(e.b, tirx.IntImm):
        # Exact when the part whose coefficients c does not divide stays in [0, c).
        a, c = affine(e.a, env), int(e.b.value)
        q = {l: v // c for l, v in a.terms.items() if v % c == 0}
        rest = Aff(a.const % c, {l: v for l, v in a.terms.items() if v % c})
        lo = rest.const + sum(min(0, v * (l.extent - 1)) for l, v in rest.terms.items())
        hi = rest.const + sum(max(0, v * (l.extent - 1)) for l, v in rest.terms.items())
        if 0 <= lo and hi < c:
            return Aff(a.const // c, q) if isinstance(e, tirx.FloorDiv) else rest
        return Aff(0, {Opaque(a, c, isinstance(e, tirx.FloorMod)): 1})
    raise LoweringError(f"index {e} is not affine in the loops; VTA addresses must be")


# -- the tree read from the TIR ----------------------------------------------------------------
@dataclass(eq=False)
class LoopNode:
    name: str
    extent: int
    vthreads: int = 1  # > 1: that many consecutive iterations are virtual threads
    stages: int = 1
    children: list = field(default_factory=list)

    def __repr__(self):
        return f"Loop({self.name}, {self.extent})"


@dataclass(eq=False)
class Leaf:
    kind: str  # "copy" | "reset" | "gemm" | "epilogue"
    access: dict  # role -> (buffer, [Aff per dim]); roles: dst, src, acc, inp, wgt, out, bias
    chain: list = field(default_factory=list)  # the loops that hold only this leaf, outer first
    stages: int = 1  # pipeline depth of the innermost enclosing annotated loop


@dataclass
class Kernel:
    root: LoopNode
    pads: dict  # stage buffer -> (buffer with the DRAM shape, DRAM argument, offset per dim)
    buffers: dict  # name -> every buffer the kernel touches


def read_tir(func) -> Kernel:
    """The loop/leaf tree of a scheduled PrimFunc (see the module docstring)."""
    reader = _TirReader()
    root = LoopNode("root", 1)
    reader.visit(func.body, root, {}, 1)
    _set_chains(root)
    return Kernel(root, reader.pads, {b.name: b for b in reader.seen.values()})


def _scope(buf) -> str:
    return buf.scope().split(".")[-1]


class _TirReader:
    """`read_tir`'s walk: the stages it replaces by DMA padding or by the argument itself
    (`pads`, as `Kernel.pads`) and every buffer the body touches (`seen`: data Var ->
    Buffer)."""

    def __init__(self):
        self.pads, self.seen = {}, {}

    def visit(self, stmt, parent, env, stages):
        from tvm import s_tir, tirx

        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                self.visit(s, parent, env, stages)
        elif isinstance(stmt, tirx.For):
            lp = LoopNode(stmt.loop_var.name, int(stmt.extent),
                          vthreads=int(stmt.annotations.get(VTHREADS, 1)),
                          stages=int(stmt.annotations.get(STAGES, 1)))
            parent.children.append(lp)
            self.visit(stmt.body, lp, {**env, stmt.loop_var: Aff(0, {lp: 1})},
                       lp.stages if STAGES in stmt.annotations else stages)
        elif isinstance(stmt, s_tir.SBlockRealize):
            blk = stmt.block
            inner = {**env, **{iv.var: affine(v, env)
                               for iv, v in zip(blk.iter_vars, stmt.iter_values)}}
            if not isinstance(blk.body, (tirx.BufferStore, tirx.Evaluate)):
                self.visit(blk.body, parent, inner, stages)  # the root block
                return
            leaf = self.block_leaf(blk, inner)
            if leaf is not None:
                leaf.stages = stages
                parent.children.append(leaf)
        else:
            raise LoweringError(f"the VTA codegen cannot lower this statement:\n{stmt}")

    def block_leaf(self, blk, env):
        """The leaf of a block (None: a stage `pads` now stands for)."""
        from tvm import tirx

        if isinstance(blk.body, tirx.BufferStore):
            return self._store_leaf(blk, env)
        leaf = self._call_leaf(blk, env)
        if leaf is None:
            raise LoweringError(f"the VTA codegen does not know block {blk.name_hint!r}")
        return leaf

    def _regions(self, block, env):
        for mb in block.match_buffers:
            self.seen[mb.source.source.data] = mb.source.source
        return {mb.source.source: [affine(r.min, env) for r in mb.source.region]
                for mb in block.match_buffers}

    def _call_leaf(self, blk, env):
        """The reset or GEMM leaf of an intrinsic call (None: another call)."""
        call = blk.body.value
        name = call.args[0].value if call.args else ""
        by_scope = {_scope(b): (b, idx) for b, idx in self._regions(blk, env).items()}
        if name == RESET_EXTERN:
            return Leaf("reset", {"acc": by_scope["acc"]})
        if name == GEMM_EXTERN:
            return Leaf("gemm", {k: by_scope[k] for k in ("acc", "inp", "wgt")})
        return None

    def _store_leaf(self, blk, env):
        """The copy or epilogue leaf of a BufferStore block; None for a padding or layout
        stage (recorded in `pads`); LoweringError for a block the codegen does not know."""
        from tvm import ir

        body = blk.body
        dst = body.buffer
        loads = []
        _walk_loads(body.value, loads)
        for b in [dst] + [l.source for l in loads]:
            self.seen[b.data] = b
        if self._stage(blk, loads):
            return None
        idx = [affine(i, env) for i in body.indices]
        if _scope(dst) in ENTRY_DIMS and isinstance(body.value, ir.TensorLoad):
            src = body.value.source
            return Leaf("copy", {"dst": (dst, idx),
                                 "src": (src, [affine(i, env) for i in body.value.indices])})
        accs = [l for l in loads if _scope(l.source) == "acc"]
        if accs and dst.scope() == "global":
            acc = accs[0]
            access = {"out": (dst, idx),
                      "acc": (acc.source, [affine(i, env) for i in acc.indices])}
            for l in loads:
                # The bias is a channel vector; the residual has the output's dims.
                if _scope(l.source) != "acc":
                    role = "bias" if len(l.indices) == 1 else "residual"
                    access[role] = (l.source, [affine(i, env) for i in l.indices])
            return Leaf("epilogue", access)
        if blk.name_hint == "out" and not loads:
            raise LoweringError(f"the epilogue makes every output the constant {body.value} "
                                "(TVM folded it: clip bounds that leave one value), so the "
                                "output does not depend on the accumulator; VTA stores "
                                "accumulator tiles only. Use clip bounds lo < hi")
        raise LoweringError(f"the VTA codegen does not know block {blk.name_hint!r}")

    def _stage(self, blk, loads) -> bool:
        """Whether the block is a padding or layout stage, recorded in `pads` (the codegen
        reads its source with DMA padding, or the argument as it is)."""
        from tvm import ir, tirx

        body = blk.body
        dst = body.buffer
        if isinstance(body.value, ir.Call) and body.value.op.name.endswith("if_then_else"):
            # A zero-padding stage: the codegen reads its source with DMA padding, at the
            # constant offset between the two.
            from tvm.sym import Analyzer

            (src,) = loads
            offs = [Analyzer().simplify(a - b) for a, b in zip(src.indices, body.indices)]
            if not all(isinstance(o, tirx.IntImm) for o in offs):
                raise LoweringError(f"padding stage {blk.name_hint} is not a shift")
            self.pads[dst] = (src.source, src.source.name, [int(o.value) for o in offs])
            return True
        if (dst.scope() == "global" and isinstance(body.value, ir.TensorLoad)
                and len(body.indices) != len(body.value.indices)):
            # A layout stage (s_tir keeps an argument and copies it into the new layout
            # when it cannot rewrite it in place): the artifact already passes the argument
            # in that layout, so the stage is the argument itself.
            self.pads[dst] = (dst, body.value.source.name, [0] * len(body.indices))
            return True
        return False


def _walk_loads(e, out):
    import tvm_ffi
    from tvm import ir

    tvm_ffi.structural_walk(e, [(ir.TensorLoad, lambda n: out.append(n))], order="pre")


def _set_chains(node, chain=()):
    for ch in node.children:
        if isinstance(ch, Leaf):
            ch.chain = list(chain)
        else:
            own = ch.vthreads == 1 and _single_path(ch)
            _set_chains(ch, (chain + (ch,)) if own else ())


def _single_path(lp) -> bool:
    while isinstance(lp, LoopNode):
        if len(lp.children) != 1:
            return False
        lp = lp.children[0]
    return True


# -- the program --------------------------------------------------------------------------------
@dataclass
class Program:
    """A VTA program: instructions, the uop segment that LOAD UOP reads (indexed by its
    dram_base), and where each kernel argument lives in DRAM (byte address, bytes)."""

    insns: list
    uops: np.ndarray  # uint32 uop words
    dram: dict  # buffer name -> (byte address, bytes)
    config: VTAConfig

    def __str__(self) -> str:
        width = len(str(len(self.insns)))
        return "\n".join(f"{k:>{width}}  {format_insn(i)}" for k, i in enumerate(self.insns))

    def words(self) -> np.ndarray:
        """The instructions as 128-bit words: an (n, 2) uint64 array of (low, high) halves."""
        return to_words(self.insns, self.config)

    def counts(self) -> dict:
        out = {}
        for i in self.insns:
            out[type(i).__name__.upper()] = out.get(type(i).__name__.upper(), 0) + 1
        return out


@dataclass
class _Insn:
    insn: object
    reads: list  # (mem name, lo, hi) scratchpad entry ranges
    writes: list


class _Layout:
    """What the kernel's tree says about its tiles, read once before anything is emitted: the
    leaf that defines each scratchpad buffer's tile and the GEMMs that read it, the virtual
    threads, the loops with no leaf below, the ACC entries each thread reserves for the bias
    and the residual, the epilogue instances a walk emits; and from these each tile's shape,
    row steps and slot addresses."""

    def __init__(self, kernel: Kernel, op, config: VTAConfig, row_pitch: bool):
        self.k, self.op, self.c, self.row_pitch = kernel, op, config, row_pitch
        self.threads = 1
        self.defining = {}  # scratchpad buffer -> the leaf that defines its tile
        self.chain_root = {}  # a leaf's outermost own loop -> the leaf
        self.readers = {}  # inp scratchpad buffer -> the GEMM leaves that read it
        self.leafless = set()  # loops with no leaf below (a padding stage the DMA replaces)
        self.bias_entries = 0
        self._steps = {}  # scratchpad buffer -> row step per tile dim (see `steps`)
        self._index(kernel.root)
        self.residual_entries = self._residual_entries()
        self.epilogues = {}  # epilogue leaf -> its instances a walk of the tree emits
        self._count_epilogues(kernel.root, 1)
        self.depth = {"inp": config.inp_depth, "wgt": config.wgt_depth, "acc": config.acc_depth}

    def _index(self, node) -> bool:
        """Index the leaves below `node`; whether there are any."""
        found = False
        for ch in node.children:
            if isinstance(ch, LoopNode):
                self.threads = max(self.threads, ch.vthreads)
                if self._index(ch):
                    found = True
                else:
                    self.leafless.add(ch)
                continue
            found = True
            if ch.chain:
                self.chain_root[ch.chain[0]] = ch
            if ch.kind == "copy":
                self.defining[ch.access["dst"][0]] = ch
            elif ch.kind == "gemm":
                self.readers.setdefault(ch.access["inp"][0], []).append(ch)
            elif ch.kind == "epilogue":
                self.defining[ch.access["acc"][0]] = ch
                if "bias" in ch.access:
                    self.bias_entries = max(self.bias_entries, self.bias_entries_of(ch))
        return found

    def _count_epilogues(self, node, n):
        """Add to `epilogues` the instances (one per loop value and thread) that walking
        `node` `n` times emits of each epilogue leaf below it (see `walk`)."""
        for ch in node.children:
            leaf = self.leaf(ch)
            if leaf is not None:
                if leaf.kind == "epilogue":
                    self.epilogues[leaf] = self.epilogues.get(leaf, 0) + n
            elif ch not in self.leafless:
                self._count_epilogues(ch, n * ch.extent)

    def _residual_entries(self) -> int:
        """ACC entries below the bias at the end of each thread's share that hold the residual
        (LOAD ACC_8BIT) for the ALU ADD of a residual step: the accumulator tile's size, or what
        the share leaves beside the tile, the bias and the hazard scratch (the residual is then
        added in pieces, `_add_residual`)."""
        tiles = [math.prod(self.tile(b)[3]) for b, l in self.defining.items()
                 if l.kind == "epilogue" and "residual" in l.access]
        if not tiles:
            return 0
        free = (self.c.acc_depth // self.threads - max(tiles) - self.bias_entries
                - HAZARD_DISTANCE)
        if free < 1:
            raise LoweringError(f"{self.op}: the accumulator tile leaves no ACC entry for the "
                                "residual; use smaller tiles")
        return min(max(tiles), free)

    def bias_entries_of(self, leaf):
        idx = leaf.access["bias"][1][0]
        return -(-idx.span(leaf.chain) // self.c.block_out)

    def tile(self, buf):
        """(leaf, entry dims, tile shape of the non-entry dims, row-major strides) of a
        scratchpad buffer."""
        leaf = self.defining.get(buf)
        if leaf is None:
            raise LoweringError(f"nothing fills scratchpad buffer {buf.name}")
        kind = buf.scope().split(".")[-1]
        e = ENTRY_DIMS[kind]
        role = "dst" if leaf.kind == "copy" else "acc"
        idx = leaf.access[role][1]
        steps = self.steps(buf)
        shape = [(a.span(leaf.chain) - 1) // g + 1 for a, g in zip(idx[:-e], steps)]
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        return leaf, role, e, shape, strides

    def steps(self, buf) -> list[int]:
        """Per tile dim of an input tile, the step g between the rows the GEMMs read: the tile
        holds every g-th row of the span its copy covers (a 1x1 stride-2 convolution reads
        every other input row), and its LOAD takes them at g times the row pitch. Only where
        the DMA can (the back end's `row_pitch`) and not for the innermost dim, which is
        each DMA row's contiguous run; 1 elsewhere."""
        if buf in self._steps:
            return self._steps[buf]
        leaf = self.defining.get(buf)
        kind = buf.scope().split(".")[-1]
        nd = len(buf.shape) - ENTRY_DIMS[kind]
        steps = [1] * nd
        if self.row_pitch and kind == "inp" and leaf is not None and leaf.kind == "copy":
            dst = leaf.access["dst"][1]
            for d in range(nd - 1):
                origin = Aff(dst[d].const, {l: v for l, v in dst[d].terms.items()
                                            if l not in leaf.chain})
                g = 0
                for reader in self.readers.get(buf, []):
                    off = reader.access["inp"][1][d] + origin.scale(-1)
                    if any(not isinstance(l, LoopNode) for l in off.terms):
                        g = 1  # a divided loop: no static step
                        break
                    g = math.gcd(g, off.const, *(v for l, v in off.terms.items()
                                                 if l.extent > 1))
                steps[d] = max(g, 1)
        self._steps[buf] = steps
        return steps

    def slot_base(self, buf, tid, slot):
        kind = buf.scope().split(".")[-1]
        leaf, _, _, shape, _ = self.tile(buf)
        entries = math.prod(shape)
        share = self.depth[kind] // self.threads
        nslots = leaf.stages if leaf.kind == "copy" else 1
        reserved = self.bias_entries + self.residual_entries if kind == "acc" else 0
        if entries * nslots + reserved > share:
            need = entries * nslots + reserved
            raise LoweringError(f"{buf.name}: {nslots} tile(s) of {entries} entries"
                                f"{' + bias / residual' if reserved else ''} "
                                f"need {need} {kind} entries, but each of {self.threads} "
                                f"virtual thread(s) has {share}; use smaller tiles")
        return tid * share + slot * entries

    def leaf(self, ch):
        """The leaf `ch` is, or the one its chain of single loops ends in (None: a loop)."""
        return ch if isinstance(ch, Leaf) else self.chain_root.get(ch)

    def copy_leaf(self, ch):
        leaf = self.leaf(ch)
        return leaf if leaf is not None and leaf.kind == "copy" else None

class _Slots:
    """Which slot of a scratchpad buffer each thread's tile is in and what each slot holds:
    a slot is (owning thread, pipeline slot); a shared tile sits in one thread's slot."""

    def __init__(self, threads: int, keep_tiles: bool, share_tiles: bool):
        self.threads, self.keep_tiles, self.share_tiles = threads, keep_tiles, share_tiles
        self.where = {}  # scratchpad buffer -> {thread: the slot its reads find the tile in}
        self.holds = {}  # (scratchpad buffer, slot) -> (source, origin) of its last LOAD
        self.shared_fills = {}  # scratchpad buffer -> shared LOADs so far (picks the owner)
        self.fill_count: dict = {}  # (scratchpad buffer, thread) -> LOADs into its slots

    def place(self, dst, region: dict, envs, stages: int) -> list:
        """Slots for the tiles of `dst` that the (thread, loop values) of `envs` need
        (`region[thread]`: what each reads); the (thread, loop values) that LOAD one, each at
        its turn. A thread whose slot already holds its region loads nothing (`keep_tiles`);
        with `share_tiles`, threads that need the same region read one copy of it, loaded at
        the turn of the first of them."""
        where = self.where.setdefault(dst, {})
        need = [tid for tid, _ in envs if not self.keep_tiles
                or self.holds.get((dst, where.get(tid))) != region[tid]]
        # Slots read by threads that keep their tile this round are not overwritten.
        busy = {slot for t, slot in where.items() if t not in need}
        loads = []
        for tid, env in envs:
            if tid not in need:
                continue
            r = region[tid]
            group = [t for t in need if region[t] == r] if self.share_tiles else [tid]
            if group[0] != tid:  # loaded at the turn of the group's first thread
                continue
            slot = self.free_slot(dst, group, busy, stages)
            busy.add(slot)
            self.holds[(dst, slot)] = r
            for t in group:
                where[t] = slot
            loads.append((tid, env))
        return loads

    def free_slot(self, dst, group, busy, stages):
        """The slot for the next LOAD of `dst` that the threads of `group` read: the owner's
        next pipeline slot, else the first slot of any thread that no thread still reads.
        A group of several threads takes its owners in turn where a thread has one slot
        (so that the next shared tile loads while this one is read); with more, the first
        thread's slots rotate as for its own tiles (fewer distinct slot addresses: fewer
        distinct micro-op kernels for the GEMMs that read them)."""
        n = 0
        if len(group) > 1 and stages == 1:
            n = self.shared_fills.get(dst, 0)
            self.shared_fills[dst] = n + 1
        owner = group[n % len(group)]
        count = self.fill_count.get((dst, owner), 0)
        order = [(owner, (count + i) % stages) for i in range(stages)]
        order += [(t, i) for t in range(self.threads) for i in range(stages)]
        slot = next((sl for sl in order if sl not in busy), None)
        if slot is None:
            raise LoweringError(f"{dst.name}: no free slot for a tile (every slot holds one "
                                "a thread still reads); use more pipeline stages")
        self.fill_count[(dst, slot[0])] = self.fill_count.get((dst, slot[0]), 0) + 1
        return slot

class _UopBuffer:
    """The micro-op kernels in the UOP buffer: the uop segment's words so far, the kernels
    the buffer holds now and where."""

    def __init__(self, config: VTAConfig):
        self.c = config
        self.words: list[np.ndarray] = []
        self.seg = 0  # uops in the segment so far (where the next kernel's LOAD reads)
        self.cache: dict = {}  # encoded kernel -> its [begin, end) in the buffer
        self.top = 0

    def place(self, uops) -> tuple[tuple[int, int], _Insn | None]:
        """[begin, end) of `uops` in the UOP buffer, and the LOAD UOP that brings them (None:
        already there); the buffer is refilled from the start when full."""
        words = encode_uops(uops, self.c)
        key = words.tobytes()
        if key in self.cache:
            return self.cache[key], None
        n = len(words)
        if self.top + n > self.c.uop_depth:
            self.cache.clear()
            self.top = 0
        self.words.append(words)
        load = _Insn(Load(Mem.UOP, self.top, self.seg, 1, n, n), [],
                     [("uop", self.top, self.top + n)])
        self.cache[key] = (self.top, self.top + n)
        self.seg += n
        self.top += n
        return self.cache[key], load


def _dram_plan(kernel: Kernel, op) -> dict:
    """Where each kernel argument lives in DRAM: buffer name -> (byte address, bytes), each on
    a DRAM_ALIGN boundary, in argument order."""
    dram, top = {}, DRAM_ALIGN
    for b in [kernel.buffers[t.name] for t in op.inputs + (op.output,)]:
        nbytes = int(np.prod([int(d) for d in b.shape])) * np.dtype(b.dtype).itemsize
        dram[b.name] = (top, nbytes)
        top = -(-(top + nbytes) // DRAM_ALIGN) * DRAM_ALIGN
    return dram


class _Emitter:
    """The walk of `emit` (module docstring): the instructions so far (`out`), with the tiles'
    layout (`_Layout`), their slots (`_Slots`) and the UOP buffer (`_UopBuffer`)."""

    def __init__(self, kernel: Kernel, op, config: VTAConfig, row_pitch: bool = False,
                 keep_tiles: bool = False, share_tiles: bool = False,
                 thread_major: bool = True, batch_uops: bool = False,
                 split_tail: bool = False):
        self.k, self.op, self.c = kernel, op, config
        self.thread_major, self.batch_uops, self.split_tail = thread_major, batch_uops, split_tail
        self.layout = _Layout(kernel, op, config, row_pitch)
        self.slots = _Slots(self.layout.threads, keep_tiles, share_tiles)
        self.uops = _UopBuffer(config)
        self.out: list[_Insn] = []
        self.dram = _dram_plan(kernel, op)
        self.pending_reset = {}  # thread -> (reset leaf, loop values) not issued yet
        self.scratch_zeroed = set()  # threads whose hazard-padding ACC entries are zeroed
        self.epilogues_left = dict(self.layout.epilogues)  # epilogue leaf -> not emitted yet

    def local(self, buf, idx, env, tid):
        """Affine form, over the leaf's own loops, of the scratchpad entry `idx` addresses."""
        leaf, role, e, shape, strides = self.layout.tile(buf)
        kind = buf.scope().split(".")[-1]
        owner, slot = (self.slots.where.get(buf, {}).get(tid, (tid, 0)) if leaf.kind == "copy"
                       else (tid, 0))
        origin = [a.at(env, leaf.chain) for a in leaf.access[role][1][:-e]]
        form = Aff(self.layout.slot_base(buf, owner, slot))
        for d, (a, g) in enumerate(zip(idx[:-e], self.layout.steps(buf))):
            loc = Aff(a.at(env) - origin[d], a.loops(env))
            if loc.const % g or any(v % g for v in loc.terms.values()):
                raise LoweringError(f"{buf.name}: an access reads a row between the rows "
                                    f"(every {g}th) the tile holds")
            form = form + Aff(loc.const // g, {l: v // g for l, v in loc.terms.items()}
                              ).scale(strides[d])
        return kind, form

    def run(self) -> Program:
        self.walk(self.k.root, [(0, {})])
        # FINISH reads what every STORE "writes": the run's results in DRAM, so that it waits
        # for the last STORE (the host reads DRAM as soon as FINISH executes).
        self.out.append(_Insn(Finish(), DONE, []))
        if self.batch_uops:
            self.out = _batch_uop_loads(self.out)
        insns = add_tokens(self.out)
        uops = (np.concatenate(self.uops.words) if self.uops.words
                else np.zeros(0, np.uint32))
        return Program(insns, uops, dict(self.dram), self.c)

    def walk(self, node, envs):
        """Emit `node`'s children for every (thread, loop values) in `envs`; leaves are emitted
        for all threads in turn, a virtual-thread loop multiplies the threads. A run of
        copies (the operand tiles of one step) is emitted thread by thread instead: the first
        thread's GEMMs need only its own tiles, which then load first (`thread_major`)."""
        children = list(node.children)
        i = 0
        while i < len(children):
            ch = children[i]
            leaf = self.layout.leaf(ch)
            if self.layout.copy_leaf(ch) is not None:
                run = []
                while i < len(children) and (copy := self.layout.copy_leaf(children[i])) is not None:
                    run.append(self.leaf_copy(copy, envs))
                    i += 1
                order = ([(t, r) for t, _ in envs for r in run] if self.thread_major
                         else [(t, r) for r in run for t, _ in envs])
                for tid, loads in order:
                    for load in loads.get(tid, ()):
                        load()
                continue
            i += 1
            if leaf is not None:
                for tid, env in envs:
                    if leaf.kind == "reset" and self.layout.threads > 1:
                        # Zeroing a thread's accumulator waits for the write-back of its last
                        # tile; issued just before the thread's first GEMM on it, the other
                        # threads' work runs meanwhile instead of that wait.
                        self.pending_reset[tid] = (leaf, env)
                        continue
                    if leaf.kind in ("gemm", "epilogue") and tid in self.pending_reset:
                        self.leaf_reset(*self.pending_reset.pop(tid), tid)
                    getattr(self, "leaf_" + leaf.kind)(leaf, env, tid)
            elif ch in self.layout.leafless:
                continue  # nothing to emit: do not walk its iterations
            elif ch.vthreads > 1:
                n = ch.vthreads
                for v in range(0, ch.extent, n):
                    self.walk(ch, [(t, {**env, ch: v + t}) for _, env in envs for t in range(n)])
            else:
                for v in range(ch.extent):
                    self.walk(ch, [(t, {**env, ch: v}) for t, env in envs])

    def leaf_copy(self, leaf, envs) -> dict:
        """The LOADs of a tile for every (thread, loop values) in `envs`, as {thread: the
        functions that emit the LOADs at its turn}; the slots are chosen now. A thread whose
        slot already holds the region loads nothing (`keep_tiles`: a tile staged under loops
        it does not depend on is loaded once per change). With `share_tiles`, threads that
        need the same region read one copy of it: one LOAD, into a slot of one of them (see
        `_Slots.place`). The tokens follow from what each instruction reads and writes
        (`add_tokens`): the next LOAD into a slot waits for every thread's last GEMM on it."""
        dst, didx = leaf.access["dst"]
        src, sidx = leaf.access["src"]
        name, offs = src.name, [0] * len(sidx)
        if src in self.k.pads:
            src, name, offs = self.k.pads[src]
        region = {tid: (name, tuple(a.at(env, leaf.chain) + o for a, o in zip(sidx, offs)))
                  for tid, env in envs}
        loads = {}
        for tid, env in self.slots.place(dst, region, envs, max(leaf.stages, 1)):
            kind, base = self.local(dst, didx, {**env, **{l: 0 for l in leaf.chain}}, tid)
            _, _, e, shape, _ = self.layout.tile(dst)
            loads.setdefault(tid, []).append(functools.partial(
                self.dma, Load, MEM_OF[kind], src, name, list(region[tid][1][:-e]), shape,
                base.const, kind, pad=bool(any(offs)), steps=self.layout.steps(dst)))
        return loads

    def dma(self, cls, mem, gbuf, name, origin, shape, sram, kind, pad, steps=None):
        """2-D DMAs between a tile (dense, row-major over `shape`) and the global buffer region
        at `origin`, the tile's dim d taking every steps[d]-th index of the buffer's: x is the
        innermost run of dims that are whole in the buffer (step 1), y the next dim (its rows
        at steps[y] times the buffer's row pitch); the remaining dims make one DMA each. Rows
        or columns outside the buffer become zero padding (loads only)."""
        gshape = [int(d) for d in gbuf.shape]
        entry = math.prod(gshape[len(shape):])
        nd = len(shape)
        steps = steps or [1] * nd
        gstr = [math.prod(gshape[d + 1:]) // entry for d in range(nd)]
        x0 = nd - 1
        if not pad:
            # Whole dims of step 1 join the run, as does the (partial) dim outside them.
            while x0 > 0 and steps[x0 - 1] == 1 and all(shape[d] == gshape[d] and steps[d] == 1
                                                         for d in range(x0, nd)):
                x0 -= 1
        ydim = x0 - 1
        xs = math.prod(shape[x0:])
        ys = shape[ydim] if ydim >= 0 else 1
        outer = range(ydim) if ydim >= 0 else range(0)
        base_addr, _ = self.dram[name]
        tstr = [math.prod(shape[d + 1:]) for d in range(nd)]
        for coords in itertools.product(*[range(shape[d]) for d in outer]):
            at = list(origin)
            for d, c in zip(outer, coords):
                at[d] += c * steps[d]
            pads = [0, 0, 0, 0]
            y_lo, y_n = (at[ydim], ys) if ydim >= 0 else (0, 1)
            x_lo, x_n = at[x0], xs
            if pad:
                for k, (lo, n, d) in enumerate(((y_lo, y_n, ydim), (x_lo, x_n, x0))):
                    if d < 0:
                        continue
                    # Rows lo + g * i, i < n: those below 0 or past the buffer are padding.
                    g = steps[d]
                    p0 = max(0, -(lo // g))
                    p1 = max(0, n - max(0, -((lo - gshape[d]) // g)))
                    pads[2 * k], pads[2 * k + 1] = p0, p1
                    if k == 0:
                        y_lo, y_n = lo + g * p0, n - p0 - p1
                    else:
                        x_lo, x_n = lo + g * p0, n - p0 - p1
                if y_n <= 0 or x_n <= 0:
                    raise LoweringError(f"a tile of {gbuf.name} lies wholly in its padding")
            for d in range(nd):
                if not 0 <= at[d] < gshape[d] and d not in (ydim, x0):
                    raise LoweringError(f"a tile of {gbuf.name} leaves the buffer in dim {d}")
            if ydim >= 0:
                at[ydim] = y_lo
            at[x0] = x_lo
            elem = sum(a * s for a, s in zip(at, gstr))
            ebytes = entry * np.dtype(gbuf.dtype).itemsize
            sram_at = sram + sum(c * tstr[d] for d, c in zip(outer, coords))
            insn = cls(mem, sram_at, base_addr // ebytes + elem, y_n, x_n,
                       gstr[ydim] * steps[ydim] if ydim >= 0 else x_n, *pads)
            rng = [(kind, sram_at, sram_at + ys * xs)]
            self.out.append(_Insn(insn, [] if cls is Load else rng, rng if cls is Load else DONE))

    def leaf_reset(self, leaf, env, tid):
        buf, idx = leaf.access["acc"]
        kind, dst = self.local(buf, idx, env, tid)
        self.loop_insn(leaf.chain, [dst, Aff(), Aff()], lambda *a: Gemm(True, *a),
                       reads=[], writes=[("acc", 0)])

    def leaf_gemm(self, leaf, env, tid):
        forms = [self.local(*leaf.access[r], env, tid)[1] for r in ("acc", "inp", "wgt")]
        self.loop_insn(leaf.chain, forms, lambda *a: Gemm(False, *a),
                       reads=[("acc", 0), ("inp", 1), ("wgt", 2)], writes=[("acc", 0)],
                       tid=tid, acc_hazard=True)

    def leaf_epilogue(self, leaf, env, tid):
        """The epilogue's ALU operations on the accumulator tile, in place, then its STORE. The
        program's last tile (`split_tail`) is done in pieces along its outermost dim, each
        piece's STORE issued after that piece's ALU operations, so that only the last
        piece's STORE is left when the compute module is done (`_tail_pieces`)."""
        buf, idx = leaf.access["acc"]
        _, dst = self.local(buf, idx, env, tid)
        lanes = [l for l in leaf.chain if not any(a.terms.get(l) for a in idx[:-1])]
        chain = [l for l in leaf.chain if l not in lanes]
        obuf, oidx = leaf.access["out"]
        _, _, _, shape, _ = self.layout.tile(buf)
        origin = [a.at(env, leaf.chain) for a in oidx[:-1]]
        self.epilogues_left[leaf] -= 1
        pieces = [({}, origin, shape)]
        if self.split_tail and not any(self.epilogues_left.values()):
            split = _tail_pieces(chain, oidx, dst, origin, shape)
            # Worth it when the STORE it leaves exposed shrinks by more than the ALU
            # instructions it adds take to start (one pipeline fill each).
            ops = sum(1 if st.operand else len(_alu_ops(st))
                      for st in self.op.epilogue.steps)
            if split and (self._store_cycles(obuf, origin, shape, dst.at({}))
                          - self._store_cycles(obuf, split[-1][1], split[-1][2],
                                               _fix(dst, split[-1][0]).at({}))
                          > (len(split) - 1) * ops * self.c.pipeline_fill):
                pieces = split
        bias_src = None
        for fix, at, part in pieces:
            here = [l for l in chain if l not in fix]
            d = _fix(dst, fix)
            for step in self.op.epilogue.steps:  # in the order the user composed them
                if step.kind == "bias":
                    if bias_src is None:
                        bias_src = self._load_bias(leaf, env, tid, chain)
                    self.loop_insn(here, [d, _fix(bias_src, fix), Aff()],
                                   lambda *a: Alu(*a[:8], AluOp.ADD),
                                   reads=[("acc", 0), ("acc", 1)], writes=[("acc", 0)])
                    continue
                if step.kind == "residual":
                    self._add_residual(leaf, tid, d.at({}), at, part)
                    continue
                for alu_op, imm in _alu_ops(step):
                    self.loop_insn(here, [d, Aff(), Aff()],
                                   lambda *a, o=alu_op, i=imm: Alu(*a[:8], o, True, i),
                                   reads=[("acc", 0)], writes=[("acc", 0)])
            self.dma(Store, Mem.OUT, obuf, obuf.name, at, part, d.at({}), "acc", pad=False)

    def _store_cycles(self, obuf, origin, shape, sram) -> int:
        """Cycles of the STOREs of a tile at `sram` to `origin` of `obuf` (none is emitted)."""
        out, self.out = self.out, []
        self.dma(Store, Mem.OUT, obuf, obuf.name, origin, shape, sram, "acc", pad=False)
        stores, self.out = self.out, out
        return sum(insn_cycles(it.insn, self.c) for it in stores)

    def _add_residual(self, leaf, tid, acc: int, origin, shape):
        """The residual of the accumulator tile at ACC entry `acc` (dense row-major over
        `shape`, output tile at `origin`): LOADs ACC_8BIT of it (the output's blocked layout;
        int8 sign-extended into ACC) below the bias entries of this thread's share, each
        followed by one ALU ADD over the entries it brought. A tile larger than the entries
        reserved for the residual goes in boxes of whole rows of its inner dims, each
        contiguous in the tile."""
        share = self.c.acc_depth // self.layout.threads
        sram = (tid + 1) * share - self.layout.bias_entries - self.layout.residual_entries
        rbuf, _ = leaf.access["residual"]
        j = next(d for d in range(len(shape)) if math.prod(shape[d + 1:]) <= self.layout.residual_entries)
        inner = math.prod(shape[j + 1:])
        rows = self.layout.residual_entries // inner
        for head in itertools.product(*[range(n) for n in shape[:j]]):
            for r0 in range(0, shape[j], rows):
                box = [1] * j + [min(rows, shape[j] - r0)] + list(shape[j + 1:])
                at = [o + i for o, i in zip(origin, list(head) + [r0] + [0] * (len(shape) - j - 1))]
                off = sum(i * math.prod(shape[d + 1:]) for d, i in enumerate(list(head) + [r0]))
                n = math.prod(box)
                self.dma(Load, Mem.ACC_8BIT, rbuf, rbuf.name, at, box, sram, "acc", pad=False)
                lo, hi = self.uop_kernel(np.array([[acc + off, sram, 0]], dtype=np.int64))
                self.out.append(_Insn(Alu(lo, hi, 1, n, 0, 1, 0, 1, AluOp.ADD),
                                      [("acc", acc + off, acc + off + n), ("acc", sram, sram + n)],
                                      [("acc", acc + off, acc + off + n)]))

    def _load_bias(self, leaf, env, tid, chain) -> Aff:
        """LOAD ACC of the tile's bias entries to the end of this thread's acc share; the ALU
        source address of the bias of each accumulator entry."""
        c = self.c
        bbuf, (bidx,) = leaf.access["bias"]
        first = bidx.at(env, leaf.chain)
        if first % c.block_out:
            raise LoweringError("the bias of a tile does not start on a block boundary")
        share = c.acc_depth // self.layout.threads
        sram = (tid + 1) * share - self.layout.bias_entries
        n = self.layout.bias_entries_of(leaf)
        addr, _ = self.dram[bbuf.name]
        self.out.append(_Insn(Load(Mem.ACC, sram, addr // c.acc_entry_bytes
                                   + first // c.block_out, 1, n, n),
                              [], [("acc", sram, sram + n)]))
        return Aff(sram, {l: v // c.block_out for l, v in bidx.loops().items() if l in chain})

    def loop_insn(self, chain, forms, make, reads, writes, tid=0, acc_hazard=False):
        """GEMM/ALU instructions for the leaf's loops: loops that walk contiguously are merged,
        the two outermost left become iter_out and iter_in, the rest a uop kernel (of at most a
        quarter of the UOP buffer; loops outside that are issued as separate instructions).
        `reads`/`writes` name the scratchpad each uop column (dst, src, wgt) indexes.
        `acc_hazard` (multiply-accumulate GEMMs of thread `tid`): no uop may write an ACC entry
        that one of the two uops before it in the same instruction wrote (`_hazard_free`)."""
        loops = [(l.extent, [f.terms.get(l, 0) for f in forms]) for l in chain
                 if l.extent > 1 and any(f.terms.get(l) for f in forms)]
        if any(not isinstance(l, LoopNode) for f in forms for l in f.terms):
            raise LoweringError("a scratchpad address is not affine in the instruction's loops")
        emitted, (eo, co), (ei, ci), grid = self._plan(_merge(loops), forms)
        real = np.ones(len(grid), dtype=bool)
        if acc_hazard and not _hazard_free((eo, co), (ei, ci), grid):
            emitted, (eo, co), (ei, ci), grid, real = self._hazard_free_plan(loops, forms, tid)
        reach = np.array([(eo - 1) * a + (ei - 1) * b for a, b in zip(co, ci)])
        for pos in itertools.product(*[range(e) for e, _ in emitted]):
            uops = grid + sum((np.array(c) * p for (_, c), p in zip(emitted, pos)),
                              np.zeros(3, dtype=np.int64))
            lo, hi = self.uop_kernel(uops)
            insn = make(lo, hi, eo, ei, co[0], ci[0], co[1], ci[1], co[2], ci[2])
            first, last = uops[real].min(axis=0), uops[real].max(axis=0) + reach + 1
            self.out.append(_Insn(insn, [(m, int(first[i]), int(last[i])) for m, i in reads],
                                  [(m, int(first[i]), int(last[i])) for m, i in writes]))

    def _plan(self, loops, forms):
        """(loops issued as separate instructions, (iter_out extent, coefficients), (iter_in
        ...), the uop kernel as an (n, 3) array of dst, src, wgt) for loops in nest order."""
        k = 0
        while math.prod(e for e, _ in loops[k + 2:]) > self.c.uop_depth // 4:
            k += 1
        emitted, iters, kern = loops[:k], loops[k:k + 2], loops[k + 2:]
        iters = [(1, [0, 0, 0])] * (2 - len(iters)) + iters
        grid = np.zeros((1, 3), dtype=np.int64)
        for ext, coefs in kern:
            step = np.arange(ext)[:, None] * np.array(coefs)[None, :]
            grid = (grid[:, None, :] + step[None, :, :]).reshape(-1, 3)
        grid += np.array([f.const for f in forms], dtype=np.int64)
        return emitted, iters[0], iters[1], grid

    def _hazard_free_plan(self, loops, forms, tid):
        """The same multiply-accumulates without the accumulator hazard, plus a mask of the uops
        that are real. Every uop adds into its own ACC entry, so the loop order is free: the
        reduction loops (which keep the ACC entry) go outermost and the tile's distinct entries
        innermost, in the uop kernel. A tile of fewer than 3 entries cannot separate its uops
        that way: its kernel is padded to 3 uops per reduction step with uops that accumulate
        into scratch ACC entries of the thread (`scratch`), which nothing reads; the cycle
        model counts them, which is what the stall costs."""
        red = _merge([lp for lp in loops if lp[1][0] == 0])
        spatial = _merge([lp for lp in loops if lp[1][0] != 0])
        entries = math.prod(e for e, _ in spatial)
        pad = max(0, HAZARD_DISTANCE + 1 - entries)
        # The reduction loops fill the loop positions; the tile's entries stay in the kernel.
        ordered = [(1, [0, 0, 0])] * max(0, 2 - len(red)) + red + spatial
        emitted, outer, inner, grid = self._plan(ordered, forms)
        real = np.ones(len(grid), dtype=bool)
        if pad:
            blocks = grid.reshape(-1, entries, 3)
            fill = np.repeat(blocks[:, :1, :], pad, axis=1)
            fill[:, :, 0] = self.scratch(tid, pad)[None, :]
            grid = np.concatenate([blocks, fill], axis=1).reshape(-1, 3)
            real = np.concatenate([np.ones((len(blocks), entries), bool),
                                   np.zeros((len(blocks), pad), bool)], axis=1).reshape(-1)
        if not _hazard_free(outer, inner, grid):
            raise LoweringError(f"{self.op}: no GEMM uop order avoids the accumulator hazard")
        return emitted, outer, inner, grid, real

    def scratch(self, tid, n) -> np.ndarray:
        """`n` ACC entries of thread `tid` that hazard-padding uops accumulate into: right
        below the bias entries at the end of the thread's share, zeroed (by a reset GEMM) the
        first time the thread uses them, so that no uop reads an entry nothing wrote."""
        share = self.c.acc_depth // self.layout.threads
        base = (tid + 1) * share - self.layout.bias_entries - self.layout.residual_entries - HAZARD_DISTANCE
        tiles = max((math.prod(self.layout.tile(b)[3]) for b in self.layout.defining
                     if b.scope().split(".")[-1] == "acc"), default=0)
        if base < tid * share + tiles:
            raise ScheduleError(f"{self.op}: the accumulator tile leaves no room for the "
                                f"{HAZARD_DISTANCE} scratch ACC entries that a tile of fewer "
                                f"than {HAZARD_DISTANCE + 1} entries needs; use smaller tiles")
        if tid not in self.scratch_zeroed:
            self.scratch_zeroed.add(tid)
            lo, hi = self.uop_kernel(np.array([[base + j, 0, 0] for j in
                                               range(HAZARD_DISTANCE)], dtype=np.int64))
            self.out.append(_Insn(Gemm(True, lo, hi, 1, 1, 0, 0, 0, 0, 0, 0), [],
                                  [("acc", base, base + HAZARD_DISTANCE)]))
        return base + np.arange(n)

    def uop_kernel(self, uops) -> tuple[int, int]:
        """[begin, end) of `uops` in the UOP buffer, loading them (LOAD UOP) unless already
        there (`_UopBuffer.place`)."""
        span, load = self.uops.place(uops)
        if load is not None:
            self.out.append(load)
        return span


def _fix(form: Aff, values: dict) -> Aff:
    """`form` with the loops in `values` set to their values."""
    return Aff(form.const + sum(form.terms.get(l, 0) * v for l, v in values.items()),
               {l: c for l, c in form.terms.items() if l not in values})


def _tail_pieces(chain, oidx, dst, origin, shape):
    """The last accumulator tile in pieces along its outermost loop of `chain`: per value,
    (that loop fixed, the piece's origin in the output, its shape). A piece must be one
    dense run of the tile: the loop walks the outermost output dim of the tile that is
    longer than 1, one row per iteration, and the tile's ACC entries row-major. None where
    it does not (the tile is then done whole)."""
    lp = next((l for l in chain if l.extent > 1), None)
    if lp is None:
        return None
    dims = [d for d, a in enumerate(oidx[:-1]) if a.terms.get(lp)]
    if len(dims) != 1:
        return None
    (d,) = dims
    if (oidx[d].terms[lp] != 1 or shape[d] != lp.extent or any(n != 1 for n in shape[:d])
            or dst.terms.get(lp) != math.prod(shape[d + 1:])):
        return None
    part = [1 if e == d else n for e, n in enumerate(shape)]
    return [({lp: v}, [o + v if e == d else o for e, o in enumerate(origin)], part)
            for v in range(lp.extent)]


def _batch_uop_loads(items: list[_Insn]) -> list[_Insn]:
    """The LOAD UOPs of each fill of the UOP buffer (from one refill from the start to the
    next, see `_UopBuffer.place`) merged into one, issued where the fill's first LOAD was:
    the kernels of a fill lie contiguously both in the buffer and in the uop segment, and
    only the compute module (in program order) reads or writes the UOP buffer, so loading a
    kernel before its turn changes nothing but the cost: one DMA row (dma_latency) per
    fill instead of one per kernel."""
    out, first = [], None
    for it in items:
        insn = it.insn
        if not (isinstance(insn, Load) and insn.mem == Mem.UOP):
            out.append(it)
            continue
        if insn.sram_base == 0:  # a new fill: its LOAD takes this one's place
            first = len(out)
            out.append(it)
            continue
        head = out[first].insn
        n = insn.sram_base + insn.x_size
        out[first] = _Insn(dataclasses.replace(head, y_size=1, x_size=n, x_stride=n), [],
                           [("uop", 0, n)])
    return out


def _hazard_free(outer, inner, grid) -> bool:
    """Whether no uop execution of the instruction (iter_out, iter_in, kernel `grid`) writes
    the ACC entry that one of the two executions before it wrote: VTA's GEMM pipeline reads an
    entry before the write of either of the two previous uops has landed (docs/vta.md §4)."""
    (eo, co), (ei, ci) = outer, inner
    off = (np.arange(eo)[:, None] * co[0] + np.arange(ei)[None, :] * ci[0]).ravel()
    seq = (off[:, None] + grid[None, :, 0]).ravel()
    return not any((seq[d:] == seq[:-d]).any() for d in range(1, HAZARD_DISTANCE + 1))


IMM_BITS = 16  # the ALU immediate: signed 16-bit (docs/vta.md §2)


def _alu_ops(step) -> list[tuple[AluOp, int]]:
    """The ALU operations (with immediates) of one epilogue step other than the bias:
    shift -> SHR (a negative amount shifts left), clip -> MIN hi then MAX lo (as VTA's classic
    schedule; the same as the TE definition's min(max(x, lo), hi) since lo <= hi), relu -> MAX 0. A clip bound that does not fit the ALU's
    16-bit immediate cannot run: ScheduleError."""
    if step.kind == "shift":
        return [(AluOp.SHR, step.value[0])]
    if step.kind == "clip":
        lim = 1 << (IMM_BITS - 1)
        for v in step.value:
            if not -lim <= v < lim:
                raise ScheduleError(f"clip{step.value}: VTA's ALU takes immediates in "
                                    f"[{-lim}, {lim - 1}] (signed {IMM_BITS}-bit); use clip "
                                    "bounds in that range")
        return [(AluOp.MIN, step.value[1]), (AluOp.MAX, step.value[0])]
    if step.kind == "relu":
        return [(AluOp.MAX, 0)]
    raise ScheduleError(f"the VTA ALU cannot run epilogue step {step.kind!r}")


def _merge(loops):
    """Fuse each loop into the next inner one when, for every operand, its coefficient is the
    inner's times the inner's extent (the pair walks one contiguous range)."""
    out = []
    for ext, coefs in reversed(loops):
        if out:
            iext, icoefs = out[-1]
            if all(c == i * iext for c, i in zip(coefs, icoefs)) and ext * iext <= ITER_MAX:
                out[-1] = (ext * iext, icoefs)
                continue
        out.append((ext, coefs))
    return list(reversed(out))


# -- dependency tokens --------------------------------------------------------------------------
_ORDER = {"load": 0, "compute": 1, "store": 2}


def add_tokens(items: list[_Insn]) -> list:
    """Instructions with dependency flags. For every instruction, the latest instruction of
    another module that wrote what it reads, or read/wrote what it writes, must finish first;
    such a pair becomes a token (push after the producer, pop before the consumer) unless an
    earlier consumer of the same module already waits for that producer or a later one."""
    last = {}  # (module, mem) -> (write array, read array) of instruction indices
    need = []  # per instruction: {producer module: latest producer index}
    for k, it in enumerate(items):
        m = module_of(it.insn)
        deps = {}
        for mem, lo, hi, is_write in ([(*r, False) for r in it.reads]
                                      + [(*w, True) for w in it.writes]):
            for other in _ORDER:
                if other == m or (other, mem) not in last:
                    continue
                wr, rd = last[(other, mem)]
                j = int(wr[lo:hi].max(initial=-1))
                if is_write:
                    j = max(j, int(rd[lo:hi].max(initial=-1)))
                if j >= 0:
                    deps[other] = max(deps.get(other, -1), j)
        need.append(deps)
        for mem, lo, hi in it.reads + it.writes:
            if (m, mem) not in last:
                size = 1 << 16
                last[(m, mem)] = (np.full(size, -1, np.int64), np.full(size, -1, np.int64))
        for mem, lo, hi in it.reads:
            last[(m, mem)][1][lo:hi] = k
        for mem, lo, hi in it.writes:
            last[(m, mem)][0][lo:hi] = k
    flags = [dict() for _ in items]
    waited = {}  # (consumer module, producer module) -> latest producer already waited for
    for k, deps in enumerate(need):
        m = module_of(items[k].insn)
        for other, j in deps.items():
            if abs(_ORDER[other] - _ORDER[m]) != 1:
                raise LoweringError(f"instruction #{k} ({format_insn(items[k].insn)}) depends "
                                    f"on the {other} module, which it cannot talk to")
            if waited.get((m, other), -1) >= j:
                continue
            waited[(m, other)] = j
            later = _ORDER[m] > _ORDER[other]
            flags[j]["push_next" if later else "push_prev"] = True
            flags[k]["pop_prev" if later else "pop_next"] = True
    return [dataclasses.replace(it.insn, deps=Deps(**f)) if f else it.insn
            for it, f in zip(items, flags)]


# What to change when an instruction field does not fit its encoding.
_FIELD_HINTS = {
    "x_stride": "a DMA row stride (in entries) of this operator's shape exceeds the 16-bit "
                "stride field: VTA cannot address rows this far apart; use smaller operator "
                "dims (split the reduction or the channels into several operators)",
    "dram_base": "the operator's tensors do not fit VTA's 32-bit DRAM element addresses; use "
                 "smaller operator shapes",
    "x_size": "a DMA row is longer than its 16-bit size field; use smaller tiles (the *_inner "
              "/ k_inner / ci_inner knobs)",
    "y_size": "a DMA has more rows than its 16-bit size field; use smaller tiles (the *_inner "
              "knobs)",
    "iter_out": "a loop of the tile exceeds the 14-bit loop count; use smaller tiles",
    "iter_in": "a loop of the tile exceeds the 14-bit loop count; use smaller tiles",
}


def generate(func, op, config: VTAConfig, row_pitch: bool = False,
             keep_tiles: bool = False, share_tiles: bool = False,
             thread_major: bool = True, batch_uops: bool = False,
             split_tail: bool = False) -> Program:
    """The VTA program of a scheduled PrimFunc, every instruction checked to encode (a field
    that does not fit is a build error naming the field and what to change, not a failure of
    the first run). `row_pitch`: input tiles hold only the rows the GEMMs read (the back
    end's `Capabilities.row_pitch`, see `_Layout.steps`). `keep_tiles`: a copy of the region
    its buffer already holds is skipped (`keeps_tiles`, see `_Emitter.leaf_copy`).
    `share_tiles`: virtual threads that need the same region of a buffer at once read one
    copy of it (`shares_tiles`, see `_Slots.place`). `thread_major`: the
    copies of a step are issued thread by thread (see `_Emitter.walk`), else each copy for
    every thread in turn, as TVM's virtual-thread injection does. `batch_uops`: one LOAD
    UOP per fill of the UOP buffer (`_batch_uop_loads`), else one per kernel, as TVM's
    runtime does. `split_tail`: the last accumulator tile's epilogue and STORE in pieces
    (see `_Emitter.leaf_epilogue`)."""
    prog = _Emitter(read_tir(func), op, config, row_pitch, keep_tiles, share_tiles,
                    thread_major, batch_uops, split_tail).run()
    for k, insn in enumerate(prog.insns):
        try:
            encode(insn, config)
        except LoweringError as e:
            field_name = next((f for f in _FIELD_HINTS if f"field {f}=" in str(e)), None)
            hint = _FIELD_HINTS.get(field_name, "the tile or operator shape does not fit the "
                                                "VTA instruction encoding")
            raise LoweringError(f"{op}: instruction #{k} does not encode: {e}; {hint}") from None
    return prog
