"""Measuring this host: each tensor primitive's throughput, the core clock, and the rate a
core's cache fills from the shared cache above it.

A primitive's rate is timed on one core with a register-only loop of independent accumulator
chains of the primitive's own instruction (the chains outnumber its latency, so the loop is
bound by issue rate; loads and stores are outside it: the accumulators are stack tiles, which
LLVM keeps in registers). The clock is timed with a chain of dependent scalar integer
operations (xor, then add) that every x86-64 and AArch64 core of the built-in files executes
in one cycle each, so the chain runs one operation per cycle at the core's actual clock (the
OS's "cpu MHz" under a hypervisor is often the TSC's, not the clock the core runs at). The
best of many short samples is kept: a busy host only slows a loop down, so a probe can
under-read, never over-read.

The fill rate is timed with every core streaming its own buffer, several times its private
cache (L2) and well inside its share of the shared one (L3), through vector loads into
independent sums: what a tile refilled from the L3 costs while the other cores do the same
(a mesh L3 feeds a core far below its L2's own rate: ~10 bytes per cycle on an Intel Xeon
under KVM against the 64 a file would assume).

What `target="cpu"` uses is the cached measurement (`tsl.backends.cpu.rates`); `python -m
tsl.backends.cpu probe` writes the measured machine as a file (`hostmachine.probe_file`).
"""

from __future__ import annotations

import time

from ...tam.machine import Machine, MemoryLevel, TensorPrimitive, dtype_bytes

CLOCK_OPS = 2  # one-cycle operations per iteration of the clock chain (xor, add)
# Many short samples, the best kept: on a host whose cores other processes share, a sample
# shorter than a scheduler time slice (milliseconds) often runs undisturbed; one of 50 ms
# almost never does (a probe of 5 x 50 ms read 40-60% low at load 2 on 2 cores).
SAMPLE_SECONDS = 0.002
SAMPLES = 40


def _step(p: TensorPrimitive, vec: str):
    """step(a, x) -> the next value of accumulator vector `a` under p's instruction, `x` the
    loop-invariant operand buffer (both read as `vec` vectors)."""
    from tvm import tirx
    from tvm.script import tirx as T

    n, kind = p.m * p.n, p.instruction or "vector"

    def call(*args):
        return T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id(p.intrinsic), *args,
                                       dtype=vec)

    def as_(e, dtype):
        return tirx.call_intrin(dtype, "tirx.reinterpret", e)

    if kind in ("dot4", "mmla"):  # (acc, a, b): sdot/vpdpbusd; smmla's 2x2 block in 4 lanes
        return lambda a, x: call(a, as_(x.vload([0], vec), f"int8x{4 * n}"),
                                 as_(x.vload([n], vec), f"int8x{4 * n}"))
    if kind == "dot2":  # bfdot: the bf16 pairs are int16 vectors to TVM (see cpu.codegen)
        return lambda a, x: call(a, as_(x.vload([0], vec), f"int16x{2 * n}"),
                                 as_(x.vload([n], vec), f"int16x{2 * n}"))
    if kind == "madd2":
        # The chain's own sum is the next int16 multiplicand: the micro-kernel's multiply-add
        # pair (vpmaddwd + vpaddd), and nothing loop-invariant to hoist.
        return lambda a, x: a + call(as_(a, f"int16x{2 * n}"),
                                     as_(x.vload([n], vec), f"int16x{2 * n}"))
    if vec.startswith("float32"):
        return lambda a, x: T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id("llvm.fma"), a,
                                                    x.vload([0], vec), x.vload([n], vec),
                                                    dtype=vec)
    # An integer "vector" primitive: a widening multiply-accumulate in int32 lanes.
    return lambda a, x: a * x.vload([0], vec) + x.vload([n], vec)


def acc_dtype(p: TensorPrimitive) -> str:
    """The lane type of p's accumulator register."""
    return "float32" if p.acc_dtype.startswith("float") or p.acc_dtype == "bfloat16" else "int32"


def signature(p: TensorPrimitive) -> str:
    """What decides the loop `primitive_rate` times: primitives of two machines with the same
    signature run the same instruction at the same rate (a bf16 FMA primitive, widened to
    fp32, is the fp32 one's)."""
    return f"{p.instruction or 'vector'} {p.intrinsic or '-'} {acc_dtype(p)}x{p.m * p.n} k{p.k}"


def _kernel(p: TensorPrimitive, chains: int):
    """A PrimFunc(x, out, iters) that runs `chains` independent chains of p's instruction."""
    from tvm.script import tirx as T

    n = p.m * p.n  # accumulator lanes of one instruction
    acc_t = acc_dtype(p)
    vec = f"{acc_t}x{n}"
    size = chains * n
    step = _step(p, vec)

    @T.prim_func
    def f(x: T.Buffer((2 * n,), acc_t), out: T.Buffer((size,), acc_t), iters: T.int32):
        acc = T.alloc_buffer((size,), acc_t)
        for j in T.unroll(chains):
            acc[T.ramp(j * n, 1, n)] = x.vload([0], vec)
        for _ in range(iters):
            for j in T.unroll(chains):
                acc[T.ramp(j * n, 1, n)] = step(acc.vload([j * n], vec), x)
        for j in T.unroll(chains):
            out[T.ramp(j * n, 1, n)] = acc.vload([j * n], vec)
    return f


def _clock_kernel():
    from tvm.script import tirx as T

    @T.prim_func
    def f(x: T.Buffer((2,), "int32"), out: T.Buffer((1,), "int32"), iters: T.int32):
        acc = T.alloc_buffer((1,), "int32")
        acc[0] = x[0]
        for _ in range(iters):
            acc[0] = T.bitwise_xor(acc[0], x[0]) + x[1]
        out[0] = acc[0]
    return f


def _best_time(m: Machine, f, x, out_len: int, dtype: str,
               iters: int = 1 << 10) -> tuple[float, int]:
    """(best seconds of SAMPLES calls, iterations per call) of kernel `f` compiled for `m`,
    the iteration count grown from `iters` until one call takes about SAMPLE_SECONDS."""
    import tvm

    from ...timing import realtime
    from .codegen import compile_module
    from .runtime import set_threads

    set_threads(m.cores())  # the kernel is serial; sizing the pool once keeps it that way
    fn = compile_module(tvm.IRModule({"main": f}), m).jit()["main"]
    dev = tvm.cpu(0)
    xs = tvm.runtime.tensor(x, dev)
    out = tvm.runtime.empty((out_len,), dtype, dev)
    while True:
        t = _timed(fn, xs, out, iters)
        if t > SAMPLE_SECONDS or iters > 1 << 30:
            break
        iters = int(iters * min(64.0, max(2.0, 1.2 * SAMPLE_SECONDS / max(t, 1e-7))))
    with realtime():
        return min(_timed(fn, xs, out, iters) for _ in range(SAMPLES)), iters


def _timed(fn, x, out, iters) -> float:
    t = time.perf_counter()
    fn(x, out, iters)
    return time.perf_counter() - t


def primitive_rate(m: Machine, p: TensorPrimitive) -> float:
    """MACs per second on one core of primitive `p` of machine `m` (the host must run m)."""
    import numpy as np

    acc = m.memory_level(p.c_level)
    lanes = p.m * p.n
    chains = max(4, min(24, acc.capacity // int(lanes * dtype_bytes(p.acc_dtype))))
    acc_t = acc_dtype(p)
    x = np.full(2 * lanes, 1 if acc_t == "int32" else 0.5, acc_t)
    best, iters = _best_time(m, _kernel(p, chains), x, chains * lanes, acc_t)
    return chains * lanes * p.k * iters / best


def clock_hz(m: Machine) -> float:
    """The core clock, from the dependent one-cycle chain (see the module docstring)."""
    import numpy as np

    best, iters = _best_time(m, _clock_kernel(), np.array([0x5bd1e995, 7], "int32"), 1,
                             "int32")
    return CLOCK_OPS * iters / best


# Independent running sums of the fill-rate kernel (the loads, not the adds' latency, bound it).
STREAM_SUMS = 8


def filled_level(m: Machine) -> MemoryLevel | None:
    """The per-core cache whose parent is a cache the cores share (L2 under an L3): the level
    whose `bandwidth` (bytes per cycle from its parent) `fill_rate` measures; None if none."""
    for lv in m.memory:
        parent = m.memory_level(lv.parent) if lv.parent else None
        if parent is not None and not lv.managed and not parent.managed and \
                lv.per is not None and parent.per is None:
            return lv
    return None


def _stream_kernel(cores: int, n: int, lanes: int):
    """A PrimFunc(x, out, iters): each of `cores` parallel tasks sums its own n floats of x
    `iters` times over, in STREAM_SUMS vectors of `lanes`."""
    from tvm.script import tirx as T

    vec, width = f"float32x{lanes}", STREAM_SUMS * lanes

    @T.prim_func
    def f(x: T.Buffer((cores * n,), "float32"), out: T.Buffer((cores * width,), "float32"),
          iters: T.int32):
        for c in T.parallel(cores):
            acc = T.alloc_buffer((width,), "float32", scope="local")
            for j in T.unroll(STREAM_SUMS):
                acc[T.ramp(j * lanes, 1, lanes)] = x.vload([c * n + j * lanes], vec)
            for _ in range(iters):
                for i in range(n // width):
                    for j in T.unroll(STREAM_SUMS):
                        acc[T.ramp(j * lanes, 1, lanes)] = acc.vload([j * lanes], vec) + \
                            x.vload([c * n + i * width + j * lanes], vec)
            for j in T.unroll(STREAM_SUMS):
                out[T.ramp(c * width + j * lanes, 1, lanes)] = acc.vload([j * lanes], vec)
    return f


def fill_rate(m: Machine) -> float | None:
    """Bytes per second one core reads from the shared cache into `filled_level(m)` while
    every core does the same; None where m has no such level or its share of the shared
    cache is not a few times the private one (nothing to measure apart from DRAM)."""
    import numpy as np

    lv = filled_level(m)
    if lv is None:
        return None
    cores = m.cores()
    # Four times the private cache, at most a quarter of each core's share of the shared one.
    nbytes = min(4 * lv.capacity, m.memory_level(lv.parent).capacity // (4 * cores))
    if nbytes < 2 * lv.capacity:
        return None
    lanes = max(p.n for p in m.primitives if acc_dtype(p) == "float32")
    n = nbytes // 4 // (STREAM_SUMS * lanes) * (STREAM_SUMS * lanes)
    best, iters = _best_time(m, _stream_kernel(cores, n, lanes), np.ones(cores * n, "float32"),
                             cores * STREAM_SUMS * lanes, "float32", iters=1)
    return 4 * n * iters / best
