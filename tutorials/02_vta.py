"""Tutorial 2: one schedule, built for VTA.

The schedule below is written once, against the roles of the Tensor Abstract Machine (the
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


def schedule_gemm(s: tsl.Schedule) -> None:
    """A tiled GEMM feeding the machine's tensor primitive (the default schedule, simplified)."""
    p = s.primitive
    (i,), (j,), (k,) = s.axes("m"), s.axes("n"), s.axes("k")
    m_inner = s.knob("m_inner", (1, 2, 4, 8, 16), 8)
    n_inner = s.knob("n_inner", (1, 2, 4), 2)
    k_inner = s.knob("k_inner", (1, 2, 4, 8), 4)
    i0, i1, i2, i3 = s.tile(i, m_inner * p.m * 2, m_inner * p.m, p.m)
    j0, j1, j2, j3 = s.tile(j, n_inner * p.n, n_inner * p.n, p.n)
    k0, k1, k2 = s.tile(k, k_inner * p.k, p.k)
    s.reorder(i0, j0, i1, j1, k0, k1, i2, j2, i3, j3, k2)
    s.parallel([i0, j0], "core")
    s.cache("C", "accumulator", at=j1)
    s.pack("B")
    for operand in ("A", "B"):
        s.cache(operand, "scratchpad", at=k0)
    s.pipeline(k0, 2)
    s.tensorize(i3)
    s.fuse_epilogue()


if __name__ == "__main__":
    op = tsl.ops.dense(64, 256, 128, dtype="int8",
                       epilogue=tsl.ops.requantize(shift=8, bias=True, clip=(0, 127)))
    for target in ("cpu", "vta"):
        try:
            art = tsl.build(op, target, schedule=schedule_gemm)
        except tsl.TSLError as e:  # e.g. a host without AVX-512 VNNI
            print(f"{target}: {e}")
            continue
        x, w, b = op.random_inputs(seed=0)
        y = art.run(x, w, b)
        print(f"{target}: bit-exact with NumPy: {np.array_equal(y, op.reference(x, w, b))}")
    prog = art.program()
    print(f"\nVTA program: {len(prog.insns)} instructions {prog.counts()}; the first 12:")
    print("\n".join(str(prog).splitlines()[:12]))
    print(f"as 128-bit words: {prog.words()[:2].tolist()} ...")
    print("\nestimate:\n" + str(art.estimate()))
