"""Tutorial 3: the schedule of tutorial 1, built for a TPU.

The schedule function is the one of tutorial 1 (copied so this file runs alone); nothing in it
names a TPU. The TAM file `tpu-v5e` says what its roles are there: the tensor primitive is a
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

import tsl
from tsl import ops

tpu = tsl.load_machine("tpu-v5e")
mxu = tpu.primitive("bfloat16")
print(f"machine {tpu.name}: primitive {mxu.name} {mxu.m}x{mxu.n}x{mxu.k} "
      f"{mxu.a_dtype}->{mxu.acc_dtype}, " + ", ".join(
          f"{lv.name} ({lv.role}) {lv.capacity / 2**20:g} MiB" for lv in tpu.memory[1:]))


# 1. The schedule of tutorial 1, unchanged: sizes are multiples of the primitive's shape.
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
    s.cache("C", "accumulator", at=s.loops[0])        # the mr x nr tile of C
    s.pack("B")                                       # B in the primitive's layout
    s.cache("A", "scratchpad", at=k0)
    s.cache("B", "scratchpad", at=k0)
    s.tensorize(i2)                                   # i2, j2, k2: one primitive call
    s.fuse_epilogue()


op = ops.matmul(2048, 2048, 2048, dtype="bfloat16", acc_dtype="float32")

# 2. The knobs are in primitive units, so the CPU's defaults are far too large for 128-wide
#    primitives (an 8x64 block of 128x128 tiles). The default depth overflows VMEM:
try:
    tsl.schedule(op, tpu, my_schedule)
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

# 5. The estimate from the TAM. This schedule does not pipeline, so each tile's load and its
#    MXU passes add up.
print(art.estimate())

# 6. The default schedule pipelines the reduction blocks (double-buffered VMEM tiles, which the
#    program shows as loop-carried prefetch) and picks its tiles from the VMEM capacities.
default = tsl.build(op, "tpu-v5e")
print(f"default schedule knobs {default.schedule.knob_values}")
print(default.estimate())
row = default.benchmark()
print(f"default: {row['seconds'] * 1e6:.1f} us, MXU utilization {100 * row['utilization']:.1f}%;"
      f" {row['baseline']}: {row['baseline_seconds'] * 1e6:.1f} us; speedup {row['speedup']:.2f}x")
