"""The TPU's detail for the shared cost model (`tsl.model`): a Mosaic kernel `Plan` as the
`tsl.model.Program` the model prices, and the baselines priced the same way.

`program(plan, machine)` says what the kernel does, walking its grid in the order Pallas runs
it; `tsl.model.evaluate` combines it (overlap, bound, utilization) as for every back end:

- HBM <-> VMEM: one `Transfer` per block: the blocks the pipeline moves (a block whose index
  did not change is kept in VMEM), bytes in bounds of the array (edge blocks and padded
  windows move less); overlapped with compute (Pallas double-buffers every block);
- VMEM <-> MXU: per grid step, the operand tiles read, the f32 accumulator read and written
  (and the im2col tile written, for conv2d) at `vmem_bytes_per_cycle`: a path that overlaps
  the MXU;
- compute: per step, the dot (rows x K x columns) as 128x128 weight tiles; each tile streams
  the rows (padded to the row group, 8) through one MXU at `rows / (MACs per cycle / 16384 /
  MXUs)` cycles, never faster than the weight push (`mxu_weight_push_cycles`); tiles dealt to
  the MXUs; plus `mxu_fill_cycles` once per dot (fill and drain of the systolic array); the
  VPU epilogue on the steps that write the output and the masking of padded input windows;
- in series: `grid_step_cycles` per step (DMA issue and waits, semaphores, scalar work), the
  pipeline's bubbles (steps whose DMA outlasts their compute, from the per-step walk), and the
  XLA passes around the kernel (padding, layout changes, crop) at HBM bandwidth.

Parallel grid axes are dealt to the TensorCores (the busiest core sets the time; HBM bandwidth
is shared). Every constant is a `[params]` entry of the machine file, with its source there.
tsl's kernel, the public-style Pallas kernel and the XLA model are priced by this one path, so
their ratios compare like with like; `register_program` makes it the price of every TPU
schedule, for the knob choice (`tsl.model.choose`) as for the artifact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...errors import ScheduleError
from ...model import Estimate, Program, Transfer, TransferKind, evaluate, register_program
from ...tam.machine import Machine, dtype_bytes
from .plan import Axis, Block, Plan, conv_plan_for, gemm_passes, schedule_plan


MAX_STEPS = 1 << 20  # grid steps the model walks one by one (a kernel of more: larger tiles)


def check_steps(plan: Plan, op) -> None:
    if plan.steps > MAX_STEPS:
        raise ScheduleError(f"the Mosaic kernel of {op} has {plan.steps:,} grid steps, more "
                            f"than the {MAX_STEPS:,} the TPU model walks; use larger tiles")


def _p(m: Machine, key: str) -> float:
    return float(getattr(m.params, key))


@dataclass(frozen=True)
class _Step:
    """One grid step's dot on the MXUs: `rows` padded to the row group, `tiles` 128x128
    weight tiles, `mxu_cycles` on the MXUs, `vmem_bytes` between VMEM and the MXUs."""

    prim: object
    n_mxu: int
    group: int
    rows: int
    tiles: int
    mxu_cycles: float
    vmem_bytes: float


def _step(plan: Plan, m: Machine) -> _Step:
    prim = m.primitive(plan.inputs[0].dtype) or m.primitives[0]
    n_mxu = int(m.params.mxu_count)
    rows_per_cycle = prim.macs_per_cycle / (n_mxu * prim.n * prim.k)  # per MXU
    group = int(m.params.tiling[0])
    rows, kk, cols = plan.dot
    rows8 = -(-rows // group) * group
    tiles = -(-kk // prim.k) * -(-cols // prim.n)
    per_tile = max(rows8 / rows_per_cycle, _p(m, "mxu_weight_push_cycles"))
    mxu_cyc = math.ceil(tiles * per_tile / n_mxu) + _p(m, "mxu_fill_cycles")
    in_size = dtype_bytes(plan.inputs[0].dtype)
    acc_size = dtype_bytes(plan.acc_dtype)
    vmem_step = (rows8 * kk + kk * cols) * in_size + 2 * rows8 * cols * acc_size
    if plan.kind == "conv":
        vmem_step += rows8 * kk * in_size  # the im2col tile is written, then read by the MXU
    return _Step(prim, n_mxu, group, rows8, tiles, mxu_cyc, vmem_step)


def program(plan: Plan, m: Machine) -> Program:
    """The kernel `plan` on machine `m` as the shared model's `Program` (module docstring)."""
    check_steps(plan, f"{plan.kind} ({plan.source})")
    st = _step(plan, m)
    vmem_bw = _p(m, "vmem_bytes_per_cycle")
    # Cores: the parallel axes' blocks are dealt out; HBM bandwidth is shared.
    par = math.prod(a.extent for a in plan.grid if a.semantics == "parallel")
    cores = min(m.cores(), par) if par > 1 else 1
    share = math.ceil(par / cores) / par if par > 1 else 1.0
    hbm, vmem = m.levels("global", "A")[0], m.levels("scratchpad", "A")[0].name
    hbm_bw = _p(m, "hbm_bytes_per_s") / m.clock_hz  # bytes per cycle
    S = plan.steps
    transfers, load, store_at = _hbm_transfers(plan, hbm.name, vmem, hbm_bw, cores)
    transfers.append(Transfer(kind=TransferKind.TILE,
                              what="VMEM <-> MXU operand and accumulator tiles", level=vmem,
                              parent=vmem, fills=S, bytes=math.ceil(st.vmem_bytes),
                              bandwidth=vmem_bw, units=cores, hidden=1.0))
    comp = _compute(plan, m, st, store_at > 0)
    # The per-step walk: step t's compute overlaps the loads of step t+1 and the store of step
    # t-1; what a step's DMA takes beyond its compute is a bubble the totals do not show.
    dma = np.zeros(S)
    dma[:-1] += load[1:]
    dma[1:] += store_at[:-1]
    step = np.maximum(comp, st.vmem_bytes / vmem_bw)
    dma_c = dma / (hbm_bw / cores)
    bubbles = max(0.0, float(np.maximum(step, dma_c).sum())
                  - max(float(step.sum()), float(dma_c.sum())))
    overhead = S * _p(m, "grid_step_cycles")
    for p in plan.passes:
        if p.read + p.written:
            transfers.append(Transfer(kind=TransferKind.PASS, what=f"XLA pass: {p.what}",
                                      level=hbm.name, parent=hbm.name, fills=1,
                                      bytes=p.read + p.written, bandwidth=hbm_bw,
                                      shared_bandwidth=hbm_bw, hidden=0.0))
    macs = S * st.tiles * st.rows * st.prim.k * st.prim.n
    notes = _notes(plan, m, st, cores, bubbles * share, vmem_bw, store_at)
    return Program(tuple(transfers), float(comp.sum()) * share, macs,
                   serial_cycles=(overhead + bubbles) * share, notes=notes,
                   detail={"emitter": "mosaic", "steps": S,
                           "overhead_s": overhead * share / m.clock_hz,
                           "bubbles_s": bubbles * share / m.clock_hz,
                           "mxu_s": S * share * st.mxu_cycles / m.clock_hz,
                           "mxu_passes": S * st.tiles * -(-st.rows // st.prim.m),
                           "vmem_bytes": plan.vmem_bytes()[0],
                           "vmem_budget": int(m.params.vmem_scoped_bytes)})


def _hbm_transfers(plan: Plan, hbm: str, vmem: str, hbm_bw: float, cores: int):
    """The blocks moved between HBM and VMEM: (transfers, bytes loaded per step, bytes
    written back per step)."""
    transfers, load = [], np.zeros(plan.steps)
    for b in plan.inputs:
        moved = plan.moved_bytes(b)
        load += moved
        transfers.append(_transfer(TransferKind.TILE, f"{b.name} block {_shape(b)}", vmem,
                                   hbm, moved, hbm_bw, cores))
    # An output block is written back when the next step moves to another block (and after
    # the last step).
    held = np.ceil(plan.out.in_bounds(plan.block_indices(plan.out))
                   * dtype_bytes(plan.out.dtype))
    leaves = np.ones(plan.steps, dtype=bool)
    leaves[:-1] = plan.fetches(plan.out)[1:]
    store_at = np.where(leaves, held, 0.0)
    # Paths are named by the level whose bandwidth they use: the write-back is HBM's, the
    # operand and accumulator tiles between VMEM and the MXUs VMEM's own.
    transfers.append(_transfer(TransferKind.WRITE_BACK,
                               f"C write-back of {_shape(plan.out)} blocks", hbm,
                               hbm, store_at, hbm_bw, cores))
    return transfers, load, store_at


def _compute(plan: Plan, m: Machine, st: _Step, epi: np.ndarray) -> np.ndarray:
    """Cycles of each grid step's compute: the dot, the masking of padded input windows, and
    the VPU epilogue on the steps that write the output (`epi`)."""
    vpu = m.vectors[0].ops_per_cycle if m.vectors else 1024.0
    steps = plan.epilogue.steps if plan.epilogue is not None else ()
    vpu_step = st.rows * plan.dot[2] * max(1, len(steps)) / vpu
    mask_step = 0.0
    if plan.conv.get("masked"):
        # The padded rows and columns of each input window are zeroed on the VPU.
        cv = plan.conv
        mask_step = cv["hin"] * cv["win"] * cv["ci"] / vpu
    return np.full(plan.steps, float(st.mxu_cycles) + mask_step) + epi * vpu_step


def _notes(plan: Plan, m: Machine, st: _Step, cores: int, bubbles: float, vmem_bw: float,
           store_at: np.ndarray) -> tuple[str, ...]:
    rows, kk, cols = plan.dot
    notes = [f"grid {tuple(a.extent for a in plan.grid)} = {plan.steps:,} steps "
             f"({', '.join(a.semantics for a in plan.grid)}), {cores} core(s); {plan.source}",
             f"per step: dot {rows}x{kk}x{cols} ({st.rows} rows padded to {st.group}): "
             f"{st.tiles} weight tiles on {st.n_mxu} MXUs = {st.mxu_cycles:,.0f} cycles; VMEM "
             f"{st.vmem_bytes:,} B = {st.vmem_bytes / vmem_bw:,.0f} cycles; overhead "
             f"{_p(m, 'grid_step_cycles'):,.0f} cycles; pipeline bubbles "
             f"{bubbles:,.0f} cycles"]
    for b in plan.inputs + (plan.out,):
        n = int(plan.fetches(b).sum())
        mb = (store_at.sum() if b is plan.out else plan.moved_bytes(b).sum()) / 1e6
        notes.append(f"{b.name}: block {_shape(b)} of {b.shape} {b.dtype}, moved {n:,} times "
                     f"({mb:.2f} MB)")
    return tuple(notes)


def _shape(b: Block) -> tuple:
    return tuple(x for x in b.block if x is not None)


def _transfer(kind: TransferKind, what: str, level, parent, moved: np.ndarray, bw: float,
              cores: int) -> Transfer:
    fills = int(np.count_nonzero(moved))
    per = math.ceil(moved.sum() / fills) if fills else 0
    return Transfer(kind=kind, what=what, level=level, parent=parent, fills=fills, bytes=per,
                    bandwidth=bw / cores,
                    shared_bandwidth=bw, units=cores, hidden=1.0)


def price(s, plan: Plan) -> Estimate:
    """The shared model's estimate of kernel `plan` for schedule `s`'s operator and machine,
    with the MXU's utilization (its busy time over the whole, passes included) as detail."""
    est = evaluate(s, program=program(plan, s.machine))
    return est.with_(detail={"mxu_utilization": est.mxu_s / est.seconds})


def _schedule_program(s) -> Program:
    return program(schedule_plan(s, int(s.machine.params.tiling[0])), s.machine)


register_program("tpu", _schedule_program)


# -- the baselines: the same kernel structure, blocks picked another way -----------------------
def _ceil(x: int, q: int) -> int:
    return -(-x // q) * q


def gemm_plan_for(op, bm: int, bk: int, bn: int, source: str, passes: bool = True) -> Plan:
    """The Pallas GEMM kernel of the public examples (grid (batch, M/bm, N/bn, K/bk), A and B
    blocks, f32 accumulator, "parallel, parallel, arbitrary") for `op` with the given blocks
    (clipped to the operator; the operator padded to whole blocks, the padding passes priced
    when `passes`)."""
    from ...ops import batch_matmul, dense, matmul

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
    kept = ()
    if passes:
        kw = dict(dtype=op.dtype, acc_dtype=op.acc_dtype, epilogue=op.epilogue)
        if op.name == "batch_matmul":
            big = batch_matmul(b, Mp, Np, Kp, transpose_b=tb, **kw)
        elif op.name == "dense":
            big = dense(Mp, Np, Kp, **kw)
        else:
            big = matmul(Mp, Np, Kp, transpose_b=tb, **kw)
        kept = tuple(gemm_passes(op, big))
    dims = (((1,), (1,)) if tb else ((1,), (0,)), ((), ()))
    return Plan("gemm", grid, tuple(ins), out, (bm, bn), op.acc_dtype, (bm, bk, bn), dims,
                op.epilogue, op.out_dtype, kept, source=source)


PUBLIC_BLOCKS = (512, 1024, 1024)  # bm, bk, bn of the Pallas TPU matmul guide's fast kernel


def public_pallas(s) -> tuple[Plan, Estimate]:
    """The Pallas TPU matmul guide's kernel (bm=512, bk=1024, bn=1024, clipped to the
    operator) for schedule `s`'s operator, under the same model. For conv2d: the same guide's
    blocks applied to the im2col GEMM (512 rows of output pixels, 1024 channels)."""
    op, m = s.op, s.machine
    if op.name == "conv2d":
        P, Q = (op.output.shape[2], op.output.shape[3]) if op.params["layout"] == "NCHW" \
            else (op.output.shape[1], op.output.shape[2])
        plan = conv_plan_for(op, min(P, max(1, 512 // Q)), 1024, 1024 // 9 // 128 * 128 or 128,
                             int(m.params.tiling[0]), source="public Pallas blocks")
    else:
        plan = gemm_plan_for(op, *PUBLIC_BLOCKS, source="public Pallas blocks")
    return plan, price(s, plan)


def fits(plan: Plan, m: Machine) -> bool:
    return plan.vmem_bytes()[0] <= int(m.params.vmem_scoped_bytes)


def xla_model(s) -> tuple[Plan, Estimate]:
    """XLA's own program for schedule `s`'s operator under the same model: the same kernel
    structure with the fastest blocks of a candidate set that fit the scoped VMEM (rows
    8..2048, K and N blocks 128..2048); a convolution reads and writes its arrays in place
    (as tsl's NHWC kernel does), and an NCHW one is priced without the layout passes tsl's
    kernel pays -- XLA lays out inside its convolution. An optimistic model of XLA, not a
    measurement."""
    op, m = s.op, s.machine
    group = int(m.params.tiling[0])
    if op.name == "conv2d":
        N, C, H, W, K, R, S = op.params["shape"]
        P = op.output.shape[2] if op.params["layout"] == "NCHW" else op.output.shape[1]
        cands = []
        for th in sorted({t for t in (1, 2, 4, 7, 8, 14, 16, 28, 32, 56, P) if t <= P}):
            for co in sorted({128, 256, 512, K}):
                for ci in sorted({128, 256, 512, C}):
                    if co <= max(K, 128) and ci <= max(C, 128):
                        plan = conv_plan_for(op, th, co, ci, group, source="XLA (model)")
                        cands.append(_no_passes(plan))
    else:
        M, Nn, K = op.params["shape"][-3:]
        cands = [gemm_plan_for(op, bm, bk, bn, source="XLA (model)", passes=False)
                 for bm in sorted({8, 16, 32, 64, 128, 256, 512, 1024, 2048, _ceil(M, 8)})
                 if bm <= _ceil(M, 8)
                 for bk in sorted({128, 256, 512, 1024, 2048, _ceil(K, 128)}) if bk <= _ceil(K, 128)
                 for bn in sorted({128, 256, 512, 1024, 2048, _ceil(Nn, 128)})
                 if bn <= _ceil(Nn, 128)]
    best = None
    for plan in cands:
        if not fits(plan, m):
            continue
        est = price(s, plan)
        if best is None or est.seconds < best[1].seconds:
            best = (plan, est)
    return best


def _no_passes(plan: Plan) -> Plan:
    from dataclasses import replace

    return replace(plan, passes=())

