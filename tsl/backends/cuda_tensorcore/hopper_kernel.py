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
hopper_layout.py. The TIRx ops used are TVM's own (`T.ptx[...]`, `T.cuda.wgmma.*`,
`T.tensormap_encode_tiled`): TVM 0.27 has no wgmma `tile_primitive.gemm` (its gemm dispatches
are mma.sync and the sm_100 tcgen05), so the kernel is written at that level.
"""

from __future__ import annotations

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
    b_shape = (N, K) if k_major else (K, N)
    b_dims = (K, N) if k_major else (N, K)  # TMA: innermost first
    b_box = (BK, BN) if k_major else (64, BK)
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
    threads = 128 * (WG + 1)

    @T.macro
    def body(A, B, bias, C, A_map, B_map):
        T.device_entry()
        bid = T.cta_id([tiles])
        tx = T.thread_id([threads])
        # one dynamic allocation (TVM allows one): S stages of A, then S stages of B
        smem = T.alloc_buffer((S * (a_stage + b_stage),), dt, scope="shared.dyn", align=1024)
        full = T.alloc_shared((S,), "uint64", align=8)
        empty = T.alloc_shared((S,), "uint64", align=8)
        acc = T.alloc_local((NACC,), "float32")
        desc_a: T.uint64
        desc_b: T.uint64
        m0 = T.meta_var((bid % tiles_m) * BM)
        n0 = T.meta_var((bid // tiles_m) * BN)
        if tx == 0:
            for s in T.serial(S):
                T.ptx.mbarrier.init.shared.b64(T.address_of(full[s]), T.uint32(1))
                T.ptx.mbarrier.init.shared.b64(T.address_of(empty[s]), T.uint32(WG))
            T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()
        if tx < 128:
            T.ptx["setmaxnreg.dec.sync.aligned.u32"](40)
            if tx == 0:
                for t in T.serial(k_tiles):
                    T.cuda.mbarrier_wait(T.address_of(empty[t % S]), ((t // S) % 2) ^ 1)
                    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
                        T.address_of(full[t % S]), T.uint32(tx_bytes))
                    T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"](
                        T.address_of(smem[(t % S) * a_stage]), T.address_of(A_map),
                        t * BK, m0, T.address_of(full[t % S]))
                    for j in T.unroll(len(boxes)):
                        if k_major:
                            T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"](
                                T.address_of(smem[b_base + (t % S) * b_stage]), T.address_of(B_map),
                                t * BK, n0, T.address_of(full[t % S]))
                        else:
                            T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"](
                                T.address_of(smem[b_base + (t % S) * b_stage + j * (BK * 64)]),
                                T.address_of(B_map), n0 + j * 64, t * BK,
                                T.address_of(full[t % S]))
        else:
            T.ptx["setmaxnreg.inc.sync.aligned.u32"](232)
            wg = T.meta_var(tx // 128 - 1)
            for i in T.unroll(NACC):
                acc[i] = T.float32(0)
            for t in T.serial(k_tiles):
                T.cuda.mbarrier_wait(T.address_of(full[t % S]), (t // S) % 2)
                T.ptx.wgmma.fence.sync.aligned()
                for kk in T.unroll(BK // 16):
                    T.cuda.wgmma.encode_matrix_descriptor(
                        T.address_of(desc_a),
                        T.address_of(smem[(t % S) * a_stage + wg * a_wg_off + kk * a_kk_off]),
                        a_lbo, a_sbo, L.SWIZZLE_128B)
                    T.cuda.wgmma.encode_matrix_descriptor(
                        T.address_of(desc_b),
                        T.address_of(smem[b_base + (t % S) * b_stage + kk * b_kk_off]),
                        b_lbo, b_sbo, L.SWIZZLE_128B)
                    T.ptx[mma](*[acc[i] for i in range(NACC)], desc_a, desc_b, True, 1, 1, 0,
                               trans_b)
                T.ptx.wgmma.commit_group.sync.aligned()
                T.ptx.wgmma.wait_group.sync.aligned(1)
                if t > 0 and tx % 128 == 0:
                    T.ptx["mbarrier.arrive.shared::cta.b64"](T.address_of(empty[(t - 1) % S]))
            T.ptx.wgmma.wait_group.sync.aligned(0)
            for i in T.unroll(NACC):
                rc = T.meta_var(L.accumulator(i, tx % 32, (tx % 128) // 32))
                r = T.meta_var(m0 + wg * L.WGMMA_M + rc[0])
                c = T.meta_var(n0 + rc[1])
                if r < M and c < N:
                    if has_bias:
                        acc[i] = acc[i] + bias[c]
                    if has_relu:
                        acc[i] = T.max(acc[i], T.float32(0))
                    C[r, c] = acc[i]

    a_args = (K, M, K * 2, BK, BM, 1, 1)
    b_args = (*b_dims, b_dims[0] * 2, *b_box, 1, 1)

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
