"""WMMA tensor intrinsics (m16n16k16), registered with s_tir on first use.

They are TVM's WMMA intrinsics: the same descriptions and the same builtins
(`tvm_load_matrix_sync`, `tvm_mma_sync`, `tvm_fill_fragment`, `tvm_store_matrix_sync`), which
TVM's CUDA code generator turns into `nvcuda::wmma` calls. They are generated here, per dtype
and scope, rather than imported from `tvm.s_tir.tensor_intrin.cuda`: that import registers
every back end's ~100 intrinsics (40 s on two cores) and has no bfloat16 variants.
"""

from __future__ import annotations

from functools import cache

M = N = K = 16


def _frag_index(buf, stride, rows, cols):
    """Which fragment of a fragment array a 16x16 region is (TVM's formula)."""
    return buf.elem_offset // stride // rows * (stride // cols) + buf.elem_offset % stride // cols


def _copy_desc(dtype: str, src: str, dst: str):
    """The description of a 16x16 tile copied from storage scope `src` to `dst`: what a
    fragment load or store does, element by element."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (16, 16), dtype, align=64, offset_factor=16, scope=src)
        C = T.match_buffer(c, (16, 16), dtype, align=64, offset_factor=16, scope=dst)
        with T.sblock("root"):
            T.reads(A[0:16, 0:16])
            T.writes(C[0:16, 0:16])
            for i, j in T.grid(16, 16):
                with T.sblock("copy"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    C[vi, vj] = A[vi, vj]

    return desc


def _load(dtype: str, scope: str, operand: str, col_major: bool):
    from tvm.script import tirx as T

    frag = f"wmma.matrix_{operand.lower()}"
    layout = "col_major" if col_major else "row_major"
    desc = _copy_desc(dtype, scope, frag)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, c: T.handle) -> None:
        s1 = T.int32()
        s0 = T.int32()
        d1 = T.int32()
        d0 = T.int32()
        A = T.match_buffer(a, (16, 16), dtype, align=64, offset_factor=16, scope=scope,
                           strides=[s1, s0])
        C = T.match_buffer(c, (16, 16), dtype, align=64, offset_factor=16, scope=frag,
                           strides=[d1, d0])
        with T.sblock("root"):
            T.reads(A[0:16, 0:16])
            T.writes(C[0:16, 0:16])
            T.evaluate(T.tvm_load_matrix_sync(C.data, M, N, K, _frag_index(C, d1, 16, 16),
                                              A.access_ptr("r", ptr_type=dtype), s1, layout,
                                              dtype="void"))

    return desc, impl


def _fill(dtype: str):
    from tvm.script import tirx as T
    from tvm.tirx import IntImm

    zero = IntImm("int32", 0).astype(dtype)

    @T.prim_func(s_tir=True)
    def desc(c: T.handle) -> None:
        C = T.match_buffer(c, (16, 16), dtype, align=64, offset_factor=16,
                           scope="wmma.accumulator")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:16, 0:16])
            for i, j in T.grid(16, 16):
                with T.sblock("init"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    C[vi, vj] = zero

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        d1 = T.int32()
        d0 = T.int32()
        C = T.match_buffer(c, (16, 16), dtype, align=64, offset_factor=16,
                           scope="wmma.accumulator", strides=[d1, d0])
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:16, 0:16])
            T.evaluate(T.tvm_fill_fragment(C.data, M, N, K, _frag_index(C, d1, 16, 16),
                                           T.float32(0), dtype="void"))

    return desc, impl


def _store(dtype: str, scope: str):
    from tvm.script import tirx as T

    desc = _copy_desc(dtype, "wmma.accumulator", scope)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, c: T.handle) -> None:
        s1 = T.int32()
        s0 = T.int32()
        d1 = T.int32()
        d0 = T.int32()
        A = T.match_buffer(a, (16, 16), dtype, align=64, offset_factor=16,
                           scope="wmma.accumulator", strides=[d1, d0])
        C = T.match_buffer(c, (16, 16), dtype, align=64, offset_factor=16, scope=scope,
                           strides=[s1, s0])
        with T.sblock("root"):
            T.reads(A[0:16, 0:16])
            T.writes(C[0:16, 0:16])
            T.evaluate(T.tvm_store_matrix_sync(A.data, M, N, K, _frag_index(A, d1, 16, 16),
                                               C.access_ptr("w", ptr_type=dtype), s1,
                                               "row_major", dtype="void"))

    return desc, impl


def _sync(in_dtype: str, acc_dtype: str, b_trans: bool, k: int = K):
    """C[16, 16] += A[16, k] B[k, 16] (B[16, k] when `b_trans`) as k / 16 wmma.mma_sync: WMMA
    is 16 deep for every type, a 32-deep primitive (int8 on sm_80) is two of it, on the
    fragments side by side along k."""
    from tvm.script import tirx as T

    a_shape, b_shape = (16, k), ((16, k) if b_trans else (k, 16))

    def b_at(B, kk, j):
        return B[j, kk] if b_trans else B[kk, j]

    def b_next(stride):  # fragments from one 16-deep half of B to the next
        return 1 if b_trans else stride // 16

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, a_shape, in_dtype, align=64, offset_factor=16,
                           scope="wmma.matrix_a")
        B = T.match_buffer(b, b_shape, in_dtype, align=64, offset_factor=16,
                           scope="wmma.matrix_b")
        C = T.match_buffer(c, (16, 16), acc_dtype, align=64, offset_factor=16,
                           scope="wmma.accumulator")
        with T.sblock("root"):
            T.reads(C[0:16, 0:16], A[0:a_shape[0], 0:a_shape[1]], B[0:b_shape[0], 0:b_shape[1]])
            T.writes(C[0:16, 0:16])
            for i, j, kk in T.grid(16, 16, k):
                with T.sblock(""):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, kk])
                    C[vi, vj] = C[vi, vj] + T.Cast(acc_dtype, A[vi, vk]) * T.Cast(
                        acc_dtype, b_at(B, vk, vj))

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        a1 = T.int32()
        a0 = T.int32()
        b1 = T.int32()
        b0 = T.int32()
        c1 = T.int32()
        c0 = T.int32()
        A = T.match_buffer(a, a_shape, in_dtype, align=64, offset_factor=16,
                           scope="wmma.matrix_a", strides=[a1, a0])
        B = T.match_buffer(b, b_shape, in_dtype, align=64, offset_factor=16,
                           scope="wmma.matrix_b", strides=[b1, b0])
        C = T.match_buffer(c, (16, 16), acc_dtype, align=64, offset_factor=16,
                           scope="wmma.accumulator", strides=[c1, c0])
        with T.sblock("root"):
            T.reads(C[0:16, 0:16], A[0:a_shape[0], 0:a_shape[1]], B[0:b_shape[0], 0:b_shape[1]])
            T.writes(C[0:16, 0:16])
            for h in T.unroll(k // K):
                T.evaluate(T.tvm_mma_sync(
                    C.data, _frag_index(C, c1, 16, 16),
                    A.data, _frag_index(A, a1, 16, 16) + h,
                    B.data, _frag_index(B, b1, 16, 16) + h * b_next(b1),
                    C.data, _frag_index(C, c1, 16, 16), dtype="void"))

    return desc, impl


# -- ldmatrix + mma.sync (sm_80) ------------------------------------------------------------
# The per-lane layouts of mma.sync's fragments (PTX ISA 8.x, "Matrix fragments for
# mma.m16n8k16" / "mma.m16n8k32"), as (lane, element) of a (32, 8) or (32, 16) register array
# per 16x16 (16-bit) or 16x32 (8-bit) tile. A and C are TVM's formulas
# (tvm.s_tir.tensor_intrin.cuda.shared_16x16_to_ldmatrix_32x8_layout and its 16x32 variant).
# B is held as [n, k], n 0-7 in the first half of the registers (the first mma.m16n8), n 8-15
# in the second: the registers as ldmatrix really fills them. TVM's own B description differs
# from that by a transpose inside each 8x8 block, which its descriptions agree on but the
# hardware does not; here every description is the physical layout, so an emulator that
# follows the PTX ISA computes exactly what the GPU does. They are written here, not imported:
# importing that module registers all of TVM's CUDA intrinsics (minutes on two cores), and
# its ldmatrix / mma makers assert float16 (no bf16).
def lane_a(i, k, kdim: int = 16):
    """(lane, element) of A's (or C's) element (row i, column k)."""
    v = kdim // 8  # elements per lane in one 8-row x (4 * v)-column block
    return 4 * (i % 8) + (k % (4 * v)) // v, 2 * v * (k // (4 * v)) + v * (i // 8) + k % v


def lane_b(n, k, kdim: int = 16):
    """(lane, element) of B's element (column n, row k)."""
    v = kdim // 8
    return 4 * (n % 8) + (k % (4 * v)) // v, 2 * v * (n // 8) + v * (k // (4 * v)) + k % v


_PTX_TYPE = {"float16": "fp16", "bfloat16": "bf16", "int8": "int8", "float32": "fp32",
             "int32": "int32"}


def mma_k(dtype: str) -> int:
    """The k of mma.sync for operands of `dtype`: m16n8k16 for 16-bit, m16n8k32 for int8."""
    return 32 if dtype in ("int8", "uint8") else 16


def _to_warp_desc(dtype: str, scope: str, rows: int, cols: int, local: int, where):
    """What a shared -> warp-register load computes: element (r, c) of a rows x cols shared
    tile lands in lane and register `where(r, c)`. One description for every way the
    registers are filled (ldmatrix, plain per-lane loads)."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(warp_handle: T.handle, shared_handle: T.handle) -> None:
        shared = T.match_buffer(shared_handle, (rows, cols), dtype, align=64,
                                offset_factor=cols, scope=scope)
        warp = T.match_buffer(warp_handle, (32, local), dtype, align=64, offset_factor=cols,
                              scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:rows, 0:cols])
            T.writes(warp[0:32, 0:local])
            for ax0, ax1 in T.grid(rows, cols):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    T.reads(shared[v0, v1])
                    t, r = T.meta_var(where(v0, v1))
                    T.writes(warp[t, r])
                    warp[t, r] = shared[v0, v1]

    return desc


def _ldmatrix(dtype: str, scope: str, operand: str, trans: bool):
    """A's 16 x k tile (B's k x 16, or 16 x k when `trans`: B given as [N, K]) from shared
    memory into the warp's registers with one ldmatrix.x4. Lanes 8q .. 8q + 7 give the row
    addresses of 8x8 (16-bit) matrix q, which fills register q of every lane. B as [K, N] is
    loaded with ldmatrix.trans, which transposes each 8x8 matrix on the way (16-bit only)."""
    from tvm.runtime import convert
    from tvm.script import tirx as T

    k = mma_k(dtype)
    local = 16 * k // 32
    vec = k // 2  # elements in 16 bytes: one row of an 8x8 16-bit matrix
    if operand == "A":
        rows, cols, ld_trans = 16, k, False

        def where(r, c):
            return lane_a(r, c, k)

        def offset(tx, stride):  # matrices: rows 0-7 / 8-15 of k block 0, then k block 1
            return stride * (tx % 16) + vec * (tx // 16)
    elif trans:
        rows, cols, ld_trans = 16, k, False

        def where(r, c):
            return lane_b(r, c, k)

        def offset(tx, stride):  # matrices: k blocks 0 / 1 of n 0-7, then of n 8-15
            return stride * (8 * (tx // 16) + tx % 8) + vec * (tx % 16 // 8)
    else:
        if k != 16:
            raise ValueError("ldmatrix.trans moves 16-bit elements: int8 B must be [N, K]")
        rows, cols, ld_trans = k, 16, True

        def where(r, c):
            return lane_b(c, r, k)

        def offset(tx, stride):  # matrices (transposed): k 0-7 / 8-15 of n 0-7, then n 8-15
            return stride * (tx % 16) + 8 * (tx // 16)

    desc = _to_warp_desc(dtype, scope, rows, cols, local, where)

    @T.prim_func(s_tir=True)
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(shared_handle, (rows, cols), dtype, align=64,
                                offset_factor=cols, scope=scope, strides=[s0, s1])
        warp = T.match_buffer(warp_handle, (32, local), dtype, align=64, offset_factor=cols,
                              scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:rows, 0:cols])
            T.writes(warp[0:32, 0:local])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                T.evaluate(T.ptx_legacy.ldmatrix(
                    ld_trans, 4, ".b16", warp.data, warp.elem_offset + convert(local) * tx,
                    shared.access_ptr("r"), offset(tx, s0), dtype=dtype))

    return desc, impl


def _lds_b(dtype: str, scope: str):
    """B's k x 16 tile given as [K, N], for an 8-bit mma.sync (ldmatrix has no transposing
    form for 8-bit elements): each lane gathers its own registers, four bytes of one column
    (k, k + 1, k + 2, k + 3) per register, with plain shared-memory loads packed into one
    32-bit store (`tsl_lds4`, codegen.py: stored byte by byte, the registers would live in
    local memory). Register r of lane t holds lane_b's elements 4r .. 4r + 3 of it."""
    from tvm.runtime import convert
    from tvm.script import tirx as T

    k = mma_k(dtype)
    local = 16 * k // 32
    v = k // 8

    def column(tx, e):  # the inverse of lane_b
        return 8 * (e // (2 * v)) + tx // 4

    def row(tx, e):
        return 4 * v * (e % (2 * v) // v) + v * (tx % 4) + e % v

    desc = _to_warp_desc(dtype, scope, k, 16, local, lambda r, c: lane_b(c, r, k))

    @T.prim_func(s_tir=True)
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(shared_handle, (k, 16), dtype, align=64, offset_factor=16,
                                scope=scope, strides=[s0, s1])
        warp = T.match_buffer(warp_handle, (32, local), dtype, align=64, offset_factor=16,
                              scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:k, 0:16])
            T.writes(warp[0:32, 0:local])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                for r in T.unroll(local // 4):
                    T.evaluate(T.call_extern(
                        "void", "tsl_lds4", warp.data,
                        warp.elem_offset + convert(local) * tx + 4 * r,
                        shared.access_ptr("r", offset=row(tx, 4 * r) * s0
                                          + column(tx, 4 * r) * s1), s0))

    return desc, impl


def _mma(in_dtype: str, acc_dtype: str):
    """C[16, 16] += A[16, k] B[k, 16] as two mma.sync.m16n8k{k} (n 0-7, then n 8-15), every
    operand in the warp's registers with the per-lane layouts above."""
    from tvm.runtime import convert
    from tvm.script import tirx as T
    from tvm.tirx import Cast

    k = mma_k(in_dtype)
    local = 16 * k // 32
    ab, cd = _PTX_TYPE[in_dtype], _PTX_TYPE[acc_dtype]
    shape = f"m16n8k{k}"

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (32, local), in_dtype, align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (32, local), in_dtype, align=64, offset_factor=16, scope="warp")
        C = T.match_buffer(c, (32, 8), acc_dtype, align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:32, 0:8], A[0:32, 0:local], B[0:32, 0:local])
            T.writes(C[0:32, 0:8])
            for i, j, kk in T.grid(16, 16, k):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, kk])
                    tc, rc = T.meta_var(lane_a(vi, vj))
                    ta, ra = T.meta_var(lane_a(vi, vk, k))
                    tb, rb = T.meta_var(lane_b(vj, vk, k))
                    T.reads(C[tc, rc], A[ta, ra], B[tb, rb])
                    T.writes(C[tc, rc])
                    C[tc, rc] = C[tc, rc] + Cast(acc_dtype, A[ta, ra]) * Cast(acc_dtype,
                                                                              B[tb, rb])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (32, local), in_dtype, align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (32, local), in_dtype, align=64, offset_factor=16, scope="warp")
        C = T.match_buffer(c, (32, 8), acc_dtype, align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:32, 0:8], A[0:32, 0:local], B[0:32, 0:local])
            T.writes(C[0:32, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                for half in T.unroll(2):
                    T.evaluate(T.ptx_legacy.mma(
                        shape, "row", "col", ab, ab, cd,
                        A.data, A.elem_offset + tx * convert(local),
                        B.data, B.elem_offset + tx * convert(local) + half * convert(local // 2),
                        C.data, C.elem_offset + tx * convert(8) + half * convert(4),
                        False, dtype=acc_dtype))

    return desc, impl


def _mma_fill(acc_dtype: str):
    from tvm.script import tirx as T
    from tvm.tirx import IntImm

    zero = IntImm("int32", 0).astype(acc_dtype)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle) -> None:
        C = T.match_buffer(a, (32, 8), acc_dtype, scope="warp")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:32, 0:8])
            for i0, i1 in T.grid(16, 16):
                with T.sblock("C_warp"):
                    i, j = T.axis.remap("SS", [i0, i1])
                    t, r = T.meta_var(lane_a(i, j))
                    T.reads()
                    T.writes(C[t, r])
                    C[t, r] = zero

    @T.prim_func(s_tir=True)
    def impl(a: T.handle) -> None:
        C = T.match_buffer(a, (32, 8), acc_dtype, scope="warp", offset_factor=1)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:32, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                T.evaluate(T.cuda.mma_fill_legacy(8, C.data, C.elem_offset, dtype=acc_dtype))

    return desc, impl


_MAKERS = {"load": _load, "fill": _fill, "store": _store, "sync": _sync,
           "ldmatrix": _ldmatrix, "lds_b": _lds_b, "mma": _mma, "mma_fill": _mma_fill}


@cache
def intrin(kind: str, *args) -> str:
    """The name of the registered intrinsic `kind` ("load", "fill", "store", "sync" for WMMA;
    "ldmatrix", "lds_b", "mma", "mma_fill" for mma.sync) for `args` (see the makers above),
    registering it on first use."""
    from tvm import s_tir

    name = "tsl_" + "_".join([kind] + [str(a).replace(".", "_") for a in args])
    s_tir.TensorIntrin.register(name, *_MAKERS[kind](*args), override=True)
    return name
