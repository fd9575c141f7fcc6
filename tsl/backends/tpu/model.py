"""The TPU cost model of a Mosaic kernel, and the baselines priced by the same model.

`price(plan, machine)` walks the kernel's grid in the order Pallas runs it and prices each step:

- MXU: the step's dot (rows x K x columns) as 128x128 weight tiles; each tile streams the rows
  (padded to the row group, 8) through one MXU at `rows / (MACs per cycle / 16384 / MXUs)`
  cycles, but never faster than the weight push (`mxu_weight_push_cycles`); the tiles are dealt
  to the MXUs; plus `mxu_fill_cycles` once per dot (fill and drain of the systolic array);
- VMEM <-> MXU: the operand tiles read, the f32 accumulator read and written (and the im2col
  tile written, for conv2d) at `vmem_bytes_per_cycle`; overlapped with the MXU (max);
- the VPU epilogue on the steps that write the output;
- HBM: the blocks the pipeline moves at this step (a block whose index did not change is kept
  in VMEM), overlapped with the previous step's compute (Pallas double-buffers every block);
- `grid_step_cycles` of fixed overhead per step (DMA issue and waits, semaphores, scalar work);
- the XLA passes around the kernel (padding, layout changes, crop) at HBM bandwidth, serial.

Parallel grid axes are dealt to the TensorCores (the busiest core sets the time; HBM bandwidth
is shared). Every constant is a `[params]` entry of the machine file, with its source there.
The same function prices tsl's kernel, the public-style Pallas kernel and the XLA model, so
their ratios compare like with like. `kernel_cost` is the one function another cost model
plugs in: a plan and a machine in, per-level traffic and time out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...tam.machine import Machine, dtype_bytes
from .plan import Axis, Block, Pass, Plan, conv_plan_for


@dataclass
class KernelCost:
    seconds: float
    steps: int
    mxu_s: float  # MXU busy time (padding included) on the busiest core
    vmem_s: float
    vpu_s: float
    hbm_s: float  # kernel DMA time if nothing overlapped it
    overhead_s: float  # grid-step overhead
    fill_s: float  # the pipeline's first loads and last store
    passes_s: float
    mxu_macs: int  # MACs the MXUs execute, padding included
    traffic: dict = field(default_factory=dict)  # level -> bytes moved into/out of it
    bound: str = ""
    lines: list = field(default_factory=list)


def _p(m: Machine, key: str) -> float:
    return float(m.params[key])


def kernel_cost(plan: Plan, m: Machine) -> KernelCost:
    """Price `plan` on machine `m` (see the module docstring)."""
    prim = m.primitive(plan.inputs[0].dtype) or m.primitives[0]
    clock = m.clock_hz
    n_mxu = int(m.params["mxu_count"])
    side = prim.m
    rows_per_cycle = prim.macs_per_cycle / (n_mxu * prim.n * prim.k)  # per MXU
    group = int(m.params["tiling"][0])
    rows, kk, cols = plan.dot
    rows8 = -(-rows // group) * group
    tiles = -(-kk // side) * -(-cols // prim.n)
    per_tile = max(rows8 / rows_per_cycle, _p(m, "mxu_weight_push_cycles"))
    mxu_cyc = math.ceil(tiles * per_tile / n_mxu) + _p(m, "mxu_fill_cycles")
    in_size = dtype_bytes(plan.inputs[0].dtype)
    acc_size = dtype_bytes(plan.acc_dtype)
    vmem_step = (rows8 * kk + kk * cols) * in_size + 2 * rows8 * cols * acc_size
    if plan.kind == "conv":
        vmem_step += rows8 * kk * in_size  # the im2col tile is written, then read by the MXU
    vmem_cyc = vmem_step / _p(m, "vmem_bytes_per_cycle")
    compute = max(mxu_cyc, vmem_cyc) / clock
    # Cores: the parallel axes' blocks are dealt out; HBM bandwidth is shared.
    par = math.prod(a.extent for a in plan.grid if a.semantics == "parallel")
    cores = min(m.cores(), par) if par > 1 else 1
    share = math.ceil(par / cores) / par if par > 1 else 1.0
    bw = _p(m, "hbm_bytes_per_s") / cores
    S = plan.steps
    load = np.zeros(S)
    traffic_in = 0
    for b in plan.inputs:
        f = plan.fetches(b)
        load += f * b.block_bytes
        traffic_in += int(f.sum()) * b.block_bytes
    # An output block is written back when the next step moves to another block (and after
    # the last step).
    out_change = plan.fetches(plan.out)
    store_at = np.zeros(S)
    store_at[:-1] = out_change[1:] * plan.out.block_bytes
    store_at[-1] = plan.out.block_bytes
    traffic_out = int(out_change.sum()) * plan.out.block_bytes
    steps = plan.epilogue.steps if plan.epilogue is not None else ()
    vpu = m.vectors[0].ops_per_cycle if m.vectors else 1024.0
    epi = store_at > 0
    vpu_step = rows8 * cols * max(1, len(steps)) / vpu / clock
    comp = np.full(S, compute) + epi * vpu_step
    # Step t's compute overlaps the loads of step t+1 and the store of step t-1.
    dma = np.zeros(S)
    dma[:-1] += load[1:]
    dma[1:] += store_at[:-1]
    body = float(np.maximum(comp, dma / bw).sum())
    fill = (load[0] + store_at[-1]) / bw
    overhead = S * _p(m, "grid_step_cycles") / clock
    passes_b = sum(p.read + p.written for p in plan.passes)
    passes_s = passes_b / _p(m, "hbm_bytes_per_s")
    seconds = (body + overhead) * share + fill + passes_s
    mxu_s = S * share * mxu_cyc / clock
    hbm_s = (traffic_in + traffic_out) / bw * share
    parts = {"MXU": mxu_s, "HBM": hbm_s, "grid-step overhead": overhead * share,
             "VMEM": S * share * vmem_cyc / clock, "passes": passes_s + fill}
    bound = max(parts, key=parts.get)
    lines = [f"grid {tuple(a.extent for a in plan.grid)} = {S:,} steps "
             f"({', '.join(a.semantics for a in plan.grid)}), {cores} core(s)",
             f"per step: dot {rows}x{kk}x{cols} ({rows8} rows padded to {group}): "
             f"{tiles} weight tiles on {n_mxu} MXUs = {mxu_cyc:,.0f} cycles; VMEM "
             f"{vmem_step:,} B = {vmem_cyc:,.0f} cycles; overhead "
             f"{_p(m, 'grid_step_cycles'):,.0f} cycles"]
    for b in plan.inputs + (plan.out,):
        n = int(plan.fetches(b).sum())
        lines.append(f"{b.name}: block {tuple(b.block)} of {b.shape} {b.dtype}, moved {n:,} "
                     f"times ({n * b.block_bytes / 1e6:.2f} MB)")
    lines += [f"pass: {p.what}: {(p.read + p.written) / 1e6:.2f} MB" for p in plan.passes
              if p.read + p.written]
    macs = S * tiles * rows8 * side * prim.n
    traffic = {"hbm": traffic_in + traffic_out + passes_b,
               "vmem": int(S * vmem_step + traffic_in + traffic_out)}
    return KernelCost(seconds, S, mxu_s, S * share * vmem_cyc / clock,
                      float((epi * vpu_step).sum()) * share, hbm_s, overhead * share, fill,
                      passes_s, macs, traffic, bound, lines)


# -- the baselines: the same kernel structure, blocks picked another way -----------------------
def _ceil(x: int, q: int) -> int:
    return -(-x // q) * q


def gemm_plan_for(op, bm: int, bk: int, bn: int, source: str, passes: bool = True,
                  user=None) -> Plan:
    """The Pallas GEMM kernel of the public examples (grid (batch, M/bm, N/bn, K/bk), A and B
    blocks, f32 accumulator, "parallel, parallel, arbitrary") for `op` with the given blocks
    (clipped to the operator; the operator padded to whole blocks). `user`: the operator the
    caller's arrays have, when `op` is its padded form (the padding passes are priced)."""
    user = user or op
    b = op.params["shape"][0] if op.name == "batch_matmul" else 0
    M, N, K = op.params["shape"][-3:]
    bm, bn, bk = min(bm, _ceil(M, 8)), min(bn, _ceil(N, 128)), min(bk, _ceil(K, 128))
    Mp, Np, Kp = _ceil(M, bm), _ceil(N, bn), _ceil(K, bk)
    tb = op.params["transpose_b"]
    lead = (b,) if b else ()
    sq = (None,) if b else ()
    a = Block("A", lead + (Mp, Kp), op.dtype, sq + (bm, bk),
              lambda g, i, j, k: ((g,) if b else ()) + (i, k))
    bb = Block("B", lead + ((Np, Kp) if tb else (Kp, Np)), op.dtype,
               sq + ((bn, bk) if tb else (bk, bn)),
               lambda g, i, j, k: ((g,) if b else ()) + ((j, k) if tb else (k, j)))
    ins = [a, bb]
    if op.epilogue.has_bias:
        ins.append(Block("bias", (1, Np), op.acc_dtype, (1, bn), lambda g, i, j, k: (0, j)))
    out = Block("out", lead + (Mp, Np), op.out_dtype, sq + (bm, bn),
                lambda g, i, j, k: ((g,) if b else ()) + (i, j))
    grid = (Axis("b", b or 1, "parallel", False), Axis("i", Mp // bm, "parallel", False),
            Axis("j", Np // bn, "parallel", False), Axis("k", Kp // bk, "arbitrary", True))
    kept = []
    for t, shape in ((user.inputs[0], a.shape), (user.inputs[1], bb.shape)):
        if passes and t.shape != shape:
            size = dtype_bytes(t.dtype)
            kept.append(Pass(f"pad {t.name}", math.ceil(math.prod(t.shape) * size),
                               math.ceil(math.prod(shape) * size)))
    if passes and out.shape != user.output.shape:
        n = math.ceil(math.prod(user.output.shape) * dtype_bytes(op.out_dtype))
        kept.append(Pass("crop out", n, n))
    dims = (((1,), (1,)) if tb else ((1,), (0,)), ((), ()))
    return Plan("gemm", grid, tuple(ins), out, (bm, bn), op.acc_dtype, (bm, bk, bn), dims,
                op.epilogue, op.out_dtype, tuple(kept), source=source)


PUBLIC_BLOCKS = (512, 1024, 1024)  # bm, bk, bn of the Pallas TPU matmul guide's fast kernel


def public_pallas(op, m: Machine) -> tuple[Plan, KernelCost]:
    """The Pallas TPU matmul guide's kernel (bm=512, bk=1024, bn=1024, clipped to the operator)
    under the same model. For conv2d: the same guide's blocks applied to the im2col GEMM (512
    rows of output pixels, all of K = R·S·C up to 1024, 1024 channels)."""
    if op.name == "conv2d":
        P, Q = (op.output.shape[2], op.output.shape[3]) if op.params["layout"] == "NCHW" \
            else (op.output.shape[1], op.output.shape[2])
        plan = conv_plan_for(op, min(P, max(1, 512 // Q)), 1024, 1024 // 9 // 128 * 128 or 128,
                             int(m.params["tiling"][0]), source="public Pallas blocks")
    else:
        plan = gemm_plan_for(op, *PUBLIC_BLOCKS, source="public Pallas blocks")
    return plan, kernel_cost(plan, m)


def _fits(plan: Plan, m: Machine) -> bool:
    return plan.vmem_bytes()[0] <= int(m.params["vmem_scoped_bytes"])


def xla_model(op, m: Machine) -> tuple[Plan, KernelCost]:
    """XLA's own program for `op` under the same model: the same kernel structure with the
    fastest blocks of a candidate set that fit the scoped VMEM (rows 8..2048, K and N blocks
    128..2048); a convolution reads its input in place (no padding or layout pass) -- XLA pads
    and lays out inside its convolution. An optimistic model of XLA, not a measurement."""
    best = None
    if op.name == "conv2d":
        N, C, H, W, K, R, S = op.params["shape"]
        P = op.output.shape[2] if op.params["layout"] == "NCHW" else op.output.shape[1]
        cands = [conv_plan_for(op, th, co, ci, int(m.params["tiling"][0]),
                               source="XLA (model)", passes=False)
                 for th in sorted({t for t in (1, 2, 4, 7, 8, 14, 16, 28, 32, 56, P) if t <= P})
                 for co in sorted({128, 256, 512, _ceil(K, 128)}) if co <= _ceil(K, 128)
                 for ci in sorted({128, 256, 512, C}) if ci <= max(C, 128)]
    else:
        M, Nn, K = op.params["shape"][-3:]
        cands = [gemm_plan_for(op, bm, bk, bn, source="XLA (model)", passes=False)
                 for bm in sorted({8, 16, 32, 64, 128, 256, 512, 1024, 2048, _ceil(M, 8)})
                 if bm <= _ceil(M, 8)
                 for bk in sorted({128, 256, 512, 1024, 2048, _ceil(K, 128)}) if bk <= _ceil(K, 128)
                 for bn in sorted({128, 256, 512, 1024, 2048, _ceil(Nn, 128)})
                 if bn <= _ceil(Nn, 128)]
    for plan in cands:
        if not _fits(plan, m):
            continue
        cost = kernel_cost(plan, m)
        if best is None or cost.seconds < best[1].seconds:
            best = (plan, cost)
    return best


# -- knobs chosen by the model -------------------------------------------------------------------
TILE_KNOBS = {"conv2d": ("h_inner", "w_inner", "co_inner", "ci_inner"),
              "gemm": ("m_inner", "n_inner", "k_inner")}


def choose_knobs(op, m: Machine, schedule_fn, plan_of) -> dict:
    """Every knob of the schedule: the tile knobs' values that minimize `kernel_cost` of the
    kernel they give (exhaustive over those knobs' spaces), the others at their first choice. `plan_of(s)`
    is the plan of a recorded schedule `s` (GEMMs: priced by the public-structure plan with the
    schedule's tiles, so no lowering is needed)."""
    import itertools

    from ...errors import TSLError
    from ...primitives.schedule import Schedule

    probe = Schedule(op, m)
    schedule_fn(probe)
    names = [k for k in TILE_KNOBS["conv2d" if op.name == "conv2d" else "gemm"]
             if k in probe.space]
    best = None
    for values in itertools.product(*[probe.space[k] for k in names]):
        knobs = dict(zip(names, values))
        try:
            s = Schedule(op, m, knobs)
            schedule_fn(s)
            s.validate()
            plan = plan_of(s)
        except TSLError:
            continue
        if not _fits(plan, m):
            continue
        t = kernel_cost(plan, m).seconds
        if best is None or t < best[0]:
            best = (t, dict(s.knob_values))
    return best[1] if best else {}
