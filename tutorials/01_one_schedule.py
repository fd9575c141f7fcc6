"""Tutorial 1: write your own TSL schedule for matmul, validate it, build it, verify it.

A TSL schedule is a function of a `tsl.Schedule`. It names no chip: it tiles loops, maps them on
compute levels by role ("core", "subcore"), stages operand tiles in memory levels by role
("scratchpad", "operand", "accumulator") and hands the innermost nest to the machine's tensor
primitive. The Tensor Abstract Machine (TAM) file of the target says what those roles are there.
The schedule of this tutorial lives in `my_schedule.py`; tutorials 2-4 build the same function
for VTA, a TPU and Tensor Cores.

Run: python tutorials/01_one_schedule.py
"""

import inspect
import tempfile
from pathlib import Path

import tsl
from my_schedule import my_schedule
from tsl import ops
from tsl.backends.cpu import detect
from tsl.bench.rows import compulsory_bytes
from tsl.tam import roofline

# 1. The machine: plain data from a TOML file. target="cpu" means the built-in file that fits
#    this host best (x86-avx2, x86-avx512, aarch64-neon-dotprod, ...), with the host's core
#    count and caches and its measured rates; `python -m tsl.backends.cpu detect` says which
#    and why.
cpu = detect()
acc = cpu.levels("accumulator", "C")[0]
prim = cpu.primitive("float32")
print(f"machine {cpu.name}: {cpu.cores()} cores, primitive {prim.name}, "
      f"accumulator level {acc.name} of {acc.capacity} B")
print("\n".join(cpu.notes))

#    Its roofline, from the same file: a compute ceiling per operand dtype (the [peaks] table)
#    and a bandwidth ceiling per memory level that states one. `python -m tsl.tam show
#    x86-avx512 --plot roof.png` draws the same picture; step 7 puts this tutorial's kernels on it.
for c in roofline.compute_ceilings(cpu):
    print(f"  compute ceiling {c.label}: {c.value / 1e9:.0f} GOP/s")
for c in roofline.bandwidth_ceilings(cpu):
    print(f"  bandwidth ceiling {c.label}: {c.value / 1e9:.1f} GB/s")
roof = Path(tempfile.gettempdir()) / "roofline-x86-avx512.png"
roofline.plot(cpu, roof)
print(f"roofline of {cpu.name}: {roof}")

# 2. The schedule, written against roles and knobs.
print(inspect.getsource(my_schedule))

# 3. Record it and validate it against the machine (no TVM involved yet). The accumulator tile
#    is rows x cols vector registers of the primitive's width: as many as the machine file grants
#    to C (24 zmm on x86-avx512, 12 ymm on x86-avx2, 24 v registers on aarch64).
regs = acc.capacity // (prim.n * 4)
cols = 4 if regs >= 24 else 2
rows = max(r for r in (1, 2, 4, 6, 8) if r * cols <= regs)
op = ops.matmul(512, 512, 512, dtype="float32")
knobs = {"rows": rows, "cols": cols, "depth": 64}
print(tsl.schedule(op, cpu, my_schedule, knobs))

# 4. Build, run, verify against NumPy.
art = tsl.build(op, "cpu", schedule=my_schedule, knobs=knobs)
a, b = op.random_inputs(seed=0)
c = art.run(a, b)
ok, err = op.check(c, op.reference(a, b))
mine_s = art.time(a, b)
print(f"my schedule: verified={ok} (relative error {err:.1e}), {mine_s * 1e3:.2f} ms")
assert ok

# 5. A tile too large for the accumulator level is refused before anything is lowered.
try:
    tsl.build(op, "cpu", schedule=my_schedule, knobs={"rows": 8, "cols": 4})
except tsl.ScheduleError as e:
    print("ScheduleError:", e)
else:
    raise AssertionError("8 x 4 vector registers of accumulator do not fit any CPU's register file")

# 6. The operator's default schedule (tsl.schedules) for comparison: the same roles, with knob
#    defaults derived from the machine's capacities.
default = tsl.build(op, "cpu")
default_s = default.time(a, b)
print(f"default schedule: verified={default.verify()[0]}, {default_s * 1e3:.2f} ms, "
      f"knobs {default.schedule.knob_values}")
print(default.estimate())

# 7. Both kernels on the roofline: x = operations per byte of compulsory DRAM traffic (each
#    input read once, the output written once), y = the measured rate. A point far below the
#    ceiling above it is the schedule's to win back. (`python -m tsl.bench --report DIR` draws
#    every bench row this way, per machine.)
x = 2 * op.macs / compulsory_bytes(op)
roofline.plot(cpu, roof, [roofline.Point(x, 2 * op.macs / t, name, "measured")
                          for name, t in (("mine", mine_s), ("default", default_s))])
print(f"{op} at {x:.0f} OP/B: mine {2 * op.macs / mine_s / 1e9:.0f} GOP/s, default "
      f"{2 * op.macs / default_s / 1e9:.0f} GOP/s; roofline with both: {roof}")
