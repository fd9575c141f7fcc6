"""The VTA tensor intrinsics: one GEMM uop and one accumulator reset, as s_tir TensorIntrins.

Each impl is a call to an extern that only marks the spot ("tsl_vta_gemm", "tsl_vta_reset"):
nothing is compiled from it. The codegen reads the operand regions of the tensorized block (the
accumulator entry, the input entry, the weight entry), so the impl passes the first element of
each operand to keep their multi-dimensional indices in the TIR.
"""

from __future__ import annotations

from functools import cache

GEMM_EXTERN = "tsl_vta_gemm"
RESET_EXTERN = "tsl_vta_reset"


@cache
def register(block_out: int, block_in: int, scopes: tuple[str, str, str]) -> tuple[str, str]:
    """Register (once) the 1 x block_out x block_in GEMM and the block_out reset on operands in
    `scopes` (acc, inp, wgt); their names."""
    from tvm import s_tir
    from tvm.script import tirx as T

    bo, bi = block_out, block_in
    sc, sa, sb = scopes

    @T.prim_func(s_tir=True)
    def gemm_desc(c: T.handle, a: T.handle, b: T.handle) -> None:
        C = T.match_buffer(c, (bo,), "int32", offset_factor=1, scope=sc)
        A = T.match_buffer(a, (bi,), "int8", offset_factor=1, scope=sa)
        B = T.match_buffer(b, (bo, bi), "int8", offset_factor=1, scope=sb)
        with T.sblock("root"):
            T.reads(C[0:bo], A[0:bi], B[0:bo, 0:bi])
            T.writes(C[0:bo])
            for j, k in T.grid(bo, bi):
                with T.sblock("update"):
                    vj, vk = T.axis.remap("SR", [j, k])
                    C[vj] = C[vj] + T.Cast("int32", A[vk]) * T.Cast("int32", B[vj, vk])

    @T.prim_func(s_tir=True)
    def gemm_impl(c: T.handle, a: T.handle, b: T.handle) -> None:
        C = T.match_buffer(c, (bo,), "int32", offset_factor=1, scope=sc)
        A = T.match_buffer(a, (bi,), "int8", offset_factor=1, scope=sa)
        B = T.match_buffer(b, (bo, bi), "int8", offset_factor=1, scope=sb)
        with T.sblock("root"):
            T.reads(C[0:bo], A[0:bi], B[0:bo, 0:bi])
            T.writes(C[0:bo])
            T.evaluate(T.call_extern("int32", GEMM_EXTERN, C[0], A[0], B[0, 0]))

    @T.prim_func(s_tir=True)
    def reset_desc(c: T.handle) -> None:
        C = T.match_buffer(c, (bo,), "int32", offset_factor=1, scope=sc)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:bo])
            for j in T.serial(bo):
                with T.sblock("init"):
                    vj = T.axis.remap("S", [j])
                    C[vj] = T.int32(0)

    @T.prim_func(s_tir=True)
    def reset_impl(c: T.handle) -> None:
        C = T.match_buffer(c, (bo,), "int32", offset_factor=1, scope=sc)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:bo])
            T.evaluate(T.call_extern("int32", RESET_EXTERN, C[0]))

    tag = "_".join(x.split(".")[-1] for x in scopes)
    names = (f"tsl_vta_gemm_1x{bo}x{bi}_{tag}", f"tsl_vta_reset_1x{bo}_{tag}")
    s_tir.TensorIntrin.register(names[0], gemm_desc, gemm_impl, override=True)
    s_tir.TensorIntrin.register(names[1], reset_desc, reset_impl, override=True)
    return names
