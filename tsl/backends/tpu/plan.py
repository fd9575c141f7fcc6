"""What a Mosaic (Pallas TPU) kernel is, as data: the grid, one block per operand, the VMEM
scratch, and the XLA passes around the kernel. Read from the scheduled TIR (GEMMs) or from the
schedule's tiles through the TPU's conv2d mapping; priced by `model`, emitted by `mosaic`.

GEMM, from the compacted TIR (see `codegen.compact`):

- every loop with more than one iteration that encloses the staging of A and B into VMEM is a
  grid axis, outer to inner; one annotated `tsl.parallel` (blocks dealt to TensorCores) is
  "parallel", every other one "arbitrary" (sequential on a core; the reduction among them);
- each staged tile is a `BlockSpec`: its shape is the staged buffer's (dims of extent 1 outside
  the last two squeezed), its index map the tile's start in the operand (the copy's indices with
  the copy's own loops at 0) divided by the block shape, checked to be block-aligned;
- the accumulator buffer (scope `global.vmem_acc`) is the VMEM scratch; it is zeroed on the
  first reduction step and written back through the epilogue on the last one;
- the MXU block's loads say which tile dimensions are contracted (`dot_general`).

conv2d (the TPU mapping of the shared conv schedule; see `conv_plan`): rows of the GEMM are
output pixels N·OH·OW, the kernel taps are folded into the contraction (K = R·S·C, the im2col
tile built in VMEM from an input window, the zero padding masked there), and the weight block
stays resident across row blocks.

`schedule_plan` reads the same kernel from the recorded schedule without lowering it: what
the cost model prices for every knob setting (`model.program`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...errors import LoweringError, ScheduleError
from ...tam.machine import dtype_bytes
from .intrinsics import ANNOTATION

PARALLEL_ATTR = "tsl.parallel"


@dataclass(frozen=True)
class Axis:
    name: str
    extent: int
    semantics: str  # "parallel" | "arbitrary"
    reduction: bool


@dataclass(frozen=True)
class Block:
    """One operand of the kernel: the array it is given (after the wrapper's passes), the block
    staged in VMEM per grid step (None = a squeezed dim of 1; `window` dims are element offsets
    of an overlapping input window) and the index map, as text and as a function of the grid
    indices that works on ints and on NumPy or JAX integer arrays."""

    name: str
    shape: tuple
    dtype: str
    block: tuple
    index: Callable = field(compare=False)
    index_text: str = ""
    window: tuple = ()  # dims indexed by element offset (pl.Element), conv input only
    # (low, high) padding of each window dim (pl.Element's padding): the kernel reads the
    # unpadded array, offsets are in padded coordinates, the padded region is masked in VMEM.
    pad: tuple = ()

    @property
    def block_elements(self) -> int:
        return math.prod(b for b in self.block if b is not None)

    @property
    def block_bytes(self) -> int:
        return math.ceil(self.block_elements * dtype_bytes(self.dtype))

    def in_bounds(self, idx: np.ndarray) -> np.ndarray:
        """Elements of the block inside the array at each block index `idx` (steps, rank):
        what a DMA really moves (edge blocks and padded windows move less than the block)."""
        n = np.ones(len(idx), dtype=np.int64)
        for d, (size, full) in enumerate(zip(self.block, self.shape)):
            if size is None:
                continue
            if d in self.window:
                lo = self.pad[d][0] if self.pad else 0
                start = idx[:, d] - lo
            else:
                start = idx[:, d] * size
            n *= np.clip(start + size, 0, full) - np.clip(start, 0, full)
        return n


@dataclass(frozen=True)
class Pass:
    """An XLA op outside the kernel (padding, layout change, crop): HBM bytes it reads and
    writes, for the model."""

    what: str
    read: int
    written: int


@dataclass
class Plan:
    kind: str  # "gemm" | "conv"
    grid: tuple  # Axis, outer to inner
    inputs: tuple  # Block
    out: Block
    acc_shape: tuple
    acc_dtype: str
    # rows x contraction x columns of the MXU work per grid step (one dot_general, or the
    # im2col dot of a conv block): what the MXU model prices
    dot: tuple
    dims: tuple = (((1,), (0,)), ((), ()))  # dot_general dimension numbers of the 2-D tiles
    epilogue: object = None  # tsl Epilogue of the operator
    out_dtype: str = "float32"
    passes: tuple = ()
    conv: dict = field(default_factory=dict)  # the conv mapping's parameters
    source: str = "schedule"  # where the tiles come from: "schedule" or a baseline's name
    _indices: dict = field(default_factory=dict, repr=False, compare=False)  # walk cache

    @property
    def steps(self) -> int:
        return math.prod(a.extent for a in self.grid)

    @property
    def reduction_axes(self) -> list[int]:
        return [i for i, a in enumerate(self.grid) if a.reduction]

    def block_indices(self, blk: Block) -> np.ndarray:
        """The block index of `blk` at every grid step, in the order Pallas runs them
        (lexicographic): an array (steps, rank)."""
        if blk.name not in self._indices:
            if ("grid",) not in self._indices:
                self._indices[("grid",)] = _grid_points([a.extent for a in self.grid])
            idx = self._indices[("grid",)]
            got = blk.index(*[idx[i] for i in range(len(self.grid))])
            cols = [np.broadcast_to(np.asarray(g, dtype=np.int64), (idx.shape[1],)) for g in got]
            self._indices[blk.name] = np.stack(cols, axis=1)
        return self._indices[blk.name]

    def fetches(self, blk: Block) -> np.ndarray:
        """Per grid step, whether the pipeline moves `blk` (its block index differs from the
        previous step's: Pallas keeps a block in VMEM while its index stays the same)."""
        key = ("fetches", blk.name)
        if key not in self._indices:
            bi = self.block_indices(blk)
            change = np.ones(len(bi), dtype=bool)
            change[1:] = np.any(bi[1:] != bi[:-1], axis=1)
            self._indices[key] = change
        return self._indices[key]

    def moved_bytes(self, blk: Block) -> np.ndarray:
        """Bytes the pipeline moves for `blk` at each grid step (0 where it keeps the block)."""
        key = ("moved", blk.name)
        if key not in self._indices:
            idx = self.block_indices(blk)
            per = np.ceil(blk.in_bounds(idx) * dtype_bytes(blk.dtype)).astype(np.int64)
            self._indices[key] = np.where(self.fetches(blk), per, 0)
        return self._indices[key]

    def vmem_bytes(self) -> tuple[int, list[str]]:
        """VMEM the kernel needs: every block double-buffered by the pipeline, the accumulator
        scratch, and the conv mapping's im2col tile."""
        parts, used = [], 0
        for b in self.inputs + (self.out,):
            used += 2 * b.block_bytes
            parts.append(f"{b.name} block {b.block_bytes:,} B x2")
        acc = math.prod(self.acc_shape) * dtype_bytes(self.acc_dtype)
        used += acc
        parts.append(f"accumulator {acc:,} B")
        if self.kind == "conv":
            im2col = self.dot[0] * self.dot[1] * dtype_bytes(self.inputs[0].dtype)
            used += im2col
            parts.append(f"im2col tile {im2col:,} B")
        return used, parts


def _grid_points(ext) -> np.ndarray:
    """Every grid index, in Pallas' (lexicographic) order: an array (rank, steps)."""
    if not ext:
        return np.zeros((0, 1), dtype=np.int64)
    return np.indices(ext).reshape(len(ext), -1)


# -- TIR expressions as functions of the grid indices ------------------------------------------
def _evaluator(expr, names: list[str], zero: set[str]):
    """A function of the grid indices (in the order of `names`) computing TIR index `expr`;
    loop variables in `zero` (extent-1 loops, the copy's own loops) are 0."""
    from tvm import tirx

    def ev(e, env):
        if isinstance(e, tirx.IntImm):
            return int(e.value)
        if isinstance(e, tirx.Var):
            if e.name in zero:
                return 0
            if e.name not in env:
                raise LoweringError(f"index {expr} uses {e.name}, which is not a grid loop")
            return env[e.name]
        if isinstance(e, tirx.Add):
            return ev(e.a, env) + ev(e.b, env)
        if isinstance(e, tirx.Sub):
            return ev(e.a, env) - ev(e.b, env)
        if isinstance(e, tirx.Mul):
            return ev(e.a, env) * ev(e.b, env)
        if isinstance(e, tirx.FloorDiv):
            return div(ev(e.a, env), ev(e.b, env))
        if isinstance(e, tirx.FloorMod):
            return rem(ev(e.a, env), ev(e.b, env))
        raise LoweringError(f"the Mosaic emitter cannot compute index {expr}")

    return lambda *g: ev(expr, dict(zip(names, g)))


def _traced(x) -> bool:
    return not isinstance(x, (int, np.integer, np.ndarray))


def div(a, b):
    """a // b for grid indices (>= 0): Python/NumPy ints, or JAX values inside an index map,
    where Mosaic lowers the truncating division (floor division needs the chip's info)."""
    if _traced(a) or _traced(b):
        from jax import lax
        import jax.numpy as jnp

        return lax.div(jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32))
    return a // b


def rem(a, b):
    if _traced(a) or _traced(b):
        from jax import lax
        import jax.numpy as jnp

        return lax.rem(jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32))
    return a % b


def _vars(e) -> set[str]:
    import tvm_ffi
    from tvm import tirx

    found: set = set()
    tvm_ffi.structural_walk(e, [(tirx.Var, lambda v: found.add(v.name))])
    return found


def _text(e, names) -> str:
    s = str(e)
    for i, n in enumerate(names):
        s = s.replace(n, f"g{i}")
    return s


# -- GEMM: the plan read from the compacted TIR --------------------------------------------------
@dataclass
class _Leaf:
    loops: list  # enclosing For nodes with more than one iteration, outer to inner
    unit: set  # names of enclosing loops of extent 1
    chain: list  # the leaf's own loops
    block: object
    mxu: bool = False


def _leaves(func) -> list[_Leaf]:
    from tvm import s_tir, tirx

    from .codegen import _chain

    out: list[_Leaf] = []

    def walk(s, loops, unit):
        if isinstance(s, tirx.SeqStmt):
            for x in s.seq:
                walk(x, loops, unit)
        elif isinstance(s, s_tir.SBlockRealize):
            blk = s.block
            if ANNOTATION in blk.annotations:
                out.append(_Leaf(loops, unit, [], blk, True))
            elif isinstance(blk.body, tirx.BufferStore):
                out.append(_Leaf(loops, unit, [], blk))
            else:
                walk(blk.body, loops, unit)
        elif isinstance(s, tirx.For):
            chain, blk = _chain(s)
            if blk is not None:
                out.append(_Leaf(loops, unit, chain, blk, ANNOTATION in blk.annotations))
            elif int(s.extent) == 1:
                walk(s.body, loops, unit | {s.loop_var.name})
            else:
                walk(s.body, loops + [s], unit)
        else:
            raise LoweringError(f"the Mosaic emitter does not handle {type(s).__name__}")

    walk(func.body, [], set())
    return out


def gemm_plan(func, op, tsl_op) -> Plan:
    """The Pallas kernel of a scheduled GEMM (matmul, batch_matmul, dense): see the module
    docstring. `op` is the padded operator the TIR computes, `tsl_op` the user's."""
    from .codegen import _param_buffers, _shape

    *ins, out = _param_buffers(func)
    leaves = _leaves(func)
    copies, mxu, wb = _gemm_leaves(leaves, ins, out)
    grid = _gemm_grid(copies[ins[0].name], copies[ins[1].name], wb)
    names = [a.name for a in grid]
    arrays = {b.name: _shape(b) for b in ins + [out]}
    blocks = []
    for buf in ins:
        if buf.name in copies:
            lf = copies[buf.name]
            st = lf.block.body
            blocks.append(_block_of(buf.name, list(st.value.indices), lf.chain,
                                    _shape(st.buffer), str(buf.dtype), lf.unit, names, arrays))
    out_blk = _block_of(out.name, list(wb.block.body.indices), wb.chain, None, str(out.dtype),
                        wb.unit, names, arrays)
    blocks += _channel_blocks([b for b in ins if b.name not in copies], out_blk)
    for b in blocks + [out_blk]:
        _check_aligned(b, grid)
    # The accumulator and the contraction.
    acc_bufs = {lf.block.body.buffer.name: lf.block.body.buffer for lf in leaves
                if not lf.mxu and lf.block.body.buffer.scope() == "global.vmem_acc"}
    if len(acc_bufs) != 1:
        raise LoweringError(f"expected one accumulator in VMEM, found {sorted(acc_bufs)}")
    acc = next(iter(acc_bufs.values()))
    acc_shape = tuple(d for d in _shape(acc) if d != 1) or (1,)
    dims, dot = _contraction(mxu, blocks[0], blocks[1], acc.name)
    if tuple(b for b in out_blk.block if b is not None) != acc_shape:
        raise LoweringError(f"the accumulator tile {acc_shape} is not the output block "
                            f"{out_blk.block}")
    return Plan("gemm", grid, tuple(blocks), out_blk, acc_shape, str(acc.dtype), dot, dims,
                tsl_op.epilogue, str(out.dtype), tuple(gemm_passes(tsl_op, op)))


def _gemm_leaves(leaves: list[_Leaf], ins, out):
    """(the copies into VMEM by source buffer, the MXU leaf, the output's write) of a GEMM's
    leaves, each checked to be there once."""
    from .codegen import _Load

    copies = {lf.block.body.value.source.name: lf for lf in leaves
              if not lf.mxu and isinstance(lf.block.body.value, _Load())
              and lf.block.body.buffer.scope() == "global.vmem"}
    mxu = [lf for lf in leaves if lf.mxu]
    writes = [lf for lf in leaves if not lf.mxu and lf.block.body.buffer.name == out.name]
    if len(mxu) != 1:
        raise ScheduleError(f"the TPU back end needs the schedule to tensorize the product onto "
                            f"the MXU once (found {len(mxu)} MXU blocks); call "
                            f"s.tensorize(<the primitive's loop>)")
    if ins[0].name not in copies or ins[1].name not in copies:
        raise ScheduleError("the Mosaic kernel stages A and B in VMEM; the schedule must "
                            "cache('A', 'scratchpad', ...) and cache('B', 'scratchpad', ...)")
    if len(writes) != 1:
        raise LoweringError(f"the kernel writes its output in {len(writes)} places, not one")
    return copies, mxu[0], writes[0]


def _gemm_grid(a: _Leaf, b: _Leaf, wb: _Leaf) -> tuple[Axis, ...]:
    """The grid: loops of more than one iteration around the staging, outer to inner."""
    grid_loops = a.loops
    if [f.loop_var.name for f in b.loops] != [f.loop_var.name for f in grid_loops]:
        raise LoweringError("A and B are staged under different loops; the Mosaic kernel "
                            "stages both at the same grid step")
    out_vars = set().union(*(_vars(e) for e in wb.block.body.indices))
    grid = tuple(Axis(f.loop_var.name, int(f.extent),
                      "parallel" if PARALLEL_ATTR in f.annotations else "arbitrary",
                      f.loop_var.name not in out_vars) for f in grid_loops)
    if any(a.reduction and a.semantics == "parallel" for a in grid):
        raise LoweringError("a reduction loop is parallel")
    return grid


def _block_of(name, indices, chain, buf_shape, dtype, zero, names, arrays) -> Block:
    """The block of array `name` (of shape `arrays[name]`) that a copy or write at `indices`
    under its own loops `chain` moves per grid step (grid loop names `names`)."""
    own = {f.loop_var.name for f in chain}
    starts = [_evaluator(e, names, zero | own) for e in indices]
    full = arrays[name]
    tile = list(buf_shape) if buf_shape is not None else \
        [math.prod(int(f.extent) for f in chain if f.loop_var.name in _vars(e)) or 1
         for e in indices]
    if len(tile) != len(full):
        raise LoweringError(f"the tile of {name} has rank {len(tile)}, the array "
                            f"{len(full)}")
    block = tuple(None if t == 1 and d < len(full) - 2 else t for d, t in enumerate(tile))
    sizes = [t for t in tile]

    def index(*g):
        return tuple(div(s(*g), sz) if b is not None else s(*g)
                     for s, sz, b in zip(starts, sizes, block))
    text = "(" + ", ".join(f"({_text(e, names)}) // {sz}" if b is not None else
                           _text(e, names) for e, sz, b in
                           zip([_zero_own(e, own | zero) for e in indices], sizes, block)) + ")"
    return Block(name, full, dtype, block, index, text)


def _channel_blocks(extra, out_blk: Block) -> list[Block]:
    """Per-channel inputs of the epilogue (the bias): a (1, N) array, blocked like the output's
    last dimension."""
    from .codegen import _shape

    blocks = []
    for buf in extra:
        if len(_shape(buf)) != 1 or _shape(buf)[0] != out_blk.shape[-1]:
            raise LoweringError(f"the Mosaic kernel reads {buf.name} {_shape(buf)} only as a "
                                f"per-channel vector along the output's last dimension")
        n_blk = out_blk.block[-1]
        last = out_blk.index

        def index(*g, last=last):
            return (0, last(*g)[-1])
        blocks.append(Block(buf.name, (1,) + _shape(buf), str(buf.dtype), (1, n_blk), index,
                            f"(0, {out_blk.index_text.rsplit(',', 1)[-1].strip(' )')})"))
    return blocks


def _zero_own(e, names):
    from .codegen import _zero

    return _zero(e, names)


def _check_aligned(b: Block, grid) -> None:
    """Every block index must address a whole block: the start of the staged tile is a
    multiple of the block shape at every grid step (checked on the grid's corners and a
    sample, exhaustively when it is small)."""
    ext = [a.extent for a in grid]
    idx = _grid_points(ext) if math.prod(ext) <= 1 << 16 else \
        np.array([np.random.default_rng(0).integers(0, e, 4096) for e in ext])
    got = b.index(*[idx[i] for i in range(len(ext))])
    for d, (g, n, blk) in enumerate(zip(got, b.shape, b.block)):
        g = np.asarray(g)
        size = blk or 1
        if np.any(g < 0) or np.any((g + 1) * size > n):
            raise LoweringError(f"block {d} of {b.name} leaves the array {b.shape}")


def _contraction(leaf: _Leaf, a: Block, b: Block, acc_name: str):
    """dot_general dimension numbers of the squeezed A and B tiles, from the MXU block's
    loads, and (rows, contraction, columns) of the dot."""
    from tvm import tirx

    from .codegen import _loads

    st = leaf.block.body
    while not isinstance(st, tirx.BufferStore):
        st = st.body if not hasattr(st, "block") else st.block.body
    acc_vars = [_vars(e) for e in st.indices]
    loads = {x.source.name: x for x in _loads(st.value) if x.source.name != acc_name}
    if len(loads) != 2:
        raise LoweringError(f"the MXU block reads {sorted(loads)}, not two staged tiles")
    (la, lb) = [loads[n] for n in loads]
    if la.source.name.split("_")[0] != a.name:
        la, lb = lb, la

    def kept(load, blk):
        return [(d, _vars(e)) for d, (e, bl) in enumerate(zip(load.indices, blk.block))
                if bl is not None]
    ka, kb = kept(la, a), kept(lb, b)
    all_acc = set().union(*acc_vars)
    ca = [i for i, (_, v) in enumerate(ka) if not v & all_acc]
    cb = [i for i, (_, v) in enumerate(kb) if not v & all_acc]
    if len(ka) != 2 or len(kb) != 2 or len(ca) != 1 or len(cb) != 1:
        raise LoweringError("the MXU block is not a 2-D product of its staged tiles")
    ab = [bl for bl in a.block if bl is not None]
    bb = [bl for bl in b.block if bl is not None]
    rows, k, cols = ab[1 - ca[0]], ab[ca[0]], bb[1 - cb[0]]
    return (((ca[0],), (cb[0],)), ((), ())), (rows, k, cols)


# -- conv2d: the TPU mapping ----------------------------------------------------------------------
def stage_tiles(s) -> dict:
    """The tiles of a recorded schedule per (operand, level role), per operator axis: what
    each staged tile spans (the extents of the loops inside where it is staged)."""
    out = {}
    for st in s.stages:
        inner = s.loops[s.loops.index(st.at) + 1:]
        ext = {a.name: 1 for a in s.op.axes}
        for lp in inner:
            for part in lp.parts or (lp,):
                ext[part.axes[0]] *= part.extent
        out[(st.operand, st.level.role)] = ext
    return out


def schedule_plan(s, row_group: int) -> Plan:
    """The kernel a recorded schedule becomes, without lowering it (what the cost model
    prices for every knob setting): conv2d by `conv_plan`, GEMMs by `schedule_gemm_plan`.
    Kept on the schedule: the knob search checks it and prices it."""
    plan = s.__dict__.get("_tpu_plan")
    if plan is None:
        plan = conv_plan(s, row_group) if s.op.name == "conv2d" else schedule_gemm_plan(s)
        s.__dict__["_tpu_plan"] = plan
    return plan


def _digits(lp, g):
    """Per part of loop `lp` (a fused loop's parts, outer to inner; else the loop itself):
    (part, its index) at grid index `g`."""
    parts = lp.parts or (lp,)
    out, inner = [], 1
    for part in reversed(parts):
        out.append((part, rem(div(g, inner), part.extent)))
        inner *= part.extent
    return out


def schedule_gemm_plan(s) -> Plan:
    """The Pallas kernel of a recorded GEMM schedule, read from its loops as `gemm_plan` reads
    it from the lowered TIR (the tests check they agree): the loops of more than one
    iteration around the staging of A and B are the grid ("parallel" where bound to a core
    level), the staged tiles the blocks, the accumulator tile the output block."""
    tiles = stage_tiles(s)
    a_st = next((st for st in s.stages if st.operand == "A" and st.level.role == "scratchpad"),
                None)
    if a_st is None or ("C", "accumulator") not in tiles or ("B", "scratchpad") not in tiles:
        raise ScheduleError("the Mosaic kernel stages A and B in VMEM and C in the accumulator; "
                            "the schedule must cache('A'/'B', 'scratchpad', ...) and "
                            "cache('C', 'accumulator', ...)")
    op = s.op.padded(s.padded_extents())
    loops = [lp for lp in s.loops[:s.loops.index(a_st.at) + 1] if lp.extent > 1]
    grid = tuple(Axis(lp.name, lp.extent, "parallel" if lp.parallel else "arbitrary",
                      any(s.role_of(a) == "k" for a in lp.axes)) for lp in loops)

    def block(name, operand, tensor, ext) -> Block:
        dims = op.tile_shape(operand, ext)
        blk = tuple(None if tile == 1 and d < len(dims) - 2 else tile
                    for d, (_, tile, _) in enumerate(dims))

        def index(*g):
            start = {}
            for lp, gi in zip(loops, g):
                for part, digit in _digits(lp, gi):
                    start[part.axes[0]] = start.get(part.axes[0], 0) + digit * part.step
            return tuple(div(start.get(ax, 0), tile) for ax, tile, _ in dims)
        text = "(" + ", ".join(f"{ax} // {tile}" for ax, tile, _ in dims) + ")"
        return Block(name, tensor.shape, tensor.dtype, blk, index, text)

    a = block("A", "A", op.inputs[0], tiles[("A", "scratchpad")])
    b = block("B", "B", op.inputs[1], tiles[("B", "scratchpad")])
    out = block("C", "C", op.output, tiles[("C", "accumulator")])
    out = Block(out.name, out.shape, op.out_dtype, out.block, out.index, out.index_text)
    ins = [a, b]
    if op.epilogue.has_bias:
        last = out.index
        ins.append(Block("bias", (1, op.output.shape[-1]), op.acc_dtype, (1, out.block[-1]),
                         lambda *g, last=last: (0, last(*g)[-1]), "(0, j // n)"))
    one = {a.name: 1 for a in op.axes}
    ka = [d for d, (ax, _, _) in enumerate(op.tile_shape("A", one)) if s.role_of(ax) == "k"]
    kb = [d for d, (ax, _, _) in enumerate(op.tile_shape("B", one)) if s.role_of(ax) == "k"]
    lead = len(a.shape) - 2
    ca, cb = ka[0] - lead, kb[0] - lead
    a2, b2 = a.block[-2:], b.block[-2:]
    dot = (a2[1 - ca], a2[ca], b2[1 - cb])
    acc = tuple(d for d in out.block if d is not None)
    return Plan("gemm", grid, tuple(ins), out, acc, op.acc_dtype, dot,
                (((ca,), (cb,)), ((), ())), s.op.epilogue, op.out_dtype,
                tuple(gemm_passes(s.op, op)))


def gemm_passes(user, op) -> list[Pass]:
    """The XLA passes around a GEMM kernel of padded operator `op`: pad each input of the
    user's operator `user` that differs, crop the output."""
    passes = []
    for t, tb in zip(user.inputs, op.inputs):
        if t.shape != tb.shape:
            size = dtype_bytes(t.dtype)
            passes.append(Pass(f"pad {t.name} {t.shape} -> {tb.shape}",
                               math.ceil(math.prod(t.shape) * size),
                               math.ceil(math.prod(tb.shape) * size)))
    if user.output.shape != op.output.shape:
        size = dtype_bytes(op.out_dtype)
        passes.append(Pass(f"crop out {op.output.shape} -> {user.output.shape}",
                           math.ceil(math.prod(user.output.shape) * size),
                           math.ceil(math.prod(user.output.shape) * size)))
    return passes


def conv_plan(s, row_group: int) -> Plan:
    """conv2d on the MXU as a GEMM, with the tiles of the shared conv schedule: the
    accumulator tile's oh x ow pixel rows hold th = pixels // OW whole output rows (at least
    one, at most OH): where the primitive's rows are wider than an output row, the schedule
    pads ow to them, and the kernel fills those rows with the next output rows instead of
    padding; its accumulator never exceeds the schedule's tile. The tile's channels are the
    output-channel block, the staged input tile's channels the input-channel block. See
    `conv_plan_for`."""
    tiles = stage_tiles(s)
    acc = tiles.get(("C", "accumulator"))
    a_t = tiles.get(("A", "scratchpad"))
    if acc is None or a_t is None:
        raise ScheduleError("the TPU conv2d kernel needs the accumulator staged "
                            "(cache('C', 'accumulator', ...)) and the input staged in VMEM "
                            "(cache('A', 'scratchpad', ...))")
    P, Q = _pq(s.op)
    th = max(1, min(P, acc["oh"] * acc["ow"] // Q))
    return conv_plan_for(s.op, th, acc["co"], a_t["ci"], row_group)


def _pq(op) -> tuple[int, int]:
    o = op.output.shape
    return (o[2], o[3]) if op.params["layout"] == "NCHW" else (o[1], o[2])


def channel_block(want: int, full: int, lane: int = 128) -> int:
    """A block of a channel dimension Mosaic accepts: the whole dimension, or a multiple of
    the lane width; for a contracted dimension it must also divide it (an edge block's
    out-of-bounds channels would enter the sum), so the largest such multiple <= `want`."""
    if want >= full or want < lane:
        return full
    return next((c for c in range(want // lane * lane, 0, -lane) if full % c == 0), full)


def _conv_layout_passes(op) -> tuple[Pass, ...]:
    """The XLA passes around the kernel (which reads NHWC data and RSCK weights and writes NHWC)
    for an NCHW conv2d: none for an NHWC one."""
    if op.params["layout"] != "NCHW":
        return ()
    N, C, H, W, K, R, S = op.params["shape"]
    P, Q = _pq(op)
    size = dtype_bytes(op.dtype)
    return (Pass("transpose A NCHW->NHWC", math.ceil(N * C * H * W * size),
                 math.ceil(N * C * H * W * size)),
            Pass("transpose weights KCRS->RSCK", math.ceil(R * S * C * K * size),
                 math.ceil(R * S * C * K * size)),
            Pass("transpose out NHWC->NCHW", *[math.ceil(N * P * Q * K *
                                                         dtype_bytes(op.out_dtype))] * 2))


def conv_plan_for(op, th: int, co: int, ci: int, row_group: int,
                  source: str = "schedule") -> Plan:
    """conv2d on the MXU as a GEMM (rows from N·OH·OW, taps folded into the contraction),
    reading and writing the operator's own arrays: no padding, layout or crop pass for NHWC.

    Grid (channel block, n, row block, ci block). Per step the kernel gets the input window of
    its th output rows ((th-1)*stride + (R-1)*dilation + 1 rows x the window's width:
    element-offset blocks, the convolution's zero padding fused into the window as
    pl.Element padding and masked to zero in VMEM), builds the im2col tile (th*OW padded to
    the row group, R*S*ci) in VMEM and multiplies it by the weight block (R*S*ci, co): one dot
    with K = R·S·ci. The output block is (th, OW, co) of the (N, OH, OW, K) output: an edge
    block past OH or K is cut by the pipeline (its extra rows are computed, not stored). The
    weight block's index does not depend on the row block and the channel-block axis is
    outermost, so the weights stay in VMEM while the row blocks run.
    """
    N, C, H, W, K, R, S = op.params["shape"]
    stride, pad, dil = op.params["stride"], op.params["padding"], op.params["dilation"]
    P, Q = _pq(op)
    th = max(1, min(th, P))
    co = K if co >= K else max(128, co // 128 * 128)
    ci = channel_block(ci, C)
    nr, nc, nk = -(-P // th), -(-K // co), C // ci
    rows = th * Q
    rows_p = -(-rows // row_group) * row_group
    hin = (th - 1) * stride + (R - 1) * dil + 1
    win = (Q - 1) * stride + (S - 1) * dil + 1
    if win != W:  # Mosaic: a block's second-minor dim is the array's or a multiple of 8
        win = -(-win // 8) * 8
    h_need = (nr * th - 1) * stride + (R - 1) * dil + 1
    pad_h = (pad, max(0, h_need - H - pad))
    pad_w = (pad, max(0, win - W - pad))
    dt = op.dtype
    # Grid (co, n, rows, ci): the weights stay resident while n and the row blocks run.
    x = Block("A", (N, H, W, C), dt, (1, hin, win, ci),
              lambda c, n, r, k: (n, r * (th * stride), 0, k * ci),
              f"(g1, g2 * {th * stride}, 0, g3 * {ci})", window=(0, 1, 2, 3),
              pad=((0, 0), pad_h, pad_w, (0, 0)))
    w = Block("B", (R * S, C, K), dt, (R * S, ci, co), lambda c, n, r, k: (0, k, c),
              "(0, g3, g0)")
    ins = [x, w]
    if op.epilogue.has_bias:
        ins.append(Block("bias", (1, K), op.acc_dtype, (1, co), lambda c, n, r, k: (0, c),
                         "(0, g0)"))
    out_dt = op.out_dtype
    o = Block("out", (N, P, Q, K), out_dt, (None, th, Q, co),
              lambda c, n, r, k: (n, r, 0, c), "(g1, g2, 0, g0)")
    grid = (Axis("co", nc, "parallel", False), Axis("n", N, "parallel", False),
            Axis("rows", nr, "parallel", False), Axis("ci", nk, "arbitrary", True))
    return Plan("conv", grid, tuple(ins), o, (rows_p, co), op.acc_dtype, (rows_p, R * S * ci, co),
                (((1,), (0,)), ((), ())), op.epilogue, out_dt, _conv_layout_passes(op),
                conv=dict(N=N, C=C, H=H, W=W, K=K, R=R, S=S, P=P, Q=Q, stride=stride, pad=pad,
                          dil=dil, th=th, rows=rows, ci=ci, co=co, hin=hin, win=win,
                          masked=bool(pad or pad_h[1] or pad_w[1]),
                          layout=op.params["layout"]), source=source)
