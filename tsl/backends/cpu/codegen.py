"""Lowered TIR -> an LLVM module for the host (or, cross-compiled, for another CPU)."""

from __future__ import annotations

import re
from functools import cache

import numpy as np

from ...errors import BackendUnavailable, LoweringError
from ...schedules.vector import UPPER_BOUNDS
from . import host


def target(machine, cross: bool = False):
    """The LLVM target for `machine`: the host's CPU (for its scheduling model) with every
    vector extension that another CPU machine file of the arch needs and this one does not
    switched off, so that a machine's code runs on any host that has its `require` features.
    `cross`: the file's `mtriple`, `mcpu` and `require` features, for a machine this host
    does not run (compile only)."""
    import tvm

    need = list(machine.params.require)
    if cross:
        if not machine.params.mtriple:
            raise BackendUnavailable(f"machine {machine.name} cannot be cross-compiled: its "
                                     f"file has no [params] mtriple")
        return tvm.target.Target({"kind": "llvm", "mtriple": machine.params.mtriple,
                                  "mcpu": machine.params.mcpu,
                                  "mattr": [f"+{f}" for f in need],
                                  "num-cores": machine.cores()})
    lacks = host.missing(machine)
    if lacks:
        raise BackendUnavailable(unavailable_message(machine, lacks))
    arch = machine.params.arch
    others = {f for m in host.cpu_machines() if m.params.arch == arch
              for f in m.params.require}
    off = sorted(others - set(need))
    return tvm.target.Target({"kind": "llvm", "mcpu": host.info().llvm_cpu,
                              "mattr": [f"-{f}" for f in off] + [f"+{f}" for f in need],
                              "num-cores": machine.cores()})


def unavailable_message(machine, lacks) -> str:
    runs = [m.name for m in host.runnable()]
    return (f"this host ({host.info().llvm_cpu}) cannot run machine {machine.name}: it lacks "
            f"{lacks}; machines it runs: {runs or 'none built in'} (target='cpu' picks the "
            f"best); tsl.build(..., cross=True) compiles for {machine.name} without running")


# Tiles up to this size live on the stack. TVM moves every CPU allocation above 1 KiB to a
# workspace pool (TVMBackendAllocWorkspace/Free in every parallel task), which costs an
# accumulator tile of 24 registers about 7% of an int8 GEMM's time.
STACK_TILE_BYTES = 32 * 1024
PIPELINE = "tsl_cpu"


@cache
def register_pipeline() -> None:
    import tvm
    import tvm_ffi
    from tvm import tirx
    from tvm.s_tir import pipeline as s_tir_pipeline

    def on_stack(node):
        buf = node.buffer
        if buf.scope() != "global" or not all(isinstance(d, tirx.IntImm) for d in buf.shape):
            return node
        if _nbytes([int(d) for d in buf.shape], buf.dtype) > STACK_TILE_BYTES:
            return node
        return tirx.AllocBuffer(buf, annotations={**dict(node.annotations),
                                                  "disable_lower_builtin": tirx.IntImm("bool", 1)})

    def rewrite(name, node_type, fn):
        """A module pass mapping `fn` over the `node_type` nodes of every PrimFunc's body."""
        @tvm.transform.module_pass(opt_level=0, name=name)
        def run(mod, _ctx):
            for gv, f in list(mod.functions.items()):
                if isinstance(f, tirx.PrimFunc):
                    mod[gv] = f.with_body(tvm_ffi.structural_map(f.body, [(node_type, fn)]))
            return mod
        return run

    @tvm.transform.module_pass(opt_level=0, name="tsl.RowsAtBounds")
    def rows_at_bounds(mod, _ctx):
        for gv, f in list(mod.functions.items()):
            if isinstance(f, tirx.PrimFunc) and f.attrs and UPPER_BOUNDS in f.attrs:
                mod[gv] = _rows_at_bounds(f, gv.name_hint)
        return mod

    stack_tiles = rewrite("tsl.StackTiles", tirx.AllocBuffer, on_stack)
    prefetch_weights = rewrite("tsl.PrefetchWeights", tirx.For, _prefetched)

    def factory():
        passes, finalize_host, finalize_device = s_tir_pipeline.default_s_tir_pipeline()
        return (passes, lambda: tvm.transform.Sequential([rows_at_bounds, stack_tiles,
                                                          prefetch_weights, finalize_host()]),
                finalize_device)

    tirx.register_tir_pipeline(PIPELINE, factory)


def _nbytes(shape: list, dtype) -> int:
    return int(np.prod(shape)) * dtype.bits * dtype.lanes // 8


def _rows_at_bounds(f, name: str):
    """`f` with each global buffer of run-time extent it allocates (a softmax's exp row over
    the sequence) sized at its symbols' largest values (`UPPER_BOUNDS`) where that fits
    `STACK_TILE_BYTES`: StackTiles then makes it one stack array per parallel task, where TVM
    took a workspace per row (TVMBackendAllocWorkspace and Free in the row loop: 1536 pairs a
    call of the dynamic-seq BERT layer's softmax at s = 128)."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    bounds = {str(k): int(v) for k, v in f.attrs[UPPER_BOUNDS].items()}
    resized = []  # (buffer, its replacement)

    def on_alloc(node):
        buf = node.buffer
        shape = [_largest(d, bounds) for d in buf.shape]
        if (buf.scope() != "global" or None in shape
                or all(isinstance(d, tirx.IntImm) for d in buf.shape)
                or _nbytes(shape, buf.dtype) > STACK_TILE_BYTES):
            return node
        new = tirx.decl_buffer(shape, buf.dtype, buf.name)
        resized.append((buf, new))
        # A value past the bound would overrun the array: an error names the bound instead.
        fits = tirx.all(*[d <= n for d, n in zip(buf.shape, shape)])
        why = (f"{name}: a symbolic dim over its upper bound {bounds} (the largest value the "
               f"library was compiled for)")
        return tirx.SeqStmt([tirx.AssertStmt(fits, tvm.ir.StringImm("ValueError"),
                                             [tvm.ir.StringImm(why)]),
                             tirx.AllocBuffer(new, node.annotations)])
    body = tvm_ffi.structural_map(f.body, [(tirx.AllocBuffer, on_alloc)])
    if not resized:
        return f
    # A buffer is a Var: every access names the replacement.
    return f.with_body(tvm_ffi.structural_map(body, [(type(resized[0][0]), lambda v: next(
        (new for old, new in resized if v.same_as(old)), v))]))


def _largest(extent, bounds: dict) -> int | None:
    """`extent`'s largest value with each symbol in it between 1 and its bound in `bounds`;
    None where a symbol has no bound."""
    import tvm
    import tvm_ffi
    from tvm import tirx
    from tvm.sym.analyzer import Analyzer

    if isinstance(extent, tirx.IntImm):
        return int(extent.value)
    syms, ana = [], Analyzer()
    tvm_ffi.structural_walk(extent, [(tirx.Var, syms.append)], order="pre")
    if not syms or any(str(v.name) not in bounds for v in syms):
        return None
    for v in syms:
        ana.bind(v, tvm.ir.Range.from_min_extent(tirx.IntImm(str(v.ty), 1),
                                                 tirx.IntImm(str(v.ty), bounds[str(v.name)])))
    return int(ana.const_int_bound(extent).max_value)


def _prefetched(loop):
    """A loop the lowering marked with, at the end of its body, a prefetch into the L1 of
    what its body loads that many iterations ahead: each vector (`lowering.PREFETCH_STEPS`:
    the register tile's rows of B; A's elements are broadcast from scalar loads), or each
    cache line of the rows its scalar loads read (`lowering.PREFETCH_ROWS`: a conv's input
    window). Past the last step the addresses run off the buffer's end: a prefetch is a hint
    that never faults."""
    from tvm import tirx

    from .lowering import PREFETCH_LINE, PREFETCH_ROWS, PREFETCH_STEPS

    marks = (PREFETCH_STEPS, PREFETCH_ROWS, PREFETCH_LINE)
    ahead = loop.annotations.get(PREFETCH_STEPS) or loop.annotations.get(PREFETCH_ROWS)
    if ahead is None:
        return loop
    body = list(loop.body.seq) if isinstance(loop.body, tirx.SeqStmt) else [loop.body]
    loads = (_vector_loads(body) if PREFETCH_STEPS in loop.annotations else
             _row_lines(body, int(loop.annotations[PREFETCH_LINE])))
    hints = [tirx.Evaluate(tirx.call_llvm_intrin(
        "void", "llvm.prefetch", tirx.address_of(tirx.BufferLoad(
            buf, [*outer, _replaced(base, loop.loop_var, lambda x: x + int(ahead))])),
        0, 3, 1)) for buf, outer, base in loads]
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind,
                    tirx.SeqStmt(body + hints) if hints else loop.body, loop.thread_binding,
                    {k: x for k, x in loop.annotations.items() if k not in marks},
                    loop.step)


def _replaced(expr, var, to):
    """`expr` with each use of `var` replaced by `to(var)`."""
    import tvm_ffi

    return tvm_ffi.structural_map(expr, [(type(var), lambda x: to(x) if x.same_as(var) else x)])


def _expanded_loads(body: list, keep) -> list:
    """(load, its last index expanded through the lets bound among the statements `body`) of
    each distinct load that `keep` accepts (TVM's CSE binds every tile's index to a variable
    of the loop's body, which a prefetch cannot move)."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    bound, loads = [], []  # (let variable, its value expanded); the loads kept

    def on_load(ld):
        if keep(ld) and not any(tvm_ffi.structural_equal(ld, x) for x in loads):
            loads.append(ld)

    for st in body:
        if isinstance(st, tirx.Bind):
            value = st.value
            for var, val in bound:
                value = _replaced(value, var, lambda _, v=val: v)
            bound.append((st.var, value))
        else:
            tvm_ffi.structural_walk(st, [(tvm.ir.TensorLoad, on_load)], order="pre")
    out = []
    for ld in loads:
        last = ld.indices[-1]
        for var, val in reversed(bound):
            last = _replaced(last, var, lambda _, v=val: v)
        out.append((ld, last))
    return out


def _vector_loads(body: list) -> list:
    """(buffer, outer indices, first element's index) of each distinct vector load in the
    statements `body`."""
    from tvm import tirx

    return [(ld.source, list(ld.indices[:-1]), last.base) for ld, last in
            _expanded_loads(body, lambda ld: isinstance(ld.indices[-1], tirx.Ramp))]


def _row_lines(body: list, line: int) -> list:
    """(buffer, outer indices, index) of the first element of each run of elements that the
    scalar loads in `body` read, and every `line` elements along it to its last: the cache
    lines of a conv window's rows. A load whose outer indices differ from a group's first, or
    whose last index differs by more than a constant, starts a group of its own."""
    import tvm_ffi
    from tvm import tirx
    from tvm.sym.analyzer import Analyzer

    simplify = Analyzer().simplify
    loads = _expanded_loads(body, lambda ld: not isinstance(ld.indices[-1], tirx.Ramp))
    groups = []  # (load, index, sorted constant offsets of the loads from it)
    for ld, last in loads:
        for g in groups:
            d = simplify(last - g[1])
            if g[0].source.same_as(ld.source) and isinstance(d, tirx.IntImm) and \
                    tvm_ffi.structural_equal(list(g[0].indices[:-1]), list(ld.indices[:-1])):
                g[2].append(int(d))
                break
        else:
            groups.append((ld, last, [0]))
    out = []
    for ld, last, offsets in groups:
        offsets.sort()
        start = prev = offsets[0]
        for o in offsets[1:] + [None]:
            if o is None or o - prev >= line:
                out += [(ld.source, list(ld.indices[:-1]), last + x)
                        for x in [*range(start, prev, line), prev]]
                start = o
            prev = o
    return out


def compile_module(mod, machine, cross: bool = False):
    import tvm

    tgt = target(machine, cross)
    register_pipeline()
    bfloat = [p.intrinsic for p in machine.primitives if BFLOAT_OVERLOAD.search(p.intrinsic)]
    try:
        ex = tvm.compile(mod, target=tgt, tir_pipeline=PIPELINE)
        return bfloat_operands(ex, bfloat) if bfloat else ex
    except Exception as e:  # noqa: BLE001 - TVM's error classes vary by pass
        from ...lower import _first_line

        raise LoweringError(f"LLVM code generation for {machine.name} failed: "
                            f"{_first_line(e)}") from e


# An LLVM intrinsic name overloaded on a bfloat vector (".v8bf16"), and its overload suffix.
BFLOAT_OVERLOAD = re.compile(r"\.v\d+bf16(\.|$)")
OVERLOAD_SUFFIX = re.compile(r"(\.v\d+[a-z]+\d+)+$")


def bfloat_operands(ex, intrinsics):
    """`ex` with each call of an intrinsic the machine file names by its bfloat overload
    (``llvm.aarch64.neon.bfdot.v4f32.v8bf16``) calling that overload, its i16 vector operands
    bitcast to bfloat vectors of the same width (free: the same register).

    TVM's LLVM code generator has no bfloat type: its BF16 legalization turns bf16 vectors into
    fp32 ones (LLVM cannot split a v8f32 bfdot operand) and bf16 storage into uint16, and with
    those passes disabled it crashes on any bf16 value. So the kernel passes the bf16 bits as
    i16 vectors (`intrinsics.register`), which selects the i16 overload that LLVM cannot
    select, and this rewrites the module's LLVM IR and loads it back."""
    import tempfile

    import tvm
    import tvm_ffi

    ll = ex.mod.inspect_source("ll")
    out, n = [], 0
    for line in ll.splitlines():
        for full in intrinsics:
            base = OVERLOAD_SUFFIX.sub("", full)
            m = re.search(rf"@{re.escape(base)}\.[\w.]+\(([^()]*)\)", line)
            if m is None:
                continue
            args = []
            for arg in m.group(1).split(", "):
                a = re.fullmatch(r"<(\d+) x i16>( %[\w.]+)?", arg)
                if a:
                    arg = f"<{a.group(1)} x bfloat>"
                    if a.group(2):  # an operand of a call (not a declaration): bitcast it
                        n += 1
                        out.append(f"  %tsl.bf{n} = bitcast <{a.group(1)} x i16>{a.group(2)} "
                                   f"to {arg}")
                        arg += f" %tsl.bf{n}"
                args.append(arg)
            line = line[:m.start()] + f"@{full}({', '.join(args)})" + line[m.end():]
        out.append(line)
    with tempfile.TemporaryDirectory(prefix="tsl-ll-") as d:
        path = f"{d}/kernel.ll"
        with open(path, "w") as f:
            f.write("\n".join(out) + "\n")
        return tvm.runtime.Executable(tvm_ffi.get_global_func("ffi.Module.load_from_file.ll")(
            path, "ll"))
