"""The schedule of the tutorials: one function, imported unchanged by each of them.

It names no machine. Sizes are multiples of the tensor primitive's shape (the knobs count
primitives), loops are mapped on compute roles, tiles are staged in memory roles; the TAM of the
target says what those roles are there. A role the machine lacks (warps on a CPU, fragments on
VTA) is recorded as skipped, so the same function builds everywhere; the knob values are what
differs from machine to machine.
"""

import tsl


def my_schedule(s: tsl.Schedule) -> None:
    p = s.primitive                                    # chosen by the operator's dtypes
    (i,), (j,), (k,) = s.axes("m"), s.axes("n"), s.axes("k")
    mr = p.m * s.knob("rows", (1, 2, 4, 6, 8), 4)       # accumulator tile: mr x nr
    nr = p.n * s.knob("cols", (1, 2, 4), 4)
    tiles = s.knob("tiles", (1, 2), 1)                  # accumulator tiles per block side
    kc = p.k * s.knob("depth", (4, 16, 64, 256), 16)    # reduction block
    i0, i1, i2, i3 = s.tile(i, tiles * mr, mr, p.m)
    j0, j1, j2, j3 = s.tile(j, tiles * nr, nr, p.n)
    k0, k1, k2 = s.tile(k, kc, p.k)
    s.reorder(i0, j0, i1, j1, k0, k1, i2, j2, i3, j3, k2)
    s.parallel([i0, j0], "core")                       # blocks over cores / SMs / vthreads
    tile = s.parallel([i1, j1], "subcore") or j1       # accumulator tiles over warps, if any
    s.cache("C", "accumulator", at=tile)               # C accumulates on chip
    s.pack("B")                                        # B in the primitive's layout
    for operand in ("A", "B"):
        s.cache(operand, "scratchpad", at=k0)          # a block of the reduction, on chip
        s.cache(operand, "operand", at=k1)             # one step of it, next to the primitive
    s.pipeline(k0, 2)                                  # load block t+1 while computing t
    s.tensorize(i3)                                    # i3, j3, k2: one primitive call
    s.fuse_epilogue()                                  # bias/relu/requantize before the store
