"""The baseline: classic TVM's VTA conv2d schedule with its published Pynq tile configurations
(docs/vta.md §6), expressed as knob values of the project's own conv2d schedule.

The classic schedule's structure, and the knob that reproduces each part of it:
- output loops (b, h0, co0, w0, co1, h1, w1) with the accumulator tile (and the store) at w0:
  h_inner = tile_h[1], w_inner = tile_w[1], co_inner = tile_co[1], co_outer = 1;
- data and kernel loaded at the outer reduction tile ci0, for all h1 rows at once:
  ci_inner = tile_ci[1], reduce_rows = True;
- oc_nthread / h_nthread = 2 virtual threads over co0 / h0: parallel_axes = "co" / "oh";
- no software pipelining besides the virtual threads: stages = 1;
- the virtual threads are TVM "cthread"s, and TVM's InjectVirtualThread gives every cthread
  its own copy of every buffer allocated under it (never shared) and issues each statement
  for every thread before the next statement: `build` compiles the baseline that way
  (codegen option `cthreads`), not with the sharing and per-thread ordering of tiles that
  the project's own programs get. (It keeps the back end's `keeps_tiles`, which the classic
  program does not have: that only helps the baseline.)
"""

from __future__ import annotations

from ...ops import conv2d, dense, requantize
from ...model import record_fixed
from ...primitives.schedule import Schedule
from ...schedules import schedule_conv2d

# layer: (H=W, Cin, Cout, kernel, pad, stride)
LAYERS = {
    "C2": (56, 64, 64, 3, 1, 1), "C3": (56, 64, 128, 3, 1, 2), "C4": (56, 64, 128, 1, 0, 2),
    "C5": (28, 128, 128, 3, 1, 1), "C6": (28, 128, 256, 3, 1, 2), "C7": (28, 128, 256, 1, 0, 2),
    "C8": (14, 256, 256, 3, 1, 1), "C9": (14, 256, 512, 3, 1, 2), "C10": (14, 256, 512, 1, 0, 2),
    "C11": (7, 512, 512, 3, 1, 1)}
# layer: (tile_h, tile_w, tile_ci, tile_co, oc_nthread, h_nthread)
TILES = {
    "C2": ((7, 8), (1, 56), (4, 1), (2, 2), 2, 1),
    "C3": ((4, 7), (1, 28), (4, 1), (2, 4), 2, 1),
    "C4": ((4, 7), (1, 28), (4, 1), (2, 4), 1, 2),
    "C5": ((2, 14), (1, 28), (8, 1), (4, 2), 1, 2),
    "C6": ((1, 14), (1, 14), (8, 1), (4, 4), 2, 1),
    "C7": ((2, 7), (1, 14), (8, 1), (2, 8), 2, 1),
    "C8": ((1, 14), (1, 14), (16, 1), (4, 4), 2, 1),
    "C9": ((1, 7), (1, 7), (16, 1), (2, 16), 2, 1),
    "C10": ((1, 7), (1, 7), (16, 1), (2, 16), 2, 1),
    "C11": ((1, 7), (1, 7), (32, 1), (2, 16), 2, 1)}
EPILOGUE = requantize(shift=8, bias=True, clip=(0, 127))


def layer(name: str):
    """ResNet-18 layer `name` as an int8 conv2d with VTA's post-processing."""
    hw, cin, cout, k, pad, stride = LAYERS[name]
    return conv2d(1, cin, hw, hw, cout, k, k, stride=stride, padding=pad, dtype="int8",
                  epilogue=EPILOGUE)


def gemm(m: int, k: int, n: int):
    """An int8 fully connected layer (batch m, k inputs, n outputs) with the same epilogue."""
    return dense(m, k, n, dtype="int8", epilogue=EPILOGUE)


def layer_of(op) -> str | None:
    if op.name != "conv2d" or op.params["layout"] != "NCHW":
        return None
    n, c, h, w, k, r, s = op.params["shape"]
    key = (h, c, k, r, op.params["padding"], op.params["stride"])
    if n != 1 or h != w or r != s or op.params["dilation"] != 1:
        return None
    return next((name for name, v in LAYERS.items() if v == key), None)


def knobs(op, machine) -> dict | None:
    """The classic configuration of `op` as knobs of `schedule_conv2d` (None: not a layer of
    the table, or a machine whose blocks are not the 16 the table was tuned for)."""
    name = layer_of(op)
    if name is None or machine.primitives[0].shape != (1, 16, 16):
        return None
    th, tw, tci, tco, oc_n, h_n = TILES[name]
    return {"h_inner": th[1], "w_inner": tw[1], "ci_inner": tci[1], "co_inner": tco[1],
            "co_outer": 1, "reduce_rows": True, "parallel_axes": "co" if oc_n > 1 else "oh",
            "stages": 1}


def schedule(op, machine, knob_values: dict) -> Schedule:
    return record_fixed(op, machine, schedule_conv2d, knob_values)


def build(op, machine, knob_values: dict | None = None):
    """The classic program of `op` (its published tiles unless `knob_values` are given), as
    TVM's cthread injection lays it out (see the module docstring)."""
    from . import backend

    knob_values = knobs(op, machine) if knob_values is None else knob_values
    return backend.build(schedule(op, machine, knob_values), cthreads=True)
