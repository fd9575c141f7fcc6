"""`python -m tsl.tam probe`: measure this host and write a CPU machine file for it.

Starts from the machine `detect()` picks and replaces what a measurement can tell: the core
count and cache sizes (from the OS), the clock (the OS's current figure), and each primitive's
throughput, timed on one core with a register-only loop of independent accumulator chains of
the primitive's own instruction (the chains outnumber its latency, so the loop is bound by
issue rate; loads and stores are outside it). The best of several repeats is kept: a busy host
only slows a throughput loop down. Peaks are the measured rates times the core count.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
import time
from pathlib import Path

from ..errors import TAMError
from . import host
from .loader import load
from .machine import Machine, TensorPrimitive, dtype_bytes
from .writer import dumps


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


def _kernel(p: TensorPrimitive, chains: int):
    """A PrimFunc(x, out, iters) that runs `chains` independent chains of p's instruction."""
    from tvm.script import tirx as T

    n = p.m * p.n  # accumulator lanes of one instruction
    acc_t = "float32" if p.acc_dtype.startswith("float") or p.acc_dtype == "bfloat16" else "int32"
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
    return f, acc_t


def primitive_rate(m: Machine, p: TensorPrimitive, seconds: float = 0.2,
                   repeats: int = 5) -> float:
    """MACs per second on one core of primitive `p` of machine `m` (the host must run m)."""
    import numpy as np
    import tvm

    acc = next(lv for lv in m.memory if lv.name == p.c_level)
    lanes = p.m * p.n
    chains = max(4, min(24, acc.capacity // int(lanes * dtype_bytes(p.acc_dtype))))
    f, acc_t = _kernel(p, chains)
    ex = tvm.compile(tvm.IRModule({"main": f}),
                     target=tvm.target.Target({"kind": "llvm", "mcpu": host.info().llvm_cpu}))
    if p.instruction == "dot2":
        from ..backends.cpu.codegen import bfloat_operands

        ex = bfloat_operands(ex, [p.intrinsic])
    dev = tvm.cpu(0)
    x = tvm.runtime.tensor(np.full(2 * lanes, 1 if acc_t == "int32" else 0.5, acc_t), dev)
    out = tvm.runtime.empty((chains * lanes,), acc_t, dev)
    fn = ex.jit()["main"]
    iters = 1 << 12
    while True:  # grow the loop until one call takes a measurable time
        t = time.perf_counter()
        fn(x, out, iters)
        if time.perf_counter() - t > seconds / 10 or iters > 1 << 30:
            break
        iters *= 4
    best = min(_timed(fn, x, out, iters) for _ in range(repeats))
    return chains * lanes * p.k * iters / best


def _timed(fn, x, out, iters) -> float:
    t = time.perf_counter()
    fn(x, out, iters)
    return time.perf_counter() - t


def clock_hz() -> float | None:
    """The OS's current clock figure (the highest over the CPUs), if it gives one."""
    try:
        mhz = [float(v) for v in re.findall(r"^cpu MHz\s*:\s*([\d.]+)",
                                            Path("/proc/cpuinfo").read_text(), re.M)]
    except OSError:
        return None
    return max(mhz) * 1e6 if mhz else None


def probe(name: str | None = None, seconds: float = 0.2) -> tuple[Machine, str]:
    """(machine, TOML text) for this host, measured."""
    base = host.detect()
    h = host.info()
    clock = clock_hz() or base.clock_hz
    prims, rates, peaks = [], {}, {}
    for p in base.primitives:
        r = primitive_rate(base, p, seconds)
        rates[p.name] = r
        prims.append(dataclasses.replace(p, macs_per_cycle=round(r / clock, 2)))
        for d in {p.a_dtype, "int8" if p.a_dtype == "uint8" else p.a_dtype}:
            peaks[d] = max(peaks.get(d, 0.0), float(f"{2 * r * h.cores:.4g}"))
    m = dataclasses.replace(base, name=name or f"{base.name}-probed", clock_hz=clock,
                            primitives=tuple(prims), peaks=peaks, notes=(),
                            description=f"{h.model or h.llvm_cpu}, measured by tsl.tam probe",
                            params=dataclasses.replace(base.params, cpus=(h.llvm_cpu,)))
    header = "\n".join(
        [f"{m.name}: this host, measured by `python -m tsl.tam probe` on "
         f"{time.strftime('%Y-%m-%d')}.", "",
         f"Host: {h.model or '?'} ({h.arch}, LLVM cpu {h.llvm_cpu}), {h.cores} cores; caches "
         f"from sysfs: " + ", ".join(f"L{c.level} {c.bytes // 1024} KiB" for c in h.caches) + ".",
         f"Derived from {base.name} ({Path(base.source).name}); see that file for its sources "
         f"and what it does not model.",
         f"clock_hz is the OS's current figure ({clock / 1e9:.3g} GHz), not a sustained "
         f"all-core clock.",
         "Throughput: one core, independent accumulator chains of each primitive's "
         "instruction, best of 5:"]
        + [f"  {p.name}: {rates[p.name] / 1e9:.2f} GMAC/s per core = "
           f"{rates[p.name] / clock:.2f} MACs/cycle" for p in base.primitives]
        + ["Not modelled: frequency changes under load, the shared L3 and memory bandwidth, "
           "SMT."])
    text = dumps(m, header)
    # What is written must load back as it is.
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / f"{m.name}.toml"
        tmp.write_text(text)
        try:
            load(tmp)
        except TAMError as e:  # pragma: no cover - a writer bug, not a user error
            raise AssertionError(f"probe wrote a file that does not load: {e}") from e
    return m, text
