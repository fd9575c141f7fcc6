"""Tutorial 4: the same GEMM schedule, built for NVIDIA Tensor Cores (no GPU needed).

The schedule below is the default GEMM schedule of `tsl.schedules`, written out. It names no
chip. On the CPU its "subcore" and "operand" levels do not exist (those steps are recorded as
serial / skipped); on a Tensor Core TAM they become warps and WMMA fragments:

    parallel(.., "core")     -> thread blocks (blockIdx.x), one per output tile
    parallel(.., "subcore")  -> warps (threadIdx.y), one accumulator tile each
    cache(.., "scratchpad")  -> shared memory tiles, filled with cp.async, `pipeline`d
    cache(.., "operand")     -> wmma.matrix_a / matrix_b fragments
    cache("C", "accumulator")-> wmma.accumulator fragments (registers)
    tensorize                -> wmma.mma.sync m16n16k16

What there is to see without a GPU: the CUDA program TVM generated, the PTX nvcc makes of it
(Tensor Core and cp.async instructions, registers and shared memory from ptxas) and the TAM's
roofline estimate. On a GPU machine `art.run(a, b)` runs it through CuPy.

Run: python tutorials/04_tensorcore.py
"""

import tsl
from tsl import ops
from tsl.tam.machine import dtype_bytes

gpu = tsl.load_machine("tensorcore-sm90")
acc = gpu.levels("accumulator", "C")[0]
print(f"machine {gpu.name}: {gpu.cores()} SMs x {gpu.compute_level('subcore').count} warps, "
      f"{gpu.levels('scratchpad')[0].capacity // 1024} KiB shared memory per block, "
      f"accumulators {acc.capacity // 1024} KiB per warp")


def gemm(s: tsl.Schedule) -> None:
    p = s.primitive                                    # wmma 16x16x16 for fp16 operands
    (i,), (j,), (k,) = s.axes("m"), s.axes("n"), s.axes("k")
    acc_bytes = dtype_bytes(s.op.acc_dtype)
    cap = s.level("accumulator", "C").capacity         # per warp on this machine
    m_inner = s.knob("m_inner", (1, 2, 4, 8), 4)       # accumulator tile: 64 x 64 ...
    n_inner = s.knob("n_inner", (1, 2, 4, 8), 4)
    assert m_inner * p.m * n_inner * p.n * acc_bytes <= cap   # ... which fits a warp's registers
    mr, nr = m_inner * p.m, n_inner * p.n
    k_inner = s.knob("k_inner", (2, 4, 8), 4)
    i0, i1, i2, i3 = s.tile(i, 2 * mr, mr, p.m)         # 2 x 2 accumulator tiles per block
    j0, j1, j2, j3 = s.tile(j, 2 * nr, nr, p.n)
    k0, k1, k2 = s.tile(k, k_inner * p.k, p.k)
    s.reorder(i0, j0, i1, j1, k0, k1, i2, j2, i3, j3, k2)
    s.parallel([i0, j0], "core")
    tile = s.parallel([i1, j1], "subcore") or j1
    s.cache("C", "accumulator", at=tile)
    for operand in ("A", "B"):
        s.cache(operand, "scratchpad", at=k0)
        s.cache(operand, "operand", at=k1)
    s.pipeline(k0, s.knob("stages", (2, 3, 1), 3))
    s.tensorize(i3)
    s.fuse_epilogue()


op = ops.matmul(4096, 4096, 4096, dtype="float16", acc_dtype="float32")
print(tsl.schedule(op, gpu, gemm))

art = tsl.build(op, target="tensorcore-sm90", schedule=gemm)
k = art.kernel
print(f"\nkernel {k.name}: grid {k.grid}, block {k.block}, "
      f"{k.dynamic_shared_bytes // 1024} KiB dynamic + {k.static_shared_bytes // 1024} KiB "
      f"static shared memory")
src = art.source()
body = src[src.index('extern "C" __global__'):]
print("\n".join(line for line in body.splitlines()
                if "wmma::" in line or "cp_async" in line)[:1500])

try:
    for arch in ("sm_80", "sm_90"):
        ok, summary = art.check(arch)
        print(f"PTX {arch}: {'ok' if ok else 'NOT OK'}: {summary}")
        assert ok
except tsl.BackendUnavailable as e:                    # no nvcc here: source only
    print(e)

print("\nestimate:")
print(art.estimate())

# A schedule that asks for more shared memory than a block may have is refused before any
# CUDA is generated: 128x128 tiles of A and B, 128 deep, in 3 pipeline stages on an A100.
try:
    tsl.build(op, "tensorcore-sm80", schedule=gemm, knobs={"k_inner": 8, "stages": 3})
except tsl.ScheduleError as e:
    print("\nScheduleError:", e)
else:
    raise AssertionError("3 x 128 KiB of tiles do not fit 163 KiB of shared memory")

try:
    art.run(*op.random_inputs(0))
    print("ran on a GPU")
except tsl.BackendUnavailable as e:
    print("\nrun:", e)
