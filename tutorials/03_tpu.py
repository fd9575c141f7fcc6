"""Tutorial 3: the schedule of tutorial 1, built for a TPU.

The schedule function is the one of tutorial 1 (`my_schedule.py`); nothing in it names a TPU. The TAM file `tpu-v5e` says what its roles are there: the tensor primitive is a
128x128x128 MXU pass (bf16 x bf16 -> f32), the scratchpad is VMEM, the accumulator a VMEM region
for the f32 tile. What is different to see on this target:

- the artifact is an XLA program (StableHLO, or classic HLO) whose loops are the schedule's
  tile loops (`while`), whose staged tiles are `dynamic_slice`s, and whose tensorized nest is a
  `dot_general` per tile, accumulated in a loop-carried f32 tile;
- without a TPU here, the program runs on XLA's CPU client (jaxlib) for numerics only, and the
  performance is an estimate from the TAM: MXU passes, HBM traffic of the schedule's tiles,
  VMEM footprint, and the roofline time with or without pipelining.

Run: python tutorials/03_tpu.py
"""

import inspect

import tsl
from my_schedule import my_schedule
from tsl import ops

tpu = tsl.load_machine("tpu-v5e")
mxu = tpu.primitive("bfloat16")
print(f"machine {tpu.name}: primitive {mxu.name} {mxu.m}x{mxu.n}x{mxu.k} "
      f"{mxu.a_dtype}->{mxu.acc_dtype}, " + ", ".join(
          f"{lv.name} ({lv.role}) {lv.capacity / 2**20:g} MiB" for lv in tpu.memory[1:]))


# 1. The schedule of tutorial 1 (my_schedule.py), unchanged.
print(inspect.getsource(my_schedule))


op = ops.matmul(2048, 2048, 2048, dtype="bfloat16", acc_dtype="float32")

# 2. The knobs count primitives, so on 128-wide primitives a "depth" of 64 means 8192-deep
#    reduction blocks: their A and B tiles overflow VMEM, and the schedule says so.
try:
    tsl.schedule(op, tpu, my_schedule, {"rows": 4, "cols": 4, "depth": 64})
except tsl.ScheduleError as e:
    print("ScheduleError:", e)
else:
    raise AssertionError("8192-deep A and B tiles do not fit 10 MiB of VMEM")

# A 512x512 accumulator tile and 2048-deep reduction blocks fit.
knobs = {"rows": 4, "cols": 4, "depth": 16}
print(tsl.schedule(op, tpu, my_schedule, knobs))

# 3. Build: the TIR the schedule lowers to becomes an XLA program. `main` takes the user's
#    shapes (and would pad them to the tiles explicitly); `@tiled` is the schedule.
art = tsl.build(op, "tpu-v5e", schedule=my_schedule, knobs=knobs)
print(art.hlo())
print("while loops:", art.structure.loops, " tiles:", sorted(set(art.structure.slices)),
      " dots:", art.structure.dots)

# 4. Run it on XLA's CPU client and compare with NumPy (bf16 inputs, f32 accumulation).
try:
    a, b = op.random_inputs(seed=0)
    c = art.run(a, b)
    ok, err = op.check(c, op.reference(a, b))
    print(f"my schedule on XLA:CPU: verified={ok} (relative error {err:.1e})")
    assert ok
    print("classic HLO, first lines:\n" + "\n".join(art.hlo(dialect="hlo").splitlines()[:6]))
except tsl.BackendUnavailable as e:          # jax/jaxlib is an optional extra
    print("not run:", e)

# 5. The estimate from the TAM: MXU passes, padding, HBM traffic of the staged tiles, VMEM.
print(art.estimate())

# 6. The default schedule pipelines the reduction blocks (double-buffered VMEM tiles, which the
#    program shows as loop-carried prefetch) and picks its tiles from the VMEM capacities.
default = tsl.build(op, "tpu-v5e")
print(f"default schedule knobs {default.schedule.knob_values}")
print(default.estimate())
row = default.benchmark()
print(f"default: {row['seconds'] * 1e6:.1f} us, MXU utilization {100 * row['utilization']:.1f}%;"
      f" {row['baseline']}: {row['baseline_seconds'] * 1e6:.1f} us; speedup {row['speedup']:.2f}x")
