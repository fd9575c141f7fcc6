"""Tutorial 4: the same GEMM schedule, built for NVIDIA Tensor Cores (no GPU needed).

The schedule is the one of tutorial 1 (`my_schedule.py`). It names no chip. On the CPU its "subcore" and "operand" levels do not exist (those steps are recorded as
serial / skipped); on a Tensor Core TAM they become warps and WMMA fragments:

    parallel(.., "core")     -> thread blocks (blockIdx.x), one per output tile
    parallel(.., "subcore")  -> warps (threadIdx.y), one accumulator tile each
    cache(.., "scratchpad")  -> shared memory tiles, filled with cp.async, `pipeline`d
    cache(.., "operand")     -> wmma.matrix_a / matrix_b fragments
    cache("C", "accumulator")-> wmma.accumulator fragments (registers)
    tensorize                -> wmma.mma.sync m16n16k16

What there is to see without a GPU: the CUDA program TVM generated, the PTX nvcc makes of it
(Tensor Core and cp.async instructions, registers and shared memory from ptxas) and a model of
its time from the TAM (the emitted instruction's rate, occupancy, L2 and shared-memory traffic per
tile, barriers, pipeline fill), with its upper bound. On a GPU machine `art.run(a, b)` runs it through CuPy.

Run: python tutorials/04_tensorcore.py
"""

import inspect

import tsl
from my_schedule import my_schedule
from tsl import ops

gpu = tsl.load_machine("tensorcore-sm90")
acc = gpu.levels("accumulator", "C")[0]
print(f"machine {gpu.name}: {gpu.cores()} SMs x {gpu.compute_level('subcore').count} warps, "
      f"{gpu.levels('scratchpad')[0].capacity // 1024} KiB shared memory per block, "
      f"accumulators {acc.capacity // 1024} KiB per warp")


# The schedule of tutorial 1, unchanged. Knob values for this machine: 64 x 64 accumulator
# tiles (4 x 4 fragments of 16 x 16, one per warp), 2 x 2 of them per block, 64-deep
# reduction blocks in shared memory.
print(inspect.getsource(my_schedule))
knobs = {"rows": 4, "cols": 4, "tiles": 2, "depth": 4}


op = ops.matmul(4096, 4096, 4096, dtype="float16", acc_dtype="float32")
print(tsl.schedule(op, gpu, my_schedule, knobs))

art = tsl.build(op, target="tensorcore-sm90", schedule=my_schedule, knobs=knobs)
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

print("\nestimate (a model, not a measurement):")
print(art.estimate())

# A schedule that asks for more shared memory than a block may have is refused before any
# CUDA is generated: 128 x 128 tiles of A and B, 256 deep and double-buffered, on an A100.
try:
    tsl.build(op, "tensorcore-sm80", schedule=my_schedule, knobs={**knobs, "depth": 16})
except tsl.ScheduleError as e:
    print("\nScheduleError:", e)
else:
    raise AssertionError("2 x 128 KiB of tiles do not fit 163 KiB of shared memory")

try:
    art.run(*op.random_inputs(0))
    print("ran on a GPU")
except tsl.BackendUnavailable as e:
    print("\nrun:", e)
