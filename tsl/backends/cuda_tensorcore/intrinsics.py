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


def _load(dtype: str, scope: str, operand: str, col_major: bool):
    from tvm.script import tirx as T

    frag = f"wmma.matrix_{operand.lower()}"
    layout = "col_major" if col_major else "row_major"

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (16, 16), dtype, align=64, offset_factor=16, scope=scope)
        C = T.match_buffer(c, (16, 16), dtype, align=64, offset_factor=16, scope=frag)
        with T.sblock("root"):
            T.reads(A[0:16, 0:16])
            T.writes(C[0:16, 0:16])
            for i, j in T.grid(16, 16):
                with T.sblock("load"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    C[vi, vj] = A[vi, vj]

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

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (16, 16), dtype, align=64, offset_factor=16,
                           scope="wmma.accumulator")
        C = T.match_buffer(c, (16, 16), dtype, align=64, offset_factor=16, scope=scope)
        with T.sblock("root"):
            T.reads(A[0:16, 0:16])
            T.writes(C[0:16, 0:16])
            for i, j in T.grid(16, 16):
                with T.sblock("store"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    C[vi, vj] = A[vi, vj]

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


def _sync(in_dtype: str, acc_dtype: str, b_trans: bool):
    from tvm.script import tirx as T

    def b_at(B, k, j):
        return B[j, k] if b_trans else B[k, j]

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (16, 16), in_dtype, align=64, offset_factor=16,
                           scope="wmma.matrix_a")
        B = T.match_buffer(b, (16, 16), in_dtype, align=64, offset_factor=16,
                           scope="wmma.matrix_b")
        C = T.match_buffer(c, (16, 16), acc_dtype, align=64, offset_factor=16,
                           scope="wmma.accumulator")
        with T.sblock("root"):
            T.reads(C[0:16, 0:16], A[0:16, 0:16], B[0:16, 0:16])
            T.writes(C[0:16, 0:16])
            for i, j, k in T.grid(16, 16, 16):
                with T.sblock(""):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
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
        A = T.match_buffer(a, (16, 16), in_dtype, align=64, offset_factor=16,
                           scope="wmma.matrix_a", strides=[a1, a0])
        B = T.match_buffer(b, (16, 16), in_dtype, align=64, offset_factor=16,
                           scope="wmma.matrix_b", strides=[b1, b0])
        C = T.match_buffer(c, (16, 16), acc_dtype, align=64, offset_factor=16,
                           scope="wmma.accumulator", strides=[c1, c0])
        with T.sblock("root"):
            T.reads(C[0:16, 0:16], A[0:16, 0:16], B[0:16, 0:16])
            T.writes(C[0:16, 0:16])
            T.evaluate(T.tvm_mma_sync(C.data, _frag_index(C, c1, 16, 16),
                                      A.data, _frag_index(A, a1, 16, 16),
                                      B.data, _frag_index(B, b1, 16, 16),
                                      C.data, _frag_index(C, c1, 16, 16), dtype="void"))

    return desc, impl


_MAKERS = {"load": _load, "fill": _fill, "store": _store, "sync": _sync}


@cache
def intrin(kind: str, *args) -> str:
    """The name of the registered intrinsic `kind` ("load", "fill", "store", "sync") for
    `args` (see the makers above), registering it on first use."""
    from tvm import s_tir

    name = "tsl_wmma_" + "_".join([kind] + [str(a).replace(".", "_") for a in args])
    s_tir.TensorIntrin.register(name, *_MAKERS[kind](*args), override=True)
    return name
