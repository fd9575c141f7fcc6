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

from tvm.backend.cuda.lang import Pipeline, SMEMPool, WarpgroupRole
from tvm.script import tirx as T

from . import hopper_layout as L


def kernel_func(p):
    """The PrimFunc of plan `p` (hopper.Plan): host part (tensor maps) + device part."""
    M, N, K = p.m, p.n, p.k
    BM, BN, BK, S = p.block_m, p.block_n, L.BLOCK_K, p.stages
    WG = BM // L.WGMMA_M  # consumer warpgroups
    dt, ab = p.dtype, {"float16": "f16", "bfloat16": "bf16"}[p.dtype]
    k_major = p.b_k_major
    NACC = BN // 2  # f32 accumulators per thread of m64nBNk16
    tiles_m = (M + BM - 1) // BM
    tiles = tiles_m * ((N + BN - 1) // BN)
    k_tiles = (K + BK - 1) // BK
    a_stage, b_stage = BM * BK, BN * BK  # elements
    tx_bytes = (a_stage + b_stage) * 2
    b_base = S * a_stage
    smem_bytes = p.shared_bytes  # tiles + full / empty barriers
    b_shape = (N, K) if k_major else (K, N)
    boxes = [(off // 2, n) for off, n in L.b_boxes(BN, k_major)]  # (element offset, n offset)
    a_desc = [L.a_descriptor(0, 0, kk) for kk in range(BK // L.WGMMA_K)]
    b_desc = [L.b_descriptor(0, kk, k_major) for kk in range(BK // L.WGMMA_K)]
    a_lbo, a_sbo = a_desc[0].encoded()
    b_lbo, b_sbo = b_desc[0].encoded()
    a_wg_off = L.a_descriptor(0, 1, 0).start // 2  # elements between warpgroups' rows
    a_kk_off = (a_desc[1].start - a_desc[0].start) // 2
    b_kk_off = (b_desc[1].start - b_desc[0].start) // 2
    mma = f"wgmma.mma_async.sync.aligned.m64n{BN}k16.f32.{ab}.{ab}"
    trans_b = 0 if k_major else 1
    has_bias, has_relu = p.bias, p.relu

    @T.macro
    def body(A, B, bias, C, A_map, B_map):
        T.device_entry()
        bid = T.cta_id([tiles])
        wg = T.warpgroup_id([WG + 1])
        tid = T.thread_id_in_wg([128])
        # the dynamic shared memory: S stages of A, S stages of B, then the pipeline's full /
        # empty mbarriers; its base 1024-byte aligned (the 128-byte swizzle's period)
        dyn = T.alloc_buffer((smem_bytes,), "uint8", scope="shared.dyn", align=1024)
        pool = T.meta_var(SMEMPool(dyn.data))
        smem = pool.alloc((S * (a_stage + b_stage),), dt, align=1024)
        pipe = T.meta_var(Pipeline(pool, S, full="tma", empty="mbar", init_empty=WG))
        acc = T.alloc_local((NACC,), "float32")
        desc_a: T.uint64
        desc_b: T.uint64
        m0 = T.meta_var((bid % tiles_m) * BM)
        n0 = T.meta_var((bid // tiles_m) * BN)
        T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()
        with WarpgroupRole(wg, 0, regs=40):
            if tid == 0:
                for t in T.serial(k_tiles):
                    pipe.empty.wait(t % S, ((t // S) % 2) ^ 1)
                    pipe.full.arrive(t % S, tx_count=tx_bytes)
                    T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"](
                        T.address_of(smem[(t % S) * a_stage]), T.address_of(A_map),
                        t * BK, m0, pipe.full.ptr_to([t % S]))
                    for j in T.unroll(len(boxes)):
                        if k_major:
                            T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"](
                                T.address_of(smem[b_base + (t % S) * b_stage]), T.address_of(B_map),
                                t * BK, n0, pipe.full.ptr_to([t % S]))
                        else:
                            T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"](
                                T.address_of(smem[b_base + (t % S) * b_stage + j * (BK * 64)]),
                                T.address_of(B_map), n0 + j * 64, t * BK,
                                pipe.full.ptr_to([t % S]))
        # WarpgroupRole(wg, (1, WG + 1), ...) is the consumers' role, but its range guard
        # (`start <= wg and wg < stop`) fails to parse in TVM 0.27: the same guard, spelled out
        if wg > 0:
            T.ptx["setmaxnreg.inc.sync.aligned.u32"](232)
            for i in T.unroll(NACC):
                acc[i] = T.float32(0)
            for t in T.serial(k_tiles):
                pipe.full.wait(t % S, (t // S) % 2)
                T.ptx.wgmma.fence.sync.aligned()
                for kk in T.unroll(BK // 16):
                    T.cuda.wgmma.encode_matrix_descriptor(
                        T.address_of(desc_a),
                        T.address_of(smem[(t % S) * a_stage + (wg - 1) * a_wg_off + kk * a_kk_off]),
                        a_lbo, a_sbo, L.SWIZZLE_128B)
                    T.cuda.wgmma.encode_matrix_descriptor(
                        T.address_of(desc_b),
                        T.address_of(smem[b_base + (t % S) * b_stage + kk * b_kk_off]),
                        b_lbo, b_sbo, L.SWIZZLE_128B)
                    T.ptx[mma](*[acc[i] for i in range(NACC)], desc_a, desc_b, True, 1, 1, 0,
                               trans_b)
                T.ptx.wgmma.commit_group.sync.aligned()
                T.ptx.wgmma.wait_group.sync.aligned(1)
                if t > 0 and tid == 0:
                    pipe.empty.arrive((t - 1) % S)
            T.ptx.wgmma.wait_group.sync.aligned(0)
            for i in T.unroll(NACC):
                rc = T.meta_var(L.accumulator(i, tid % 32, tid // 32))
                r = T.meta_var(m0 + (wg - 1) * L.WGMMA_M + rc[0])
                c = T.meta_var(n0 + rc[1])
                if r < M and c < N:
                    if has_bias:
                        acc[i] = acc[i] + bias[c]
                    if has_relu:
                        acc[i] = T.max(acc[i], T.float32(0))
                    C[r, c] = acc[i]

    a_map, b_map = L.tensor_maps(p)
    a_args = (*a_map["dims"], *a_map["strides_bytes"], *a_map["box"], *a_map["element_strides"])
    b_args = (*b_map["dims"], *b_map["strides_bytes"], *b_map["box"], *b_map["element_strides"])

    if has_bias:
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
