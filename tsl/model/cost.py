"""The analytic cost model: a recorded schedule on its TAM -> `Estimate`.

Everything it knows about a machine is in the machine file: primitive rates and latencies,
level bandwidths, mover latencies, compute level counts (virtual ones add no throughput); what
the back end's program does with the movers' copies is the back end's `Capabilities`
(`tsl.tam.capabilities`: rows one by one, at a pitch, copies kept or shared by threads). No
chip is named here.

The model, for a schedule `s`:

- **Traffic.** Every staged tile is a `Transfer`: filled once per iteration of its loop and of
  every loop outside it (a tile staged under a loop it does not depend on is reloaded on each
  of that loop's iterations: that is what the program does; a back end that `keeps_tiles`
  skips a copy of the region its buffer holds, so there it is once per change of the tile,
  and one that `shares_tiles` loads a region the virtual threads all need once for all),
  times the tile's bytes (copies at a `row_pitch` take only the rows a strided window reads).
  An accumulator tile is written back, in the output's dtype, once per fill. A hardware cache
  (managed = false) is modelled the same way: the traffic its tile sizes imply, in whole lines
  (`line_bytes`) where consecutive fills do not read on along the same lines.
- **Time of a data path.** Transfers are grouped by the level they come from (their parent):
  per fill, the mover's latency (per row where the back end's copies have `serial_rows`) plus
  bytes over the level's bandwidth, the fills spread over the parallel units; a parent shared
  by all units (DRAM) also caps the total bytes at its own bandwidth.
- **Compute.** The padded MACs at the primitive's rate over the parallel units actually busy
  (the busiest unit sets the time: ceil(tiles / units)), slowed where one step of the
  innermost reduction updates fewer independent accumulator blocks than latency x issue rate
  needs, or loads their operands slower than they compute (`step_blocks`), the two stalls
  adding up where both occur; zeroing each accumulator tile (one primitive issue per block of
  it); where the core's own stores write it back, one store per contiguous run of the output,
  up to a vector (`store_cycles`); the epilogue on the vector unit of the accumulator's level
  (a clip is two operations).
- **Overlap, explicit copies** (every tile in a managed level, copied by a mover: VTA, TPU):
  the program is played as its loop of accumulator tiles (`explicit_pipeline`): reset, the
  reduction steps (each loads its operand tiles and computes), epilogue, write-back, with
  loads running as many steps ahead as the tiles have buffers (the pipeline depth times the
  virtual threads) and the next tile's reset waiting for the write-back of the one before
  it in the same accumulator buffer.
- **Overlap, hardware caches** (CPU): a transfer overlaps compute when its loop is
  pipelined, when virtual threads interleave around it, or when it is a hardware cache
  (prefetch); then the time is the slowest of compute and each path (plus the first fill),
  otherwise the parts add.

A back end refines this with `evaluate(s, extra=..., detail=...)`: more transfers its program
makes (padding passes, say) and its own report fields. A back end whose program is not the
schedule's staged tiles one for one (the TPU's Mosaic kernel, whose blocks, grid and pipeline it
derives from the schedule) registers a `Program` builder (`register_program`): the program's own
transfers, its compute with the back end's fixed costs, and its serial cycles, priced here by
the same traffic, overlap and bound rules, for the knob choice and the artifact alike.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Callable

from ..primitives.schedule import Loop, Schedule, Stage
from ..tam.capabilities import NONE
from ..tam.machine import MemoryLevel, dtype_bytes
from .estimate import Estimate


BALANCE_STALL = 0.2  # fitted on VTA cycles (ResNet-18 C2, C11) before explicit_pipeline
ENGINE_STALL = 0.05  # the same for explicit copies; fitted on VTA cycles (C2-C11 settings)


class TransferKind(enum.Enum):
    """What a transfer moves: the accumulator walk (`accumulator_cycles`) and the overlap rules
    treat the accumulator's write-back apart from the loads, whatever a back end labels it."""

    TILE = "tile"  # an operand tile staged in a level (or a kernel's operand blocks)
    THROUGH = "through"  # what a cache with no stage of its own passes on to the tiles below
    WRITE_BACK = "write-back"  # the accumulator's results written out to its parent
    PASS = "pass"  # a whole-array pass around the kernel (padding, a bias, an XLA pass)


@dataclass(frozen=True, kw_only=True)
class Transfer:
    """Data moved into memory level `level` from its parent `parent`: `fills` times `bytes`
    (each `rows` rows), spread over `units` parallel instances, overlapping compute or not.
    Built by keyword: 14 fields, most of them numbers of the same type."""

    kind: TransferKind
    what: str  # a label for the report: "A tile at ci.0", a back end's own
    level: str
    parent: str
    fills: int
    bytes: int
    rows: int = 1
    latency: float = 0.0  # cycles per row (serial rows) or per fill
    serial_rows: bool = False
    bandwidth: float = 0.0  # bytes per cycle of the link into `level` (per instance)
    shared_bandwidth: float = 0.0  # bytes per cycle of a parent every unit shares (0: none)
    units: float = 1.0
    hidden: float = 0.0  # fraction of the shorter of this path and compute hidden by overlap
    in_flight: int = 1  # transfers of this tile under way at once (its pipeline depth)
    at: int = -1  # position in the schedule's loops of the loop it is staged at (-1: none)

    @property
    def total_bytes(self) -> int:
        return self.fills * self.bytes

    def fill_cycles(self) -> float:
        # Serial rows keep the mover busy through each row's latency; otherwise the latency
        # of one transfer overlaps the others in flight, one per buffer (pipeline stage).
        lat = self.latency * self.rows if self.serial_rows else self.latency / self.in_flight
        return lat + (self.bytes / self.bandwidth if self.bandwidth else 0.0)

    def cycles(self) -> float:
        """Cycles of the link into this level (per instance, fills spread over units)."""
        return self.fills / self.units * self.fill_cycles()

    def shared_cycles(self) -> float:
        return self.total_bytes / self.shared_bandwidth if self.shared_bandwidth else 0.0


# -- the schedule's parallel structure ----------------------------------------------------------
def busy_units(s: Schedule) -> float:
    """Parallel instances doing useful work on average: for each loop run over a (real, not
    virtual) compute level of count c, extent E / ceil(E / c) (the busiest instance sets the
    time). Levels below the one that issues the primitive add no primitive throughput."""
    m = s.machine
    names = [c.name for c in m.compute]
    p = s.primitive
    issuer = names.index(p.issued_by) if p is not None and p.issued_by in names else len(names)
    units = 1.0
    for lp in s.loops:
        if not lp.parallel:
            continue
        cl = m.compute_level(lp.parallel)
        if cl.virtual or names.index(cl.name) > issuer:
            continue
        units *= lp.extent / math.ceil(lp.extent / cl.count)
    return units


def _fills(s: Schedule, at: Loop) -> int:
    return math.prod(lp.extent for lp in s.loops[:s.loops.index(at) + 1])


# The operator roles an operand's tile depends on (the others leave it unchanged).
DEPENDS = {"A": ("m", "k", "b"), "B": ("n", "k", "b"), "C": ("m", "n", "b")}


def kept_fills(s: Schedule, st: Stage, shares: bool = False) -> int:
    """Fills of a tile whose back end skips a copy of the region the buffer already holds
    (`Capabilities.keeps_tiles`): one per change of the tile, i.e. per iteration of the loops
    out to the innermost one (of more than one iteration) the tile depends on; each virtual
    thread inside that loop keeps its own copy. With `shares` (`shares_tiles`), threads that
    need the same region at once load it once: the threads inside that loop share one
    copy, and so do those of a thread loop outside it whose consecutive iterations (the
    threads of one round) leave the tile unchanged."""
    loops = s.loops[:s.loops.index(st.at) + 1]
    roles = DEPENDS[st.operand]

    def depends(lp):
        return any(p.extent > 1 and s.role_of(p.axes[0]) in roles for p in lp.parts or (lp,))

    dep = [i for i, lp in enumerate(loops) if depends(lp)]
    j = dep[-1] if dep else -1
    fills = math.prod(lp.extent for lp in loops[:j + 1])
    for i, lp in enumerate(loops):
        if not (lp.parallel and s.machine.compute_level(lp.parallel).virtual):
            continue
        if i > j and not shares:
            fills *= thread_count(s, lp)
        elif i <= j and shares and _shared_round(s, lp, roles):
            fills //= thread_count(s, lp)
    return fills


def _shared_round(s: Schedule, lp: Loop, roles) -> bool:
    """Whether `lp` runs as virtual threads whose rounds (consecutive iterations) read the
    same tile of an operand that depends on `roles`: the innermost part of the loop with
    more than one iteration is not one it depends on."""
    if not (lp.parallel and s.machine.compute_level(lp.parallel).virtual):
        return False
    parts = [p for p in (lp.parts or (lp,)) if p.extent > 1]
    return bool(parts) and s.role_of(parts[-1].axes[0]) not in roles


def _ext_from(s: Schedule, pos: int) -> dict[str, int]:
    """Iterations per axis of the loops from position `pos` inwards."""
    ext = {a: 1 for a in s.padded_extents()}
    for lp in s.loops[pos:]:
        for part in lp.parts or (lp,):
            ext[part.axes[0]] *= part.extent
    return ext


def _dtype(s: Schedule, operand: str) -> str:
    return s.op.acc_dtype if operand == "C" else s.op.input(operand).dtype


def cache_reuse(s: Schedule, st: Stage, lv: MemoryLevel | None = None) -> tuple[int, int]:
    """(fills, bytes per fill) of a tile in hardware cache `lv` (default: the stage's). Nothing
    is copied: a line comes in when it is touched and stays while the data touched since
    fits, so the tile is reloaded only under the outermost loop whose working set (every
    operand the level holds) still fits the level; loops it does not depend on inside that
    one reuse it for free. A fused loop counts as the loops it was made of: its inner parts
    run consecutively on a core (a parallel loop hands each core a contiguous run), so a
    tile reused across them is reused there too."""
    lv = lv or st.level
    nominal = s.loops.index(st.at) + 1
    held = [(o, dtype_bytes(_dtype(s, o))) for o in lv.holds
            if o != "C" or any(x.operand == "C" for x in s.stages)]
    ext = _ext_from(s, nominal)
    parts = [(p, n, part) for p, lp in enumerate(s.loops[:nominal])
             for n, part in enumerate(lp.parts or (lp,))]
    k, fit = len(parts), dict(ext)
    for i in range(len(parts) - 1, -1, -1):  # one loop (or part) more around the tile each time
        ext[parts[i][2].axes[0]] *= parts[i][2].extent
        if sum(s.op.footprint(o, ext) * b for o, b in held) > lv.capacity:
            break
        k, fit = i, dict(ext)
    fills = math.prod(part.extent for _, _, part in parts[:k])
    # The loop just outside the fit: a fused loop cut inside counts as outside.
    pos = nominal if k == len(parts) else parts[k][0] + (parts[k][1] > 0)
    nbytes = s.op.footprint(st.operand, fit) * dtype_bytes(st.dtype)
    return fills, math.ceil(max(nbytes, line_bytes(s, st, lv, fit, pos)))


def line_bytes(s: Schedule, st: Stage, lv: MemoryLevel, ext: dict, pos: int) -> float:
    """Bytes of whole lines (the cache's `alignment`) that the tile of `st` over `ext` touches:
    each contiguous run of it in memory (`layout_dims`) rounded up to lines (the rows of an
    NCHW window each come in as a line, however few of its pixels the tile reads) — unless the
    loop just outside (the innermost of more than one iteration before `pos`) steps along the
    dim the runs lie in, so that consecutive fills read on along the same lines (NHWC's
    channels, packed weights): then 0, the element bytes stand."""
    line = lv.alignment
    dims = layout_dims(s, st, ext)
    if line <= 1 or not dims:
        return 0.0
    # As `tile_rows`, but a tile wider than its dim (zero padding) covers it: the cache holds
    # the source's lines, where a DMA's destination tile has rows of the tile's width.
    run, runs, along = 1, 1, None
    for i in range(len(dims) - 1, -1, -1):
        run *= min(dims[i][1], dims[i][2])
        if dims[i][1] < dims[i][2]:
            runs, along = math.prod(min(t, f) for _, t, f in dims[:i]), dims[i][0]
            break
    outer = next((lp for lp in reversed(s.loops[:pos]) if lp.extent > 1), None)
    if outer is not None and any(p.axes[0] == along for p in outer.parts or (outer,)):
        return 0.0
    return runs * math.ceil(run * dtype_bytes(st.dtype) / line) * line


def hidden_fraction(s: Schedule, st: Stage) -> float:
    """How much of a staged tile's movement overlaps compute: all of it for a hardware cache
    (prefetch) or a pipelined loop (its next tile loads while this one computes); with only
    V virtual threads around it, each thread's next load waits for its own compute, so 1/V of
    the shorter side stays exposed; none otherwise."""
    if not st.level.managed or st.at.stages > 1:
        return 1.0
    return 1 - 1 / virtual_threads(s, s.loops.index(st.at))


def _inner_ext(s: Schedule, at: Loop) -> dict[str, int]:
    ext = {a: 1 for a in s.padded_extents()}
    for lp in s.loops[s.loops.index(at) + 1:]:
        for part in lp.parts or (lp,):
            ext[part.axes[0]] *= part.extent
    return ext


def layout_dims(s: Schedule, st: Stage, ext: dict, rows_used: bool = False,
                packed: bool | None = None) -> list[tuple[str, int, int]]:
    """(axis, tile, full) of each dim of the tile of `st` over `ext`, outermost first in
    memory: the operator's layout, where packed with the primitive's block of its k (and n)
    axis innermost (the accumulator its n block). `packed`: whether the tile is in the packed
    layout (default: as staged; the accumulator is kept in the activations' layout, packed
    when A is)."""
    dims = list(s.op.tile_shape(st.operand, ext, rows_used))
    p = s.primitive
    if packed is None:
        packed = st.operand in s.packed or (st.operand == "C" and "A" in s.packed)
    if packed and p is not None:
        blocks = {"A": {"k": p.k}, "B": {"k": p.k, "n": p.n}, "C": {"n": p.n}}[st.operand]
        inner = []
        for i, (axis, tile, full) in enumerate(dims):
            b = blocks.get(s.role_of(axis), 1)
            if b > 1 and tile % b == 0:
                # Packing pads the dim to whole blocks (24 channels are two blocks of 16).
                dims[i] = (axis, tile // b, -(-full // b))
                inner.append((axis, b, b))
        dims += inner
    return dims


def tile_rows(s: Schedule, st: Stage, rows_used: bool = False,
              packed: bool | None = None) -> int:
    """Contiguous rows of a staged tile in memory (`layout_dims`): the tile's dimensions
    outside the innermost one it does not cover whole. `rows_used`: the tile holds only the
    rows its window reads (copies at a `row_pitch`); a strided dim is never part of a
    contiguous run, each of its rows is one."""
    ext = _inner_ext(s, st.at)
    dims = layout_dims(s, st, ext, rows_used, packed)
    strided = ({dims[d][0] for d in s.op.strided_dims(st.operand, ext)} if rows_used
               else set())
    rows = 1
    for i in range(len(dims) - 1, -1, -1):
        if dims[i][0] in strided and dims[i][1] > 1:
            rows = math.prod(min(t, f) for _, t, f in dims[:i + 1])
            break
        if dims[i][1] != dims[i][2]:
            rows = math.prod(min(t, f) for _, t, f in dims[:i])
            break
    return max(rows, 1)


def drain_pieces(s: Schedule, wb: Transfer) -> int:
    """Pieces a program writes its last accumulator tile back in (write-back `wb`), each
    after its part of the epilogue, as the VTA codegen does: along the tile's outermost dim
    longer than 1 (the n axis in the primitive's blocks where the accumulator is packed),
    where the write-back this leaves exposed (one piece's) shrinks by more than the extra
    vector instructions take to start (the primitive's latency each); else 1."""
    acc = next((st for st in s.stages if st.operand == "C"), None)
    p = s.primitive
    if acc is None or p is None:
        return 1
    packed = "C" in s.packed or "A" in s.packed
    n = 1
    for axis, tile, _ in s.op.tile_shape("C", _inner_ext(s, acc.at)):
        if packed and s.role_of(axis) == "n" and tile % p.n == 0:
            tile //= p.n
        if tile > 1:
            n = tile
            break
    ops = sum(vector_ops(step) for step in s.op.epilogue.steps)
    saved = wb.fill_cycles() - _drain_piece(wb, n).fill_cycles()
    return n if n > 1 and saved > (n - 1) * ops * p.latency else 1


def _drain_piece(wb: Transfer, n: int) -> Transfer:
    return _replace(wb, bytes=math.ceil(wb.bytes / n), rows=max(1, wb.rows // n))


def _mover(s: Schedule, src: str, dst: str):
    return next((mv for mv in s.machine.movers if mv.src == src and mv.dst == dst), None)


def _parent(s: Schedule, lv: MemoryLevel) -> MemoryLevel:
    return s.machine.memory_level(lv.parent) if lv.parent else s.machine.memory[0]


def transfers(s: Schedule) -> list[Transfer]:
    """Every staged tile of `s` as a `Transfer` (and each accumulator tile's write-back)."""
    units = busy_units(s)
    out = []
    for st in s.stages:
        lv = st.level
        parent = _parent(s, lv)
        mv = _mover(s, parent.name, lv.name)
        # What the back end's program does with the copies of its movers (none without one).
        cap = s.capabilities if mv is not None else NONE
        fills = _fills(s, st.at)
        hidden = hidden_fraction(s, st)
        shared = parent.bandwidth if parent.per is None and parent.role == "global" else 0.0
        bw = lv.bandwidth or (mv.bytes_per_cycle if mv else 0.0) or parent.bandwidth
        if st.operand == "C":
            # Written back in the output dtype once per fill (after the epilogue).
            nbytes = math.ceil(st.elements * dtype_bytes(s.op.out_dtype))
            out.append(Transfer(kind=TransferKind.WRITE_BACK,
                                what=f"C write-back from {lv.name} at {st.at.name}",
                                level=parent.name, parent=lv.name, fills=fills, bytes=nbytes,
                                rows=tile_rows(s, st), latency=mv.latency if mv else 0.0,
                                serial_rows=cap.serial_rows, bandwidth=bw,
                                shared_bandwidth=shared, units=units, hidden=hidden,
                                at=s.loops.index(st.at)))
            continue
        # (Copies at a row pitch take only the rows a strided window reads: the stage's
        # elements count those, `tile_rows` its DMA rows.)
        nbytes = st.bytes
        if not lv.managed:
            fills, nbytes = cache_reuse(s, st)
        elif cap.keeps_tiles:
            fills = kept_fills(s, st, cap.shares_tiles)
        elif cap.shares_tiles:
            fills //= math.prod(thread_count(s, lp) for lp in s.loops[:s.loops.index(st.at) + 1]
                                if _shared_round(s, lp, DEPENDS[st.operand]))
        out.append(Transfer(kind=TransferKind.TILE, what=f"{st.operand} tile at {st.at.name}",
                            level=lv.name, parent=parent.name, fills=fills, bytes=nbytes,
                            rows=tile_rows(s, st, cap.row_pitch),
                            latency=mv.latency if mv else 0.0,
                            serial_rows=cap.serial_rows, bandwidth=bw,
                            shared_bandwidth=shared, units=units, hidden=hidden,
                            in_flight=st.at.stages, at=s.loops.index(st.at)))
    out += _through(s, units)
    # The write-back overlaps as well as the operand loads around it do (a separate path).
    best = max((t.hidden for t in out), default=0.0)
    return [t if t.kind is not TransferKind.WRITE_BACK else _replace(t, hidden=best)
            for t in out]


def _through(s: Schedule, units: float) -> list[Transfer]:
    """What a cache with no stage of its own (an L3 around the staged L2) passes on to the
    tiles staged below it, with the reuse its own capacity gives."""
    out = []
    for lv in s.machine.memory:
        if lv.managed or any(st.level is lv for st in s.stages):
            continue
        for st in s.stages:
            if st.operand == "C" or st.level.parent != lv.name:
                continue
            parent = _parent(s, lv)
            fills, nbytes = cache_reuse(s, st, lv)
            shared = parent.bandwidth if parent.per is None and parent.role == "global" else 0.0
            out.append(Transfer(kind=TransferKind.THROUGH, what=f"{st.operand} through {lv.name}",
                                level=lv.name, parent=parent.name, fills=fills, bytes=nbytes,
                                bandwidth=lv.bandwidth or parent.bandwidth,
                                shared_bandwidth=shared, units=units, hidden=1.0))
    return out


def _replace(t: Transfer, **kw) -> Transfer:
    return Transfer(**{**t.__dict__, **kw})


# -- compute ------------------------------------------------------------------------------------
def step_blocks(s: Schedule, acc: Stage) -> tuple[float, float]:
    """(rows, columns), in primitive blocks, of the part of accumulator tile `acc` that one
    step of the innermost reduction loop updates: the blocks in flight at once, which share
    that step's operand loads. Loops of the tile outside the reduction (conv2d's rows without
    reduce_rows) take their turns, each running the whole reduction on its own blocks."""
    p = s.primitive
    prim = next((i for i, lp in enumerate(s.loops) if lp.tensorized is not None), len(s.loops))
    last_k = max((i for i, lp in enumerate(s.loops[:prim]) if s.reduces(lp)), default=-1)
    start = max(last_k, s.loops.index(acc.at)) + 1
    ext = _ext_from(s, start)
    rows = math.prod(e for a, e in ext.items() if s.role_of(a) == "m") / p.m
    cols = math.prod(e for a, e in ext.items() if s.role_of(a) == "n") / p.n
    return rows, cols


def operand_bytes_per_mac(s: Schedule) -> float:
    """Bytes of A and B one reduction step of the accumulator tile reads per MAC it issues (0
    where nothing is tensorized): a block row of A and a block column of B per step, each
    shared by the tile's blocks along the other axis; the larger and squarer the tile, the
    fewer. With fp32 1x16 FMAs: 8x3 blocks 0.58, 8x2 0.63, 4x6 1.04, 4x3 1.08."""
    p = s.primitive
    acc = next((st for st in s.stages if st.operand == "C"), None)
    if p is None or acc is None:
        return 0.0
    rows, cols = step_blocks(s, acc)
    a = rows * p.m * p.k * dtype_bytes(p.a_dtype)
    b = cols * p.n * p.k * dtype_bytes(p.b_dtype)
    return (a + b) / (rows * cols * p.m * p.n * p.k)


def issue_efficiency(s: Schedule) -> float:
    """Fraction of the primitive's rate the accumulator tile sustains: a primitive of latency L
    issued r times per cycle needs L * r independent accumulator blocks in flight."""
    p = s.primitive
    if p is None or not p.macs_per_cycle:
        return 1.0
    per_cycle = p.macs_per_cycle / (p.m * p.n * p.k)
    need = p.latency * per_cycle
    acc = next((st for st in s.stages if st.operand == "C"), None)
    blocks = math.prod(step_blocks(s, acc)) if acc else 1
    return min(1.0, blocks / need) if need > 1 else 1.0


def feed_efficiency(s: Schedule) -> float:
    """Fraction of the primitive's rate the operand loads sustain where a mover carries the
    operands from the primitive's operand level into its accumulator level (a CPU's loads
    into registers): every reduction step of the accumulator tile loads one vector per
    block row of A (a broadcast) and one per block column of B, each as wide as a block of
    the accumulator, at the mover's bytes per cycle (its `unpacked_bytes_per_cycle` where an
    operand is read where it lies, not packed); the tile's blocks reuse them."""
    p = s.primitive
    acc = next((st for st in s.stages if st.operand == "C"), None)
    mv = _mover(s, p.a_level, p.c_level) if p is not None and acc is not None else None
    if mv is None or not mv.bytes_per_cycle or not p.macs_per_cycle:
        return 1.0
    rows, cols = step_blocks(s, acc)
    vector = p.m * p.n * dtype_bytes(p.acc_dtype)
    unpacked = not {"A", "B"} <= set(s.packed)
    rate = (mv.unpacked_bytes_per_cycle if unpacked else 0.0) or mv.bytes_per_cycle
    load = (rows + cols) * vector / rate
    compute = rows * cols * p.m * p.n * p.k / p.macs_per_cycle
    return min(1.0, compute / load) if load else 1.0


def store_cycles(s: Schedule, acc: Stage) -> float:
    """Cycles of the stores that write accumulator tile `acc` back, per fill, where the
    operands' mover (a core's load/store unit) carries it: one store per contiguous run of the
    tile in the output's layout, up to a vector of the accumulator each; a run narrower than
    the vector still takes a whole store. Where the output's runs lie across the accumulator's
    lanes (NCHW output, pixels contiguous, written from vectors of channels) the program also
    gathers each stored vector lane by lane from as many registers (mnv37 counted ~370
    instructions per 16 x 16 tile of it against 272 FMAs): one more store slot per element,
    the same for every tile shape of the operator, so it weighs on the choice between
    operators (the in-place GEMM stores whole vectors), not on their knobs."""
    p = s.primitive
    mv = _mover(s, p.a_level, p.c_level)
    bandwidth = (mv.store_bytes_per_cycle or mv.bytes_per_cycle) if mv is not None else 0.0
    if not bandwidth:
        return 0.0
    rows = tile_rows(s, acc, packed=False)  # the core stores straight into the output
    lanes = p.m * p.n
    stores = rows * math.ceil(acc.elements / rows / lanes)
    dims = layout_dims(s, acc, _inner_ext(s, acc.at), packed=False)
    if lanes > 1 and dims and s.role_of(dims[-1][0]) != "n":  # runs across the lanes (n)
        stores += acc.elements
    return stores * lanes * dtype_bytes(s.op.out_dtype) / bandwidth


def launch_cycles(s: Schedule) -> float:
    """Cycles spent starting parallel instances: each loop run over a compute level with a
    launch cost pays it once per iteration of the loops around it."""
    total = 0.0
    for i, lp in enumerate(s.loops):
        if lp.parallel:
            cl = s.machine.compute_level(lp.parallel)
            total += cl.launch_cycles * math.prod(o.extent for o in s.loops[:i])
    return total


def vector_ops(step) -> int:
    """Vector-unit operations per output element of one epilogue step: a clip is a min and
    a max, the others one operation each."""
    return 2 if step.kind == "clip" else 1


def compute_parts(s: Schedule) -> tuple[dict, float, list[str]]:
    """({"primitive", "reset", "store", "epilogue"}: cycles of each on the busiest unit, padded
    MACs, notes). reset: zeroing each accumulator tile, one primitive issue per block of it;
    store: its write-back where the core's own stores do it (`store_cycles`); epilogue: the
    fused steps on the vector unit of the accumulator's level."""
    m, p = s.machine, s.primitive
    # A predicated edge tile (`Schedule.predicate`) costs a whole one: its columns run one
    # by one where the whole tiles run in vectors.
    padded = math.prod(s.tiled_extents().values())
    units = busy_units(s)
    notes = []
    parts = {"primitive": 0.0, "reset": 0.0, "store": 0.0, "epilogue": 0.0}
    if p is None or not p.macs_per_cycle:
        return parts, padded, ["no primitive rate in the machine file: compute not modelled"]
    eff = issue_efficiency(s)
    feed = feed_efficiency(s)
    # Both stalls hold back the same issue of the primitive, and what each adds to its time
    # adds up: a 7-vector tile of 7 broadcasts, short of accumulators and of load slots alike
    # (87.5% each), ran 10-13% slower than a padded 4 x 2 tile (87.5% of its MACs useful) on
    # conv C9 and C10, where taking the smaller of the two ranked them equal.
    parts["primitive"] = padded / (p.macs_per_cycle * units) * (1 / eff + 1 / feed - 1)
    if eff < 1 and eff <= feed:
        notes.append(f"accumulator tile too small to hide the primitive's latency: "
                     f"{100 * eff:.0f}% of its rate")
    elif feed < 1:
        notes.append(f"accumulator tile too small for the operand loads to keep up: "
                     f"{100 * feed:.0f}% of the primitive's rate")
    acc = next((st for st in s.stages if st.operand == "C"), None)
    if acc is not None:
        issues = p.macs_per_cycle / (p.m * p.n * p.k)
        fills = _fills(s, acc.at)
        parts["reset"] = fills * acc.elements / (p.m * p.n) / (issues * units)
        parts["store"] = fills * store_cycles(s, acc) / units
    vec = next((v for v in m.vectors if acc is not None and v.level == acc.level.name), None)
    ops = sum(vector_ops(step) for step in s.op.epilogue.steps)
    if vec is not None and ops and vec.ops_per_cycle:
        out = s.op.footprint("C", s.padded_extents())
        parts["epilogue"] = out * ops / (vec.ops_per_cycle * units)
        if s.op.epilogue.has_bias and acc.level.managed:
            parts["epilogue"] += bias_cycles(s, acc) / units
    return parts, padded, notes


def bias_cycles(s: Schedule, acc: Stage) -> float:
    """Copying the bias into a managed accumulator level for each accumulator tile: its
    columns, in the accumulator's dtype, one row per fill through the level's mover."""
    ext = _inner_ext(s, acc.at)
    cols = math.prod(e for a, e in ext.items() if s.role_of(a) == "n")
    lv = acc.level
    parent = _parent(s, lv)
    mv = _mover(s, parent.name, lv.name)
    bw = lv.bandwidth or (mv.bytes_per_cycle if mv else 0.0) or parent.bandwidth
    nbytes = cols * dtype_bytes(s.op.acc_dtype)
    per_fill = (mv.latency if mv else 0.0) + (nbytes / bw if bw else 0.0)
    return _fills(s, acc.at) * per_fill


def compute_cycles(s: Schedule) -> tuple[float, float, list[str]]:
    """(cycles of the tensor primitive, the accumulator resets and the epilogue, padded MACs,
    notes)."""
    parts, padded, notes = compute_parts(s)
    return sum(parts.values()), padded, notes


def thread_count(s: Schedule, lp: Loop) -> int:
    """Virtual threads loop `lp` runs as: its level's count of consecutive iterations
    interleaved, where that count divides the extent; otherwise the loop stays serial (1)."""
    count = s.machine.compute_level(lp.parallel).count
    return count if lp.extent % count == 0 else 1


def virtual_threads(s: Schedule, pos: int) -> int:
    """Virtual threads interleaved around loop position `pos` (1: none)."""
    m = s.machine
    return max((thread_count(s, lp) for lp in s.loops[:pos + 1]
                if lp.parallel and m.compute_level(lp.parallel).virtual), default=1)


def explicit_pipeline(s: Schedule, ts: list[Transfer], parts: dict) -> tuple[float, str] | None:
    """Cycles of a program whose every tile is copied explicitly (managed levels), played as
    the loop of accumulator tiles it is, or None when some tile is a hardware cache's.

    Each accumulator tile: reset R, `n` reduction steps that each load `l` (the operand tiles
    staged inside it) and compute `g`, the epilogue E, the write-back S. Loads, compute and
    write-back are separate engines; what couples them is buffering. The accumulator has one
    buffer per virtual thread (V of them): the next tile's reset waits for the write-back
    unless the other threads' epilogues cover it. The operand tiles have `stages` buffers per
    thread: loads run that many steps ahead of compute, and between two tiles' reduction
    steps (resets, epilogues, waits on the write-back) they prefetch only that far. With one
    buffer per thread, a thread's load and compute take turns. Tiles staged outside the
    accumulator tile load between its reduction steps, as the other loads do."""
    acc = next((t for t in ts if t.kind is TransferKind.WRITE_BACK), None)
    if acc is None or not acc.fills:
        return None
    m = s.machine
    if all(st.operand == "C" for st in s.stages) or not all(st.level.managed
                                                           for st in s.stages):
        return None
    units = acc.units
    tiles = acc.fills / units  # accumulator tiles per unit
    inner = [t for t in ts if t.at > acc.at and t.kind is not TransferKind.WRITE_BACK]
    outer = [t for t in ts if t not in inner and t is not acc]
    # Reduction steps per unit (a tile kept across steps has fewer fills than steps).
    steps = max((_fills(s, s.loops[t.at]) for t in inner), default=acc.fills) / units
    n = steps / tiles
    l = sum(t.cycles() for t in inner) / steps if inner else 0.0
    g = parts["primitive"] / steps
    R, E, S = parts["reset"] / tiles, parts["epilogue"] / tiles, acc.fill_cycles()
    hidden_out = sum(t.cycles() for t in outer if t.hidden > 0) / tiles
    serial = sum(max(t.cycles(), t.shared_cycles()) for t in outer if t.hidden == 0)
    V = virtual_threads(s, acc.at)
    depth = max((t.in_flight for t in inner), default=1)  # operand buffers per thread
    N = V * n
    group, pre, load = _tile_group(V, n, l, g, (R, E, S), hidden_out, depth)
    load_path = inner[0].parent if inner else m.memory[0].name
    busiest = max((("compute", V * (R + E) + N * g), (load_path, load), (acc.parent, V * S)),
                  key=lambda kv: kv[1])
    # The last tile's write-back is what is left after the compute: drained in pieces, each
    # after its part of the epilogue, only the last piece's is (`drain_pieces`).
    tail = _drain_piece(acc, drain_pieces(s, acc)).fill_cycles()
    cycles = tiles / V * group + pre + tail + serial
    # Compute starts once the first thread's first tiles are in: one fill of each (a tile
    # kept across steps counts whole, not its share of a step), of which the steady state
    # above prices one step's average. While the load engine has time to spare (it is not
    # the bound), that wait adds to the run.
    first = sum(t.fill_cycles() for t in inner + outer if t.hidden > 0)
    cycles += max(0.0, min(first - pre, tiles / V * (group - load)))
    # Engines that take nearly the same time stall each other now and then (each waits on
    # the other's tokens): a share of the shorter side, growing with the balance.
    work, feed = tiles / V * (V * (R + E) + N * g), tiles / V * load
    if min(work, feed) > 0:
        cycles += ENGINE_STALL * min(work, feed) ** 2 / max(work, feed)
    return cycles, busiest[0]


def _tile_group(V: int, n: float, l: float, g: float, res: tuple[float, float, float],
                hidden_out: float, depth: int) -> tuple[float, float, float]:
    """One round of `explicit_pipeline`'s V threads' accumulator tiles in the steady state:
    (its cycles, the loads prefetched between two tiles' reduction steps, the cycles of the
    loads). `res`: the reset, epilogue and write-back of one tile (R, E, S)."""
    R, E, S = res
    # The reset of a thread's next tile waits for its write-back: the first thread's while
    # the others' epilogues run; each later one is issued after the thread before it has
    # reset and computed its first step.
    stall = max(0.0, S - (V - 1) * E)
    if V > 1:
        stall += max(0.0, S - stall - R - g)
    gap = V * (R + E) + stall  # compute busy (or waiting) on no reduction step
    N = V * n
    load = N * l + V * hidden_out
    if depth >= 2:
        pre = min(depth * V * l, load, gap)
        phase = max(load - pre + g, N * g + max(l - pre, 0.0))
    else:
        # One buffer per thread: a thread's next tiles load only once its step has computed,
        # and the loads are issued in order, operand by operand for every thread in turn, so
        # each round of the V threads waits for one thread's loads after the last compute
        # (or, load-bound, for one compute after the last load).
        pre = min(l, gap)
        phase = n * max(V * g + l, V * l + g) + V * hidden_out - pre
    group = max(V * R + phase + V * E + stall, load, V * S, V * (R + E) + N * g)
    return group, pre, load


def _overlapped(comp, overlap, hidden, serial, prologue, level_cycles) -> tuple[float, str]:
    """(cycles, bound) when movement overlaps compute path by path (hardware caches and
    prefetch): the slowest of compute and each overlapped path, what the overlap leaves
    exposed, the first tiles' fill, and the movement that does not overlap."""
    slowest = max([("compute", comp)] + list(overlap.items()), key=lambda kv: kv[1])
    cycles = slowest[1] + serial
    if overlap:
        worst = max(overlap, key=lambda lv: overlap[lv] * (1 - hidden[lv]))
        cycles += min(comp, overlap[worst]) * (1 - hidden[worst]) + prologue
        # Even a pipelined stage stalls now and then when movement and compute take nearly
        # the same time (each waits on the other's tokens): a share of the shorter side,
        # growing with the balance, stays exposed.
        path = max(overlap.values())
        if min(comp, path) > 0:
            cycles += BALANCE_STALL * min(comp, path) ** 2 / max(comp, path)
    bound = slowest[0] if slowest[1] >= serial else max(
        level_cycles.items(), key=lambda kv: kv[1], default=("compute", 0))[0]
    return cycles, bound


# -- a back end's own program -----------------------------------------------------------------
@dataclass(frozen=True)
class Program:
    """What a back end's program does, as the model prices it: every `Transfer` it makes,
    the cycles of its compute on the busiest unit (the tensor primitive's time with the back
    end's fixed costs, e.g. a systolic array's fill per block, and its vector work), the
    MACs the primitive executes (padding included), and cycles spent in series with all of
    it (per-step overhead, pipeline bubbles). `bound`: what limits it, where the back end's
    own model knows better than the transfers it lists (default: the slowest path)."""

    transfers: tuple
    compute_cycles: float
    padded_macs: int
    serial_cycles: float = 0.0
    notes: tuple = ()
    detail: dict = field(default_factory=dict)
    bound: str = ""
    pipelined: bool = False  # its copies overlap its compute inside `compute_cycles`


_PROGRAMS: dict[str, Callable] = {}


def register_program(backend: str, fn: Callable) -> None:
    """Price schedules of machines of back end `backend` by the program `fn(schedule)`
    returns (a `Program`; None: the schedule's staged tiles, as for any back end)."""
    _PROGRAMS[backend] = fn


def program_of(s: Schedule) -> Program | None:
    fn = _PROGRAMS.get(s.machine.backend)
    return fn(s) if fn is not None else None


# -- the estimate -------------------------------------------------------------------------------
def _paths(ts: list[Transfer]):
    """Per parent level, what `evaluate` overlaps with compute: (bytes into each level, cycles
    of the overlapped path, the least share of it hidden, serial cycles of the transfers not
    overlapped, the prologue's fill cycles, cycles charged to each level for the report)."""
    traffic: dict[str, int] = {}
    path: dict[str, float] = {}  # parent level -> cycles of the transfers out of / into it
    shared: dict[str, float] = {}
    hidden: dict[str, float] = {}
    serial = prologue = 0.0
    for t in ts:
        traffic[t.level] = traffic.get(t.level, 0) + t.total_bytes
        if t.hidden > 0:
            path[t.parent] = path.get(t.parent, 0.0) + t.cycles()
            shared[t.parent] = shared.get(t.parent, 0.0) + t.shared_cycles()
            hidden[t.parent] = min(hidden.get(t.parent, 1.0), t.hidden)
            if t.kind is not TransferKind.WRITE_BACK:
                prologue += t.fill_cycles()
        else:
            serial += max(t.cycles(), t.shared_cycles())
    overlap = {lv: max(path[lv], shared[lv]) for lv in path}
    # Non-overlapped movement is charged to its path too, for the per-level report.
    level_cycles = dict(overlap)
    for t in ts:
        if t.hidden == 0:
            level_cycles[t.parent] = (level_cycles.get(t.parent, 0.0)
                                      + max(t.cycles(), t.shared_cycles()))
    return traffic, overlap, hidden, serial, prologue, level_cycles


def evaluate(s: Schedule, extra: list[Transfer] = (), detail: dict | None = None,
             notes: list[str] = (), program: Program | None = None,
             tiles: bool = False) -> Estimate:
    """The model's `Estimate` of recorded schedule `s` (kind "model"). A back end passes the
    transfers its program makes beyond the staged tiles (`extra`) and its own `detail`.
    `program`: price this `Program` instead (default: the one the machine's back end
    registered for `s`, if any; `tiles=True`: the schedule's staged tiles regardless)."""
    m = s.machine
    clock = m.clock_hz
    if program is None and not tiles:
        program = program_of(s)
    if program is None:
        parts, padded, cnotes = compute_parts(s)
        comp = sum(parts.values())
        ts = transfers(s) + list(extra)
        launches = launch_cycles(s)
    else:
        parts = None
        comp, padded, cnotes = program.compute_cycles, program.padded_macs, list(program.notes)
        ts = list(program.transfers) + list(extra)
        launches = program.serial_cycles
        detail = {**program.detail, **(detail or {})}
    traffic, overlap, hidden, serial, prologue, level_cycles = _paths(ts)
    pipelined = bool(overlap) or (program is not None and program.pipelined)
    # A back end's program brings its own pipeline (compute, transfers, serial cycles);
    # the schedule's staged tiles are played tile by tile where every tile is managed.
    played = explicit_pipeline(s, ts, parts) if program is None else None
    if played is not None:
        cycles, bound = played[0] + launches, played[1]
    else:
        cycles, bound = _overlapped(comp, overlap, hidden, serial, prologue, level_cycles)
        cycles += launches
        bound = program.bound if program is not None and program.bound else bound
    if program is None and launches > 0.1 * cycles:
        cnotes.append(f"starting parallel instances: {launches / clock * 1e6:.1f} us")
    peak = (m.peak(s.op.dtype) or 0.0) / 2  # the file's peak is in operations, a MAC is two
    moves = [f"{t.what} -> {t.level}: {t.bytes:,} B x {t.fills:,}"
             + (f" ({t.rows} rows)" if t.rows > 1 and t.latency else "")
             + ("" if t.hidden == 1 else f", {100 * t.hidden:.0f}% overlapped") for t in ts]
    return Estimate(seconds=cycles / clock, kind="model", machine=m.name, clock_hz=clock,
                    bound=bound, macs=s.op.macs, padded_macs=padded, peak_macs_per_s=peak,
                    compute_seconds=comp / clock, traffic=traffic,
                    level_seconds={lv: c / clock for lv, c in level_cycles.items()},
                    pipelined=pipelined, notes=cnotes + moves + list(notes),
                    detail=dict(detail or {}))
