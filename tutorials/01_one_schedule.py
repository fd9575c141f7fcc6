"""Tutorial 1: write your own TSL schedule for matmul, validate it, build it, verify it.

A TSL schedule is a function of a `tsl.Schedule`. It names no chip: it tiles loops, maps them on
compute levels by role ("core", "subcore"), stages operand tiles in memory levels by role
("scratchpad", "operand", "accumulator") and hands the innermost nest to the machine's tensor
primitive. The Tensor Abstract Machine (TAM) file of the target says what those roles are there.

Run: python tutorials/01_one_schedule.py
"""

import numpy as np

import tsl
from tsl import ops

# 1. The machine: plain data from a TOML file.
cpu = tsl.load_machine("x86-avx512")
print(f"machine {cpu.name}: {cpu.cores()} cores, accumulator level "
      f"{cpu.levels('accumulator', 'C')[0].name} of {cpu.levels('accumulator', 'C')[0].capacity} B")


# 2. A schedule written against roles and knobs. Sizes are multiples of the primitive's shape,
#    so the same function fits a 1x16x1 FMA, a 1x16x4 VNNI dot or a 16x16x16 mma.
def my_schedule(s: tsl.Schedule) -> None:
    p = s.primitive                                   # chosen by the operator's dtypes
    (i,), (j,), (k,) = s.axes("m"), s.axes("n"), s.axes("k")
    mr = p.m * s.knob("rows", (1, 2, 4, 8), 8)         # accumulator tile: mr x nr
    nr = p.n * s.knob("cols", (1, 2, 4), 2)
    kc = p.k * s.knob("depth", (16, 64, 256), 64)
    i0, i1, i2 = s.tile(i, mr, p.m)                   # i1: rows of the tile, i2: primitive
    j0, j1, j2 = s.tile(j, nr, p.n)
    k0, k1, k2 = s.tile(k, kc, p.k)
    s.reorder(i0, j0, k0, k1, i1, j1, i2, j2, k2)
    s.parallel([i0, j0], "core")
    s.cache("C", "accumulator", at=s.loops[0])        # the mr x nr tile of C: in registers
    s.pack("B")                                       # B in the primitive's blocked layout
    s.cache("A", "scratchpad", at=k0)
    s.cache("B", "scratchpad", at=k0)
    s.tensorize(i2)                                   # i2, j2, k2: one primitive call
    s.fuse_epilogue()


op = ops.matmul(512, 512, 512, dtype="float32")

# 3. Record and validate it against the machine (no TVM involved yet).
s = tsl.schedule(op, cpu, my_schedule)
print(s)

# 4. Build, run, verify against NumPy.
art = tsl.build(op, "cpu", schedule=my_schedule)
a, b = op.random_inputs(seed=0)
c = art.run(a, b)
ok, err = op.check(c, op.reference(a, b))
print(f"my schedule: verified={ok} (relative error {err:.1e}), "
      f"{art.time(a, b) * 1e3:.2f} ms")
assert ok

# 5. A tile too large for the accumulator level is refused before anything is lowered.
try:
    tsl.build(op, "cpu", schedule=my_schedule, knobs={"rows": 8, "cols": 4})
except tsl.ScheduleError as e:
    print("ScheduleError:", e)
else:
    raise AssertionError("an 8x64 fp32 accumulator tile does not fit 1.5 KiB of registers")

# 6. The operator's default schedule (tsl.schedules) for comparison: the same roles, with a
#    deeper tile hierarchy and knob defaults derived from the machine's capacities.
default = tsl.build(op, "cpu")
print(f"default schedule: verified={default.verify()[0]}, {default.time(a, b) * 1e3:.2f} ms, "
      f"knobs {default.schedule.knob_values}")
print(default.estimate())
