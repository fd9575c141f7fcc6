"""Lowered TIR -> an XLA program (StableHLO text) whose loop and tile structure is the schedule's.

The emitter walks the scheduled TIR after buffer compaction, where every staged buffer has the
shape of its tile and is allocated inside the loop that stages it:

- a loop that stages something (a copy into VMEM, the accumulator's zeroing, the write-back)
  becomes a `stablehlo.while` that carries every tensor it updates: the accumulator tile, the
  output, prefetched operand tiles. Extent-1 loops disappear;
- a copy into a VMEM scope becomes `dynamic_slice` of the operand at the tile's start;
- the marked MXU block together with the loops between it and the innermost staging (they
  sequence MXU passes over tiles already in VMEM, which XLA's TPU compiler does for a dot) becomes
  one `dot_general` of the staged tiles, bf16 x bf16 -> f32 or int8 x int8 -> int32. Window
  loops of a convolution (a reduction index added to an output index) are unrolled into one dot
  per tap on a static slice of the staged tile;
- the write-back applies the epilogue element-wise and leaves through `dynamic_update_slice`;
- a zero-padding stage (conv2d's A_pad) becomes `stablehlo.pad`;
- a stage inside a pipelined loop (stages >= 2) is double-buffered: its tile for the next
  iteration of the enclosing loops is sliced while the current one is used, and carried.

`program` wraps the kernel: its `main` takes the user's shapes, pads them to the scheduled
(MXU-multiple) shapes explicitly and slices the result; `entry="padded"` makes the kernel itself
`main`, which is what the artifact runs (its inputs are padded by the base class).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...errors import LoweringError
from ...tam.machine import dtype_bytes
from .intrinsics import ANNOTATION, mlir_type
from .lowering import PARALLEL, PIPELINE

INDEX = "i32"


def compact(mod):
    """The scheduled PrimFunc with staged buffers shrunk to their tiles and allocated where
    they are staged; blocks become opaque, so every access is written in loop variables."""
    import tvm
    from tvm import s_tir, tirx

    passes = tvm.transform.Sequential([
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation(),
        tirx.transform.StmtSimplify()])
    return passes(mod)["main"]


@dataclass(frozen=True)
class Value:
    name: str
    shape: tuple
    dtype: str  # MLIR element type

    @property
    def type(self) -> str:
        return tensor_type(self.shape, self.dtype)


def tensor_type(shape, dtype: str) -> str:
    return f"tensor<{''.join(f'{d}x' for d in shape)}{dtype}>"


@dataclass
class Structure:
    """What the emitter made, for tests and the estimate: while loops (name, trips), dynamic
    slices (tile shapes), dots (lhs, rhs, result shapes), the iterations of the loops around
    the dots, the prefetched (double-buffered) stages and the padding passes."""

    loops: list = field(default_factory=list)
    slices: list = field(default_factory=list)
    dots: list = field(default_factory=list)
    dot_trips: int = 1
    prefetched: list = field(default_factory=list)
    pads: list = field(default_factory=list)  # (bytes read, bytes written) of each pad op


@dataclass
class _Prefetch:
    outer: object  # the outermost enclosing loop with more than one iteration
    grid: list  # (loop var name, extent) of every enclosing loop with more than one iteration
    store: object  # the copy's BufferStore
    nest: dict  # its own loops: var name -> extent
    started: bool = False


def program(func, user_inputs, user_output, entry: str = "user") -> tuple[str, Structure]:
    """StableHLO text of the compacted PrimFunc `func` (see the module docstring)."""
    em = _Emitter(func)
    body = em.kernel()
    *ins, out = _param_buffers(func)
    kin = [Value(f"%arg{i}", _shape(b), mlir_type(b.dtype)) for i, b in enumerate(ins)]
    kout = Value("", _shape(out), mlir_type(out.dtype))
    if entry == "padded":
        return _module([_func("main", kin, kout, body, public=True)]), em.structure
    if entry != "user":
        raise ValueError(f"entry must be 'user' or 'padded', got {entry!r}")
    uin = [Value(f"%arg{i}", tuple(t.shape), mlir_type(t.dtype)) for i, t in enumerate(user_inputs)]
    uout = Value("", tuple(user_output.shape), mlir_type(user_output.dtype))
    wrap = []
    args = []
    for u, k in zip(uin, kin):
        if u.shape == k.shape:
            args.append(u.name)
            continue
        if not wrap:
            wrap.append("// explicit padding to the scheduled (MXU-multiple) shapes")
        z = f"%zero{len(args)}"
        wrap.append(f"{z} = stablehlo.constant dense<{_literal(0, k.dtype)}> : tensor<{k.dtype}>")
        high = [b - a for a, b in zip(u.shape, k.shape)]
        wrap.append(f"%pad{len(args)} = stablehlo.pad {u.name}, {z}, low = {_ints([0] * len(high))}"
                    f", high = {_ints(high)}, interior = {_ints([0] * len(high))} : "
                    f"({u.type}, tensor<{k.dtype}>) -> {k.type}")
        args.append(f"%pad{len(args)}")
    wrap.append(f"%tiled = func.call @tiled({', '.join(args)}) : "
                f"({', '.join(k.type for k in kin)}) -> {kout.type}")
    res = "%tiled"
    if uout.shape != kout.shape:
        ranges = ", ".join(f"0:{n}" for n in uout.shape)
        wrap.append(f"%crop = stablehlo.slice %tiled [{ranges}] : ({kout.type}) -> {uout.type}")
        res = "%crop"
    wrap.append(f"return {res} : {uout.type}")
    return _module([_func("main", uin, uout, wrap, public=True),
                    _func("tiled", kin, kout, body, public=False)]), em.structure


def _module(funcs) -> str:
    return "module @tsl {\n" + "\n".join(funcs) + "}\n"


def _func(name, ins, out, body, public) -> str:
    """A func.func; public entry points declare row-major layouts on every argument and the
    result, which the runtime reads back to place inputs (XLA does not check layouts)."""
    def lay(v):
        if not public:
            return ""
        m2m = ",".join(str(d) for d in reversed(range(len(v.shape))))
        return f' {{mhlo.layout_mode = "{{{m2m}}}"}}'
    args = ", ".join(f"{v.name}: {v.type}{lay(v)}" for v in ins)
    head = f"func.func {'public' if public else 'private'} @{name}({args}) -> ({out.type}{lay(out)}) {{"
    return "\n".join(["  " + head] + ["    " + ln for ln in body] + ["  }"]) + "\n"


def _shape(buf) -> tuple:
    return tuple(int(d) for d in buf.shape)


def _ints(xs) -> str:
    return "[" + ", ".join(str(int(x)) for x in xs) + "]"


def _literal(v, dtype: str) -> str:
    if dtype.startswith(("f", "bf")):
        return f"{float(v):.9e}"
    return str(int(v))


class _Emitter:
    def __init__(self, func):
        self.func = func
        self.lines: list[str] = []
        self.depth = 0
        self.count = 0
        self.consts: list[dict] = [{}]
        self.ivs: dict[str, Value] = {}  # loop var name -> i32 scalar
        self.bufs: dict[str, Value] = {}  # buffer name (or "pf:" name) -> current tensor
        self.prefetch: dict[str, _Prefetch] = {}  # staged buffer name -> plan
        self.trips = 1
        self.structure = Structure()

    # -- text ------------------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    def fresh(self, hint: str = "v") -> str:
        self.count += 1
        return f"%{hint}{self.count}"

    def op(self, rhs: str, shape, dtype: str, hint: str = "v") -> Value:
        v = Value(self.fresh(hint), tuple(shape), dtype)
        self.line(f"{v.name} = {rhs}")
        return v

    def constant(self, value, shape=(), dtype: str = INDEX) -> Value:
        key = (value, tuple(shape), dtype)
        for scope in reversed(self.consts):
            if key in scope:
                return scope[key]
        v = self.op(f"stablehlo.constant dense<{_literal(value, dtype)}> : "
                    f"{tensor_type(shape, dtype)}", shape, dtype, "c")
        self.consts[-1][key] = v
        return v

    def binary(self, name: str, a: Value, b: Value) -> Value:
        return self.op(f"stablehlo.{name} {a.name}, {b.name} : {a.type}", a.shape, a.dtype)

    # -- walking the TIR ---------------------------------------------------------------------
    def kernel(self) -> list[str]:
        f = self.func
        *ins, out = _param_buffers(f)
        self.out = out.name
        self.params = {b.name: Value(f"%arg{i}", _shape(b), mlir_type(b.dtype))
                       for i, b in enumerate(ins)}
        self.line("// the output: zeros, carried through every loop that writes a tile of it")
        self.bufs[out.name] = self.constant(0, _shape(out), mlir_type(out.dtype))
        self._plan(f.body, [])
        self.stmt(f.body)
        res = self.bufs[out.name]
        self.line(f"return {res.name} : {res.type}")
        return self.lines

    def stmt(self, s) -> None:
        from tvm import s_tir, tirx

        if isinstance(s, tirx.SeqStmt):
            for x in s.seq:
                self.stmt(x)
        elif isinstance(s, tirx.For):
            self.loop(s)
        elif isinstance(s, s_tir.SBlockRealize):
            self.block([], s.block)
        else:
            raise LoweringError(f"the TPU emitter does not handle {type(s).__name__}: {s}")

    def block(self, chain, blk) -> None:
        from tvm import tirx

        if ANNOTATION in blk.annotations:
            self.primitive(chain, blk)
        elif isinstance(blk.body, tirx.BufferStore):
            self.leaf(chain, blk)
        else:
            self.stmt(blk.body)

    def loop(self, f) -> None:
        chain, blk = _chain(f)
        if blk is not None:
            return self.block(chain, blk)
        if int(f.min) != 0:
            raise LoweringError(f"loop {f.loop_var.name} starts at {f.min}, not 0")
        extent = int(f.extent)
        if extent == 1:
            self.ivs[f.loop_var.name] = self.constant(0)
            return self.stmt(f.body)
        self.while_loop(f, extent)

    def while_loop(self, f, extent: int) -> None:
        for name, pf in self.prefetch.items():
            if not pf.started and pf.outer.same_as(f):
                self.prologue(name, pf)
        written = _written(f.body)
        carried = [n for n in self.bufs if n in written or
                   (n.startswith("pf:") and n[3:] in written)]
        inits = [self.constant(0)] + [self.bufs[n] for n in carried]
        args = [self.fresh("it")] + [self.fresh("acc" if not n.startswith("pf:") else "pf")
                                     for n in carried]
        res = self.fresh("w")
        notes = []
        if PARALLEL in f.annotations:
            notes.append(f"parallel over {f.annotations[PARALLEL]}")
        if PIPELINE in f.annotations:
            notes.append(f"pipelined, {int(f.annotations[PIPELINE])} stages")
        self.structure.loops.append((f.loop_var.name, extent))
        self.line(f"// for {f.loop_var.name} in range({extent})"
                  + (f"  [{'; '.join(notes)}]" if notes else ""))
        self.line(f"{res}:{len(inits)} = stablehlo.while("
                  + ", ".join(f"{a} = {v.name}" for a, v in zip(args, inits)) + ") : "
                  + ", ".join(v.type for v in inits))
        self.line("cond {")
        self.depth += 1
        self.consts.append({})
        iv = Value(args[0], (), INDEX)
        p = self.op(f"stablehlo.compare LT, {iv.name}, {self.constant(extent).name}, SIGNED : "
                    f"(tensor<i32>, tensor<i32>) -> tensor<i1>", (), "i1", "p")
        self.line(f"stablehlo.return {p.name} : tensor<i1>")
        self.consts.pop()
        self.depth -= 1
        self.line("} do {")
        self.depth += 1
        self.consts.append({})
        saved = dict(self.ivs), dict(self.bufs), self.trips
        self.ivs[f.loop_var.name] = iv
        for n, a, v in zip(carried, args[1:], inits[1:]):
            self.bufs[n] = Value(a, v.shape, v.dtype)
        self.trips *= extent
        self.stmt(f.body)
        outs = [self.binary("add", iv, self.constant(1))] + [self.bufs[n] for n in carried]
        self.line(f"stablehlo.return {', '.join(v.name for v in outs)} : "
                  f"{', '.join(v.type for v in outs)}")
        self.ivs, self.bufs, self.trips = saved
        self.consts.pop()
        self.depth -= 1
        self.line("}")
        for i, (n, v) in enumerate(zip(carried, inits[1:])):
            self.bufs[n] = Value(f"{res}#{i + 1}", v.shape, v.dtype)

    # -- leaf blocks: copy, zero, write-back, pad --------------------------------------------
    def leaf(self, chain, blk) -> None:
        from tvm import tirx

        st = blk.body
        nest = {f.loop_var.name: int(f.extent) for f in chain}
        dst = st.buffer.name
        if dst == self.out:
            self.write_back(st, nest)
        elif _is_buffer_load(st.value) and st.buffer.scope().startswith("global."):
            self.copy(st, nest)
        elif isinstance(st.value, (tirx.IntImm, tirx.FloatImm)):
            if math.prod(nest.values()) != math.prod(_shape(st.buffer)):
                raise LoweringError(f"block {blk.name_hint!r} sets part of {dst}")
            self.bufs[dst] = self.constant(st.value.value, _shape(st.buffer),
                                           mlir_type(st.buffer.dtype))
        elif _is_call(st.value, "if_then_else"):
            self.pad(st, nest)
        else:
            raise LoweringError(f"the TPU emitter cannot turn block {blk.name_hint!r} into XLA "
                                f"ops: {st}")

    def tile(self, indices, nest) -> tuple[list, list, list]:
        """(starts, sizes, loop var per dim) of the tile that `nest` walks through `indices`:
        each index must be an outer expression plus at most one nest variable."""
        starts, sizes, dims = [], [], []
        for e in indices:
            terms = _terms(e, nest)
            if len(terms) > 1 or any(c != 1 for c in terms.values()):
                raise LoweringError(f"index {e} is not a unit-stride tile index")
            var = next(iter(terms), None)
            starts.append(self.index(_zero(e, nest)))
            sizes.append(nest[var] if var else 1)
            dims.append(var)
        return starts, sizes, dims

    def slice(self, src: Value, starts, sizes, shape) -> Value:
        self.structure.slices.append(tuple(sizes))
        v = self.op(f"stablehlo.dynamic_slice {src.name}, "
                    f"{', '.join(s.name for s in starts)}, sizes = {_ints(sizes)} : "
                    f"({src.type}, {', '.join('tensor<i32>' for _ in starts)}) -> "
                    f"{tensor_type(sizes, src.dtype)}", sizes, src.dtype, "tile")
        return self.reshape(v, shape)

    def reshape(self, v: Value, shape) -> Value:
        shape = tuple(shape)
        if v.shape == shape:
            return v
        return self.op(f"stablehlo.reshape {v.name} : ({v.type}) -> "
                       f"{tensor_type(shape, v.dtype)}", shape, v.dtype)

    def source(self, name: str) -> Value:
        if name in self.params:
            return self.params[name]
        if name in self.bufs:
            return self.bufs[name]
        raise LoweringError(f"buffer {name} is read before anything defines it")

    def copy(self, st, nest) -> None:
        dst = st.buffer.name
        if dst in self.prefetch:
            self.line(f"// {dst}: the tile prefetched in the previous iteration; slice the next")
            self.bufs[dst] = self.bufs["pf:" + dst]
            self.next_tile(dst, st, nest)
            return
        starts, sizes, _ = self.tile(st.value.indices, nest)
        self.line(f"// stage {st.value.source.name} -> {dst} ({st.buffer.scope()[7:]})")
        self.bufs[dst] = self.slice(self.source(st.value.source.name), starts, sizes,
                                    _shape(st.buffer))

    def write_back(self, st, nest) -> None:
        starts, sizes, dims = self.tile(st.indices, nest)
        self.line(f"// write-back of the accumulator tile, epilogue fused: {st.value}")
        val = self.elementwise(st.value, nest, sizes, dims)
        out = self.bufs[self.out]
        val = self.convert(val, out.dtype)
        self.bufs[self.out] = self.op(
            f"stablehlo.dynamic_update_slice {out.name}, {val.name}, "
            f"{', '.join(s.name for s in starts)} : ({out.type}, {val.type}, "
            f"{', '.join('tensor<i32>' for _ in starts)}) -> {out.type}", out.shape, out.dtype,
            "out")

    def pad(self, st, nest) -> None:
        _, src, fill = st.value.args
        if not _is_buffer_load(src):
            raise LoweringError(f"padding block reads {src}, not a buffer")
        low = []
        for di, si in zip(st.indices, src.indices):
            dv = _terms(di, nest)
            sv = _terms(si, nest)
            if dv != sv or len(dv) > 1:
                raise LoweringError(f"padding block {st} is not a shifted copy")
            low.append(-_const_offset(si, nest))
        dshape, sshape = _shape(st.buffer), _shape(src.source)
        high = [b - a - lo for a, b, lo in zip(sshape, dshape, low)]
        x = self.source(src.source.name)
        z = self.constant(fill.value, (), x.dtype)
        size = dtype_bytes(str(st.buffer.dtype))
        self.structure.pads.append((math.prod(sshape) * size, math.prod(dshape) * size))
        self.line(f"// {st.buffer.name}: zero padding of {src.source.name}")
        self.bufs[st.buffer.name] = self.op(
            f"stablehlo.pad {x.name}, {z.name}, low = {_ints(low)}, high = {_ints(high)}, "
            f"interior = {_ints([0] * len(low))} : ({x.type}, {z.type}) -> "
            f"{tensor_type(dshape, x.dtype)}", dshape, x.dtype, "pad")

    def elementwise(self, e, nest, sizes, dims) -> Value:
        """Tensor of the tile's shape computing expression `e` (the fused epilogue)."""
        from tvm import tirx

        shape = tuple(sizes)
        if isinstance(e, (tirx.IntImm, tirx.FloatImm)):
            return self.constant(e.value, shape, mlir_type(str(e.ty)))
        if isinstance(e, tirx.Cast):
            return self.convert(self.elementwise(e.value, nest, sizes, dims), mlir_type(str(e.ty)))
        if _is_buffer_load(e):
            return self.load_tile(e, nest, shape, dims)
        ops = {tirx.Add: "add", tirx.Sub: "subtract", tirx.Mul: "multiply",
               tirx.Max: "maximum", tirx.Min: "minimum",
               tirx.RShift: "shift_right_arithmetic", tirx.LShift: "shift_left"}
        for cls, name in ops.items():
            if isinstance(e, cls):
                return self.binary(name, self.elementwise(e.a, nest, sizes, dims),
                                   self.elementwise(e.b, nest, sizes, dims))
        raise LoweringError(f"the TPU emitter has no element-wise op for {e}")

    def load_tile(self, e, nest, shape, dims) -> Value:
        """A load in the write-back: the staged accumulator tile itself, or a slice of an input
        (the bias) broadcast along the tile's other dimensions."""
        starts, sizes, ldims = self.tile(e.indices, nest)
        name = e.source.name
        if name not in self.params:
            v = self.source(name)
            if [d for d in ldims if d] != [d for d in dims if d] or math.prod(v.shape) != \
                    math.prod(shape):
                raise LoweringError(f"write-back reads {name} in another order than it writes")
            return self.reshape(v, shape)
        part = self.slice(self.params[name], starts, sizes, sizes)
        keep = [i for i, d in enumerate(ldims) if d]
        part = self.reshape(part, [sizes[i] for i in keep])
        bdims = [dims.index(ldims[i]) for i in keep]
        return self.op(f"stablehlo.broadcast_in_dim {part.name}, dims = {_ints(bdims)} : "
                       f"({part.type}) -> {tensor_type(shape, part.dtype)}", shape, part.dtype)

    def convert(self, v: Value, dtype: str) -> Value:
        if v.dtype == dtype:
            return v
        return self.op(f"stablehlo.convert {v.name} : ({v.type}) -> "
                       f"{tensor_type(v.shape, dtype)}", v.shape, dtype)

    # -- scalar index arithmetic ---------------------------------------------------------------
    def index(self, e) -> Value:
        from tvm import tirx

        if isinstance(e, tirx.IntImm):
            return self.constant(int(e.value))
        if isinstance(e, tirx.Var):
            if e.name not in self.ivs:
                raise LoweringError(f"index uses {e.name}, which is no enclosing loop")
            return self.ivs[e.name]
        ops = {tirx.Add: "add", tirx.Sub: "subtract", tirx.Mul: "multiply",
               tirx.FloorDiv: "divide", tirx.FloorMod: "remainder"}  # indices are >= 0
        for cls, name in ops.items():
            if isinstance(e, cls):
                return self.binary(name, self.index(e.a), self.index(e.b))
        raise LoweringError(f"the TPU emitter cannot compute index {e}")

    # -- software pipelining: loop-carried prefetch -------------------------------------------
    def _plan(self, s, outer) -> None:
        """Find the copies under a pipelined loop and the loops their prefetch runs over."""
        from tvm import s_tir, tirx

        if isinstance(s, tirx.SeqStmt):
            for x in s.seq:
                self._plan(x, outer)
        elif isinstance(s, s_tir.SBlockRealize):
            if not isinstance(s.block.body, tirx.BufferStore):
                self._plan(s.block.body, outer)
        elif isinstance(s, tirx.For):
            chain, blk = _chain(s)
            if blk is None:
                return self._plan(s.body, outer + [s])
            st = blk.body
            staged = isinstance(st, tirx.BufferStore) and _is_buffer_load(st.value) and \
                st.buffer.scope().startswith("global.")
            grid = [f for f in outer if int(f.extent) > 1]
            if staged and grid and any(int(f.annotations.get(PIPELINE, 1)) > 1 for f in outer):
                self.prefetch[st.buffer.name] = _Prefetch(
                    grid[0], [(f.loop_var.name, int(f.extent)) for f in grid], st,
                    {f.loop_var.name: int(f.extent) for f in chain})
                self.structure.prefetched.append(st.buffer.name)

    def prologue(self, name: str, pf: _Prefetch) -> None:
        pf.started = True
        st = pf.store
        saved = dict(self.ivs)
        zero = self.constant(0)
        for v in _vars(st.value):
            self.ivs.setdefault(v, zero)
        for var, _ in pf.grid:
            self.ivs[var] = zero
        starts, sizes, _ = self.tile(st.value.indices, pf.nest)
        self.line(f"// prologue of the pipeline: first tile of {name}")
        self.bufs["pf:" + name] = self.slice(self.source(st.value.source.name), starts, sizes,
                                             _shape(st.buffer))
        self.ivs = saved

    def next_tile(self, name: str, st, nest) -> None:
        """Slice the tile of the next iteration of the enclosing loops (lexicographic order;
        after the last one it wraps to the first, a load that is never used)."""
        pf = self.prefetch[name]
        strides, total = [], 1
        for _, ext in reversed(pf.grid):
            strides.append(total)
            total *= ext
        strides.reverse()
        flat = None
        for (var, _), stride in zip(pf.grid, strides):
            term = self.binary("multiply", self.ivs[var], self.constant(stride))
            flat = term if flat is None else self.binary("add", flat, term)
        flat = self.binary("remainder", self.binary("add", flat, self.constant(1)),
                           self.constant(total))
        saved = dict(self.ivs)
        for (var, ext), stride in zip(pf.grid, strides):
            q = self.binary("divide", flat, self.constant(stride))
            self.ivs[var] = self.binary("remainder", q, self.constant(ext))
        starts, sizes, _ = self.tile(st.value.indices, nest)
        self.bufs["pf:" + name] = self.slice(self.source(st.value.source.name), starts, sizes,
                                             _shape(st.buffer))
        self.ivs = saved

    # -- the MXU primitive: dot_general over staged tiles --------------------------------------
    def primitive(self, chain, blk) -> None:
        """The marked block and the loops around it up to the innermost staging: an einsum of
        the staged tiles, one dot_general (per window tap) accumulated into the tile."""
        from tvm import tirx

        inner, body = [], blk.body
        while isinstance(body, tirx.For):
            inner.append(body)
            body = body.body
        st = body.block.body if hasattr(body, "block") else body
        if not isinstance(st, tirx.BufferStore):
            raise LoweringError(f"MXU block {blk.name_hint!r} is not one multiply-accumulate")
        ext = {f.loop_var.name: int(f.extent) for f in chain + inner}
        acc = st.buffer.name
        loads = [x for x in _loads(st.value) if x.source.name != acc]
        if len(loads) != 2:
            raise LoweringError(f"MXU block {blk.name_hint!r} reads {len(loads)} operands")
        acc_dims = [_group(e, ext) for e in st.indices]
        spatial = {v for g, _, _ in acc_dims if g for v in g}
        taps = sorted({v for x in loads for e in x.indices for v in _terms(e, ext)
                       if v not in spatial and _terms(e, ext).keys() & spatial})
        acc_v = self.bufs[acc]
        self.line(f"// {blk.annotations[ANNOTATION]} over the staged tiles: the on-chip loops "
                  f"{[f.loop_var.name for f in chain]} and the primitive's nest as dot_general"
                  + (f", window loops {taps} unrolled into one dot per tap" if taps else ""))
        total = None
        for point in _product([(t, ext[t]) for t in taps]):
            d = self.dot(loads, ext, point, acc_dims, acc_v)
            total = d if total is None else self.binary("add", total, d)
        self.bufs[acc] = self.binary("add", acc_v, total)
        self.structure.dot_trips = self.trips

    def dot(self, loads, ext, point, acc_dims, acc_v) -> Value:
        operands = []
        for x in loads:
            src = self.source(x.source.name)
            groups, begin, limit, step = [], [], [], []
            for e, n in zip(x.indices, src.shape):
                g, stride, off = _group(e, ext, point)
                size = math.prod(ext[v] for v in g) if g else 1
                begin.append(off)
                limit.append(off + (size - 1) * stride + 1)
                step.append(stride)
                groups.append(g)
                if off < 0 or limit[-1] > n:
                    raise LoweringError(f"{x} leaves its staged tile")
            sizes = [(li - b - 1) // s + 1 for b, li, s in zip(begin, limit, step)]
            if sizes != list(src.shape) or any(s != 1 for s in step):
                src = self.op(f"stablehlo.slice {src.name} ["
                              + ", ".join(f"{b}:{li}:{s}" for b, li, s in zip(begin, limit, step))
                              + f"] : ({src.type}) -> {tensor_type(sizes, src.dtype)}",
                              sizes, src.dtype, "tap")
            keep = [i for i, g in enumerate(groups) if g]
            src = self.reshape(src, [sizes[i] for i in keep])
            operands.append((src, [frozenset(groups[i]) for i in keep]))
        (lhs, lg), (rhs, rg) = operands
        out_groups = [frozenset(g) for g, _, _ in acc_dims if g]
        batch = [g for g in lg if g in rg and g in out_groups]
        contract = [g for g in lg if g in rg and g not in out_groups]
        lfree = [g for g in lg if g not in rg]
        rfree = [g for g in rg if g not in lg]
        if set(lfree + rfree + batch) != set(out_groups):
            raise LoweringError("the MXU block is not a matrix product of its staged tiles")
        if lfree and rfree and out_groups.index(rfree[0]) < out_groups.index(lfree[0]):
            # The accumulator has B's free dims first (NCHW): swap the operands so the
            # product comes out in its order, without a transpose.
            (lhs, lg, lfree), (rhs, rg, rfree) = (rhs, rg, rfree), (lhs, lg, lfree)
        # The MXU's form: [batch.., M, K] x [batch.., K, N] -> [batch.., M, N].
        size = {g: math.prod(ext[v] for v in g) for g in lg + rg}
        nb = len(batch)
        lhs = self.matrix(lhs, lg, batch, lfree, contract, size)
        rhs = self.matrix(rhs, rg, batch, contract, rfree, size)
        res = [size[g] for g in batch] + [lhs.shape[-2], rhs.shape[-1]]
        bdims = _ints(range(nb))
        dims = (f"batching_dims = {bdims} x {bdims}, " if batch else "") + \
            f"contracting_dims = [{nb + 1}] x [{nb}]"
        self.structure.dots.append((lhs.shape, rhs.shape, tuple(res)))
        d = self.op(f"stablehlo.dot_general {lhs.name}, {rhs.name}, {dims} : "
                    f"({lhs.type}, {rhs.type}) -> {tensor_type(res, acc_v.dtype)}",
                    res, acc_v.dtype, "dot")
        res_groups = batch + lfree + rfree
        res_shape = [size[g] for g in res_groups]
        d = self.reshape(d, res_shape)
        perm = [res_groups.index(g) for g in out_groups]
        if perm != sorted(perm):
            d = self.op(f"stablehlo.transpose {d.name}, dims = {_ints(perm)} : ({d.type}) -> "
                        f"{tensor_type([res_shape[p] for p in perm], d.dtype)}",
                        [res_shape[p] for p in perm], d.dtype)
        return self.reshape(d, acc_v.shape)


    def matrix(self, v: Value, groups, batch, rows, cols, size) -> Value:
        """`v` (dims = `groups`) transposed and reshaped to [batch.., rows, cols]."""
        perm = [groups.index(g) for g in batch + rows + cols]
        if perm != sorted(perm):
            v = self.op(f"stablehlo.transpose {v.name}, dims = {_ints(perm)} : ({v.type}) -> "
                        f"{tensor_type([v.shape[p] for p in perm], v.dtype)}",
                        [v.shape[p] for p in perm], v.dtype)
        return self.reshape(v, [size[g] for g in batch] + [math.prod(size[g] for g in rows),
                                                            math.prod(size[g] for g in cols)])


# -- helpers on TIR expressions ---------------------------------------------------------------
def _param_buffers(func) -> list:
    """The buffers behind the function's parameters, in order (found where they are used)."""
    import tvm_ffi
    from tvm import tirx

    seen: dict = {}

    def see(buf) -> None:
        seen.setdefault(buf.name, buf)

    tvm_ffi.structural_walk(func.body, [(_Load(), lambda x: see(x.source)),
                                        (tirx.BufferStore, lambda x: see(x.buffer))])
    try:
        return [seen[p.name] for p in func.params]
    except KeyError as e:
        raise LoweringError(f"parameter {e} of the lowered function is never accessed") from None


def _chain(f):
    """The perfect nest of loops from `f` and the leaf or MXU block it ends in (or None)."""
    from tvm import s_tir, tirx

    chain, body = [f], f.body
    while isinstance(body, tirx.For):
        chain.append(body)
        body = body.body
    if isinstance(body, s_tir.SBlockRealize):
        blk = body.block
        if ANNOTATION in blk.annotations or isinstance(blk.body, tirx.BufferStore):
            return chain, blk
    return chain, None


def _terms(e, nest) -> dict:
    """Coefficients of the nest's loop variables in index `e` (which must be affine in them)."""
    from tvm import tirx

    out: dict = {}

    def walk(x, sign):
        if isinstance(x, tirx.Add):
            walk(x.a, sign)
            walk(x.b, sign)
        elif isinstance(x, tirx.Sub):
            walk(x.a, sign)
            walk(x.b, -sign)
        elif isinstance(x, tirx.Var) and x.name in nest:
            out[x.name] = out.get(x.name, 0) + sign
        elif isinstance(x, tirx.Mul) and isinstance(x.b, tirx.IntImm) and \
                isinstance(x.a, tirx.Var) and x.a.name in nest:
            out[x.a.name] = out.get(x.a.name, 0) + sign * int(x.b.value)
        elif isinstance(x, tirx.Mul) and isinstance(x.a, tirx.IntImm) and \
                isinstance(x.b, tirx.Var) and x.b.name in nest:
            out[x.b.name] = out.get(x.b.name, 0) + sign * int(x.a.value)
        elif set(_vars(x)) & set(nest):
            raise LoweringError(f"index {e} is not affine in loops {sorted(nest)}")

    walk(e, 1)
    return {k: v for k, v in out.items() if v}


def _zero(e, names):
    """`e` with the given loop variables set to 0, simplified."""
    import tvm_ffi
    from tvm import tirx
    from tvm.sym.analyzer import Analyzer

    z = tvm_ffi.structural_map(e, [(tirx.Var, lambda v: tirx.const(0, "int32")
                                    if v.name in names else v)])
    return Analyzer().simplify(z)


def _const_offset(e, names) -> int:
    from tvm import tirx

    z = _zero(e, names)
    if not isinstance(z, tirx.IntImm):
        raise LoweringError(f"index {e} has a non-constant offset inside its tile")
    return int(z.value)


def _group(e, ext, point=None):
    """(loop vars, stride, constant offset) of one index over the on-chip loops: the vars must
    cover a contiguous (or uniformly strided) range, as a split loop does. `point` fixes tap
    variables to values."""
    point = dict(point or {})
    terms = _terms(e, ext)
    off = _const_offset(e, ext) + sum(c * point[v] for v, c in terms.items() if v in point)
    terms = {v: c for v, c in terms.items() if v not in point}
    if not terms:
        return (), 1, off
    order = sorted(terms, key=lambda v: terms[v])
    stride = terms[order[0]]
    span = stride
    for v in order:
        if terms[v] != span:
            raise LoweringError(f"index {e} does not walk its tile contiguously")
        span *= ext[v]
    return tuple(order), stride, off


def _vars(e) -> list:
    import tvm_ffi
    from tvm import tirx

    found: list = []
    tvm_ffi.structural_walk(e, [(tirx.Var, lambda v: found.append(v.name))])
    return found


def _loads(e) -> list:
    import tvm_ffi

    found: list = []
    tvm_ffi.structural_walk(e, [(_Load(), lambda x: found.append(x))], order="pre")
    return found


def _written(s) -> set:
    import tvm_ffi
    from tvm import tirx

    found: set = set()
    tvm_ffi.structural_walk(s, [(tirx.BufferStore, lambda x: found.add(x.buffer.name))])
    return found


def _Load():
    """TVM 0.27's class of a buffer load (`tirx.BufferLoad` is only a constructor function)."""
    import tvm

    return tvm.ir.expr.TensorLoad


def _is_buffer_load(e) -> bool:
    return isinstance(e, _Load())


def _is_call(e, name: str) -> bool:
    import tvm

    return isinstance(e, tvm.ir.Call) and str(e.op.name).endswith("." + name)


def _product(axes):
    """Every assignment of values to (name, extent) pairs, as lists of (name, value)."""
    out = [[]]
    for name, n in axes:
        out = [p + [(name, v)] for p in out for v in range(n)]
    return out
