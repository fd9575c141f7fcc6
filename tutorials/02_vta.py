"""Tutorial 2: one schedule, built for VTA.

The schedule (`my_schedule.py`, the one of tutorial 1) is written once, against the roles of the Tensor Abstract Machine (the
compute level "core", the "accumulator" and "scratchpad" memory levels, the machine's tensor
primitive), exactly as for the CPU. On VTA the same calls mean:

- the accumulator tile sits in VTA's ACC buffer, operand tiles in its INP and WGT buffers;
- `parallel(..., "core")` runs blocks as VTA's two virtual threads (interleaved instruction
  streams that use separate halves of every buffer);
- `pipeline(k.0, 2)` double-buffers the loads, synchronised with dependency tokens;
- `tensorize` maps the inner 1x16x16 product onto VTA's GEMM instruction;
- `fuse_epilogue` runs the requantization (bias add, shift, clip) on VTA's ALU in ACC.

What is new to look at: the program (VTA instructions, one per line), and the estimate (cycles
of the cycle model, and what kept each module busy).
"""

import numpy as np

import tsl
from my_schedule import my_schedule

# Knob values for VTA: an 8 x 32 accumulator tile (8 rows of the 1 x 16 primitive, 2 blocks of
# 16 output channels), 4 blocks of 16 input channels per load.
KNOBS = {"rows": 8, "cols": 2, "depth": 4}


if __name__ == "__main__":
    op = tsl.ops.dense(64, 256, 128, dtype="int8",
                       epilogue=tsl.ops.requantize(shift=8, bias=True, clip=(0, 127)))
    for target in ("cpu", "vta"):
        try:
            art = tsl.build(op, target, schedule=my_schedule, knobs=KNOBS)
        except tsl.TSLError as e:  # e.g. a host without AVX-512 VNNI
            print(f"{target}: {e}")
            continue
        x, w, b = op.random_inputs(seed=0)
        # The inference pattern: the weights and bias padded and packed once (`bind`), then
        # each call pays for the activations only; `art.run(x, w, b)` gives the same result.
        f = art.bind(B=w, bias=b)
        y = f(x)
        print(f"{target}: bit-exact with NumPy: {np.array_equal(y, op.reference(x, w, b))}")
    prog = art.program()
    print(f"\nVTA program: {len(prog.insns)} instructions {prog.counts()}; the first 12:")
    print("\n".join(str(prog).splitlines()[:12]))
    print(f"as 128-bit words: {prog.words()[:2].tolist()} ...")
    print("\nestimate:\n" + str(art.estimate()))
