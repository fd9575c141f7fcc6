"""Tensor intrinsics of the CPU back end, registered with s_tir on first use.

Written here rather than imported from `tvm.s_tir.tensor_intrin.x86`: importing that package
loads every back end's intrinsics (about 18 s), and its `dot_16x4_vnni` fails LLVM 22's verifier
(the vpdpbusd operands must be <64 x i8>).
"""

from __future__ import annotations

from functools import cache

VNNI_16x4 = "tsl_cpu_vnni_16x4_u8i8i32"


@cache
def register() -> None:
    from tvm import s_tir
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((4,), "uint8", offset_factor=1),
             B: T.Buffer((16, 4), "int8", offset_factor=1),
             C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            for i in T.serial(0, 16):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((4,), "uint8", offset_factor=1),
             B: T.Buffer((16, 4), "int8", offset_factor=1),
             C: T.Buffer((16,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            # One expression: named temporaries would become buffers written every call.
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
                C.vload([0], dtype="int32x16"),
                T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"),
                                          16), dtype="int8x64"),
                B.vload([0, 0], dtype="int8x64"), dtype="int32x16")

    s_tir.TensorIntrin.register(VNNI_16x4, desc, impl, override=True)


# Primitive name in the machine file -> how it is lowered: a registered TensorIntrin, or
# "vector" (the n-loop vectorized into FMAs, the m- and k-loops unrolled around it).
LOWERING = {"vnni_1x16x4": VNNI_16x4, "fma_1x16x1_f32": "vector", "fma_1x16x1_bf16": "vector"}
