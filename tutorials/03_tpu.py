"""Tutorial 3: the schedule of tutorial 1, built for a TPU.

The schedule function is the one of tutorial 1 (`my_schedule.py`); nothing in it names a TPU.
The TAM file `tpu-v5e` says what its roles are there: the tensor primitive is a 128x128x128 MXU
pass (bf16 x bf16 -> f32), the scratchpad is VMEM, the accumulator a VMEM region for the f32
tile. What is different to see on this target:

- the artifact is a Mosaic kernel (Pallas TPU): the schedule's block loops are its grid
  ("parallel" for blocks dealt to TensorCores, "arbitrary" for the reduction), its staged tiles
  are BlockSpecs (double-buffered in VMEM by the Pallas pipeline), its accumulator is VMEM
  scratch zeroed on the first reduction step, the epilogue runs on the last step, and the VMEM
  limit comes from the TAM. `art.hlo()` is the StableHLO a TPU runs (the kernel is a
  `tpu_custom_call` in it), `art.kernel()` the Mosaic kernel itself;
- without a TPU here, `art.run` runs the same kernel body in Pallas interpret mode on the CPU
  (numerics only), and the performance is a model (`art.estimate()`), compared with the public
  Pallas kernel's blocks and with XLA under the same model;
- `art.export(path)` writes the program for a TPU host (and an interpret-mode CPU twin);
- `emitter="stablehlo"` gives the portable while-loop program instead (runs on any XLA).

Run: python tutorials/03_tpu.py
"""

import inspect
import re
import tempfile
from pathlib import Path

import numpy as np

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

# 3. Build: the Mosaic kernel. Its block shapes and grid are the schedule's tiles and block
#    loops; read them back from the kernel text.
art = tsl.build(op, "tpu-v5e", schedule=my_schedule, knobs=knobs)
print("grid", [(a.name, a.extent, a.semantics) for a in art.plan.grid],
      " blocks", [(b.name, b.block) for b in art.plan.inputs + (art.plan.out,)])
try:
    kernel = art.kernel()
    print("Mosaic kernel: grid", re.findall(r"iteration_bounds = array<i64: [\d, ]*>", kernel),
          "blocks", re.findall(r"window_bounds = array<i64: [\d, ]*>", kernel))
    print("StableHLO for the TPU, first lines:\n" + "\n".join(art.hlo().splitlines()[:4]))

    # 4. Run it in Pallas interpret mode and compare with NumPy (bf16 in, f32 accumulation).
    a, b = op.random_inputs(seed=0)
    c = art.run(a, b)
    ok, err = op.check(c, op.reference(a, b))
    print(f"my schedule, interpret mode: verified={ok} (relative error {err:.1e})")
    assert ok

    # 5. Export: the serialized jax.export.Exported for platform "tpu", and its CPU twin.
    out = Path(tempfile.mkdtemp()) / "gemm.jaxexport"
    paths = art.export(out)
    print("exported:", {k: str(v) for k, v in paths.items()})
    import jax

    twin = jax.export.deserialize(paths["cpu"].read_bytes())
    twin_out = np.asarray(twin.call(a, b))
    print("the CPU twin runs here: verified =", op.check(twin_out, op.reference(a, b))[0])
    # On a Cloud TPU VM (pip install "jax[tpu]"), with the .jaxexport file copied over:
    #     import jax, numpy as np, ml_dtypes
    #     exp = jax.export.deserialize(open("gemm.jaxexport", "rb").read())
    #     a = np.random.rand(2048, 2048).astype(ml_dtypes.bfloat16); b = ...
    #     c = exp.call(a, b)          # the Mosaic kernel compiled by the TPU's XLA, on the TPU
    # jax.export keeps the calling convention stable across jax versions (check
    # exp.calling_convention_version against the TPU host's jax), and the kernel's VMEM limit
    # is in it; time it there with jax.block_until_ready to measure what the model estimates.
except tsl.BackendUnavailable as e:          # jax is an optional extra
    print("not run:", e)

# 6. The estimate (a model, not a measurement): per grid step the MXU time of the block's dot,
#    the VMEM traffic, the HBM blocks the pipeline moves, and a calibrated per-step overhead.
print(art.estimate())

# 7. The default schedule with the knobs the cost model picks (tsl.model, with the TPU's kernel
#    detail), against the public Pallas kernel's blocks (512/1024/1024) and XLA, all three
#    under the same model.
default = tsl.build(op, "tpu-v5e")
row = default.benchmark()
print(f"model's knobs {default.schedule.knob_values}: {row['seconds'] * 1e6:.1f} us, "
      f"MXU utilization {100 * row['utilization']:.1f}%; {row['baseline2']}: "
      f"{row['speedup2']:.2f}x; {row['baseline']}: {row['speedup']:.2f}x")

# 8. The portable program: while loops over the tiles, runs on any XLA (here XLA:CPU).
hlo = tsl.build(op, "tpu-v5e", schedule=my_schedule, knobs=knobs, emitter="stablehlo")
print("while-loop program:", hlo.structure.loops, "dots", hlo.structure.dots)
