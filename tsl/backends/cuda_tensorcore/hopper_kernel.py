"""The sm_90a GEMM kernel as TVM TIRx (parsed by TVMScript: it must live in a source file).

One CTA computes a BM x BN tile of C with 1 + BM/64 warpgroups:

    warpgroup 0 (producer, setmaxnreg.dec 40): one thread walks k in steps of 64; per step it
        waits until stage s is free (mbarrier empty[s]), arms full[s] with the stage's byte
        count and issues the TMA copies (cp.async.bulk.tensor) of A's and B's tiles into it
    warpgroups 1.. (consumers, setmaxnreg.inc 232): each owns 64 rows; per step it waits for
        full[s], issues 4 wgmma.mma_async m64nBNk16 (A and B from shared memory through matrix
        descriptors), commits them, waits until at most this step's group is in flight and
        releases the previous step's stage (empty[s - 1])
    epilogue: each consumer thread adds the bias, applies relu and stores its accumulators
        (f32) straight from registers to global memory, rows and columns predicated

Layout numbers (TMA boxes, swizzle, descriptors, accumulator fragments) come from
hopper_layout.py. What TVM 0.27 ships is used where it fits: `tvm.backend.cuda.lang`'s
SMEMPool (the one dynamic shared allocation), Pipeline (full = TMA mbarriers armed with
expect_tx, empty = plain mbarriers) and WarpgroupRole (guard + setmaxnreg);
`T.cuda.wgmma.encode_matrix_descriptor`, `T.tensormap_encode_tiled` (host) and `T.ptx[...]`
for wgmma / cp.async.bulk.tensor. Not used, and why: TVM 0.27 has no wgmma gemm tile primitive
(`tile_primitive.gemm` dispatches mma.sync, `gemm_async` only sm_100 tcgen05), so the mainloop
is written at the T.ptx level; `lang.SmemDescriptor` encodes tcgen05 descriptors (another bit
layout), not wgmma's.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm.backend.cuda.lang import Pipeline, SMEMPool, WarpgroupRole
from tvm.script import tirx as T

from . import hopper_layout as L


# The TMA copy of a 2-D box into shared memory, completing on an mbarrier's transaction count.
TMA_LOAD_2D = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"


@dataclass(frozen=True)
class _Numbers:
    """What the kernel of plan `p` is written with: sizes, shared-memory offsets (elements),
    wgmma descriptor fields and offsets, from hopper_layout.py."""

    M: int
    N: int
    K: int
    BM: int
    BN: int
    BK: int
    S: int  # pipeline stages
    WG: int  # consumer warpgroups
    dt: str
    k_major: bool
    NACC: int  # f32 accumulators per thread of m64nBNk16
    tiles_m: int
    tiles: int
    k_tiles: int
    a_stage: int
    b_stage: int
    tx_bytes: int
    b_base: int
    boxes: tuple  # (element offset, n offset) of each TMA box of a B stage
    a_lbo: int
    a_sbo: int
    b_lbo: int
    b_sbo: int
    a_wg_off: int  # elements between warpgroups' rows
    a_kk_off: int
    b_kk_off: int
    mma: str
    trans_b: int


def _numbers(p) -> _Numbers:
    BM, BN, BK, k_major = p.block_m, p.block_n, L.BLOCK_K, p.b_k_major
    ab = {"float16": "f16", "bfloat16": "bf16"}[p.dtype]
    tiles_m = (p.m + BM - 1) // BM
    a_stage, b_stage = BM * BK, BN * BK
    a_desc = [L.a_descriptor(0, 0, kk) for kk in range(BK // L.WGMMA_K)]
    b_desc = [L.b_descriptor(0, kk, k_major) for kk in range(BK // L.WGMMA_K)]
    (a_lbo, a_sbo), (b_lbo, b_sbo) = a_desc[0].encoded(), b_desc[0].encoded()
    return _Numbers(
        M=p.m, N=p.n, K=p.k, BM=BM, BN=BN, BK=BK, S=p.stages, WG=BM // L.WGMMA_M, dt=p.dtype,
        k_major=k_major, NACC=BN // 2, tiles_m=tiles_m, tiles=tiles_m * ((p.n + BN - 1) // BN),
        k_tiles=(p.k + BK - 1) // BK, a_stage=a_stage, b_stage=b_stage,
        tx_bytes=(a_stage + b_stage) * 2, b_base=p.stages * a_stage,
        boxes=tuple((off // 2, n) for off, n in L.b_boxes(BN, k_major)),
        a_lbo=a_lbo, a_sbo=a_sbo, b_lbo=b_lbo, b_sbo=b_sbo,
        a_wg_off=L.a_descriptor(0, 1, 0).start // 2,
        a_kk_off=(a_desc[1].start - a_desc[0].start) // 2,
        b_kk_off=(b_desc[1].start - b_desc[0].start) // 2,
        mma=f"wgmma.mma_async.sync.aligned.m64n{BN}k16.f32.{ab}.{ab}",
        trans_b=0 if k_major else 1)


@T.macro
def _produce(c, smem, pipe, A_map, B_map, m0, n0):
    """The producer's one thread: per k step, wait for a free stage, arm its full barrier
    with the stage's bytes and issue the TMA copies of A's and B's tiles into it."""
    for t in T.serial(c.k_tiles):
        pipe.empty.wait(t % c.S, ((t // c.S) % 2) ^ 1)
        pipe.full.arrive(t % c.S, tx_count=c.tx_bytes)
        T.ptx[TMA_LOAD_2D](
            T.address_of(smem[(t % c.S) * c.a_stage]), T.address_of(A_map),
            t * c.BK, m0, pipe.full.ptr_to([t % c.S]))
        for j in T.unroll(len(c.boxes)):
            if c.k_major:
                T.ptx[TMA_LOAD_2D](
                    T.address_of(smem[c.b_base + (t % c.S) * c.b_stage]), T.address_of(B_map),
                    t * c.BK, n0, pipe.full.ptr_to([t % c.S]))
            else:
                T.ptx[TMA_LOAD_2D](
                    T.address_of(smem[c.b_base + (t % c.S) * c.b_stage + j * (c.BK * 64)]),
                    T.address_of(B_map), n0 + j * 64, t * c.BK,
                    pipe.full.ptr_to([t % c.S]))


@T.macro
def _consume(c, smem, pipe, acc, desc_a, desc_b, wg, tid):
    """A consumer warpgroup's mainloop: per k step, wait for the stage, issue its wgmma on
    descriptors of its rows of A and of B, and release the previous step's stage."""
    for t in T.serial(c.k_tiles):
        pipe.full.wait(t % c.S, (t // c.S) % 2)
        T.ptx.wgmma.fence.sync.aligned()
        for kk in T.unroll(c.BK // 16):
            T.cuda.wgmma.encode_matrix_descriptor(
                T.address_of(desc_a),
                T.address_of(smem[(t % c.S) * c.a_stage + (wg - 1) * c.a_wg_off
                                  + kk * c.a_kk_off]),
                c.a_lbo, c.a_sbo, L.SWIZZLE_128B)
            T.cuda.wgmma.encode_matrix_descriptor(
                T.address_of(desc_b),
                T.address_of(smem[c.b_base + (t % c.S) * c.b_stage + kk * c.b_kk_off]),
                c.b_lbo, c.b_sbo, L.SWIZZLE_128B)
            T.ptx[c.mma](*[acc[i] for i in range(c.NACC)], desc_a, desc_b, True, 1, 1, 0,
                         c.trans_b)
        T.ptx.wgmma.commit_group.sync.aligned()
        T.ptx.wgmma.wait_group.sync.aligned(1)
        if t > 0 and tid == 0:
            pipe.empty.arrive((t - 1) % c.S)
    T.ptx.wgmma.wait_group.sync.aligned(0)


@T.macro
def _store(c, has_bias, has_relu, acc, bias, C, m0, n0, wg, tid):
    """The epilogue: bias, relu and the f32 store of each accumulator, predicated."""
    for i in T.unroll(c.NACC):
        rc = T.meta_var(L.accumulator(i, tid % 32, tid // 32))
        r = T.meta_var(m0 + (wg - 1) * L.WGMMA_M + rc[0])
        col = T.meta_var(n0 + rc[1])
        if r < c.M and col < c.N:
            if has_bias:
                acc[i] = acc[i] + bias[col]
            if has_relu:
                acc[i] = T.max(acc[i], T.float32(0))
            C[r, col] = acc[i]


def kernel_func(p):
    """The PrimFunc of plan `p` (hopper.Plan): host part (tensor maps) + device part."""
    c = _numbers(p)
    smem_bytes = p.shared_bytes  # tiles + full / empty barriers
    has_bias, has_relu = p.bias, p.relu

    @T.macro
    def body(A, B, bias, C, A_map, B_map):
        T.device_entry()
        bid = T.cta_id([c.tiles])
        wg = T.warpgroup_id([c.WG + 1])
        tid = T.thread_id_in_wg([128])
        # the dynamic shared memory: S stages of A, S stages of B, then the pipeline's full /
        # empty mbarriers; its base 1024-byte aligned (the 128-byte swizzle's period)
        dyn = T.alloc_buffer((smem_bytes,), "uint8", scope="shared.dyn", align=1024)
        pool = T.meta_var(SMEMPool(dyn.data))
        smem = pool.alloc((c.S * (c.a_stage + c.b_stage),), c.dt, align=1024)
        pipe = T.meta_var(Pipeline(pool, c.S, full="tma", empty="mbar", init_empty=c.WG))
        acc = T.alloc_local((c.NACC,), "float32")
        desc_a: T.uint64
        desc_b: T.uint64
        m0 = T.meta_var((bid % c.tiles_m) * c.BM)
        n0 = T.meta_var((bid // c.tiles_m) * c.BN)
        T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()
        with WarpgroupRole(wg, 0, regs=40):
            if tid == 0:
                _produce(c, smem, pipe, A_map, B_map, m0, n0)
        # WarpgroupRole(wg, (1, WG + 1), ...) is the consumers' role, but its range guard
        # (`start <= wg and wg < stop`) fails to parse in TVM 0.27: the same guard, spelled out
        if wg > 0:
            T.ptx["setmaxnreg.inc.sync.aligned.u32"](232)
            for i in T.unroll(c.NACC):
                acc[i] = T.float32(0)
            _consume(c, smem, pipe, acc, desc_a, desc_b, wg, tid)
            _store(c, has_bias, has_relu, acc, bias, C, m0, n0, wg, tid)

    return _entry(p, c, body)


def _entry(p, c: _Numbers, body):
    """The PrimFunc around the device part `body`: A, B, (bias,) out, and the tensor maps of
    A and B encoded on the host."""
    M, N, K, dt = c.M, c.N, c.K, c.dt
    b_shape = (N, K) if c.k_major else (K, N)
    a_map, b_map = L.tensor_maps(p)
    a_args = (*a_map["dims"], *a_map["strides_bytes"], *a_map["box"], *a_map["element_strides"])
    b_args = (*b_map["dims"], *b_map["strides_bytes"], *b_map["box"], *b_map["element_strides"])

    if p.bias:
        @T.prim_func
        def main(A: T.Buffer((M, K), dt, align=16), B: T.Buffer(b_shape, dt, align=16),
                 bias: T.Buffer((N,), "float32", align=16),
                 out: T.Buffer((M, N), "float32", align=16)):
            A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
            T.tensormap_encode_tiled(A_map, A.data, *a_args, descriptor_dtype=dt, rank=2,
                                     swizzle=L.SWIZZLE_128B)
            B_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
            T.tensormap_encode_tiled(B_map, B.data, *b_args, descriptor_dtype=dt, rank=2,
                                     swizzle=L.SWIZZLE_128B)
            body(A, B, bias, out, A_map, B_map)
    else:
        @T.prim_func
        def main(A: T.Buffer((M, K), dt, align=16), B: T.Buffer(b_shape, dt, align=16),
                 out: T.Buffer((M, N), "float32", align=16)):
            A_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
            T.tensormap_encode_tiled(A_map, A.data, *a_args, descriptor_dtype=dt, rank=2,
                                     swizzle=L.SWIZZLE_128B)
            B_map: T.let[T.handle("tensormap")] = T.tvm_stack_alloca("tensormap", 1)
            T.tensormap_encode_tiled(B_map, B.data, *b_args, descriptor_dtype=dt, rank=2,
                                     swizzle=L.SWIZZLE_128B)
            body(A, B, None, out, A_map, B_map)
    return main
