"""The instruction kinds the CPU back end can emit for a tensor primitive.

A machine file names the kind (`instruction`) and, where the kind calls one, the LLVM
intrinsic (`intrinsic`); lanes and dtypes come from the primitive's shape and types. No
primitive or machine name appears here: a CPU variant with other lanes, registers or another
intrinsic of a known kind is one more TOML file.

* ``vector``  C[n] += A * B[n] with the n-loop vectorized (fp32 FMA, bf16 through fp32, int8
  widened to int32): LLVM picks the instruction. k = 1. bf16 operands are read as fp32, widened
  (exactly) by the packing like madd2's: widening each B vector in the inner loop took vector
  slots from the FMAs (bf16 1024³ on Zen 1: 43 -> 32 ms).
* ``dot4``    C[n] (int32) += sum of 4 int8 products per lane: x86 ``vpdpbusd`` (A unsigned,
  B signed), AArch64 ``sdot`` (both signed). The intrinsic takes (acc <n x i32>, a <4n x i8>,
  b <4n x i8>). k = 4.
* ``madd2``   C[n] (int32) += sum of 2 int16 products per lane, the int8 operands sign-extended:
  x86 ``vpmaddwd``, exact on the full int8 range (``vpmaddubsw`` saturates, and is not used).
  The intrinsic takes (a <2n x i16>, b <2n x i16>) and returns <n x i32>. k = 2. The kernel
  reads both operands as int16: weights are widened by the artifact with the packing, A by the
  kernel's packing stage, so that the inner loop is one broadcast load, one multiply-add with a
  memory operand and one add per accumulator register.
* ``dot2``    C[n] (float32) += sum of 2 bf16 products per lane: AArch64 ``bfdot`` (BF16). The
  intrinsic takes (acc <n x float>, a <2n x bfloat>, b <2n x bfloat>); k = 2. Arm's BFDOT
  does not round like IEEE fp32 FMAs (round-to-odd intermediate, denormals flushed), so results
  differ from an fp32 reference of the bf16 inputs in the last bits.
* ``mmla``    C[2, 2] (int32) += A[2, 8] * B[8, 2] in one 128-bit register: AArch64 ``smmla``
  (i8mm). A holds two rows of 8 int8 (the activations' pairs of rows, or of output pixels), B
  two columns of 8, C the 2x2 block row-major; the intrinsic takes (acc <4 x i32>,
  a <16 x i8>, b <16 x i8>). m = n = 2, k = 8. The accumulator tile is kept in 2x2 blocks
  (`CPULowering.cache`), so that each block is one register.

Written here rather than imported from `tvm.s_tir.tensor_intrin.x86`: importing that package
loads every back end's intrinsics (about 18 s), and its `dot_16x4_vnni` fails LLVM 22's verifier.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from ...errors import TAMError


@dataclass(frozen=True)
class Kind:
    m: int  # rows of A one instruction reads
    k: int  # products summed into each accumulator lane
    intrinsic: bool  # whether it calls an LLVM intrinsic the machine file names
    n: int | None = None  # columns of one instruction, where fixed (else the primitive's lanes)


KINDS = {"vector": Kind(1, 1, False), "dot4": Kind(1, 4, True), "madd2": Kind(1, 2, True),
         "mmla": Kind(2, 8, True, n=2), "dot2": Kind(1, 2, True)}
INT_KINDS = ("dot4", "madd2", "mmla")


def check(machine, p) -> str:
    """The kind of primitive `p`, after checking that its shape and types suit that kind."""
    kind = p.instruction or "vector"
    where = f"{machine.source or machine.name}: [primitive {p.name!r}]"
    if kind not in KINDS:
        raise TAMError(f"{where} key 'instruction': the CPU back end knows instruction kinds "
                       f"{sorted(KINDS)}, not {kind!r}")
    kd = KINDS[kind]
    if p.m != kd.m or p.k != kd.k or (kd.n is not None and p.n != kd.n):
        n = "" if kd.n is None else f", n = {kd.n}"
        raise TAMError(f"{where}: instruction {kind!r} works on m = {kd.m}{n} and k = {kd.k}; "
                       f"the primitive says m = {p.m}, n = {p.n}, k = {p.k}")
    if kd.intrinsic and not p.intrinsic:
        raise TAMError(f"{where} key 'intrinsic': instruction {kind!r} needs the LLVM intrinsic "
                       f"it calls (e.g. llvm.x86.avx512.vpdpbusd.512)")
    if kind == "dot2" and (p.a_dtype, p.b_dtype, p.acc_dtype) != ("bfloat16",) * 2 + ("float32",):
        raise TAMError(f"{where}: instruction 'dot2' takes bfloat16 x bfloat16 -> float32, not "
                       f"{p.a_dtype} x {p.b_dtype} -> {p.acc_dtype}")
    if kind in INT_KINDS and (p.acc_dtype != "int32" or p.b_dtype != "int8"
                              or p.a_dtype not in ("int8", "uint8")):
        raise TAMError(f"{where}: instruction {kind!r} takes int8/uint8 x int8 -> int32, not "
                       f"{p.a_dtype} x {p.b_dtype} -> {p.acc_dtype}")
    if kind in ("madd2", "mmla") and p.a_dtype != "int8":
        raise TAMError(f"{where} key 'a_dtype': instruction {kind!r} takes both operands "
                       f"signed; A must be int8, not {p.a_dtype}")
    return kind


def operand_dtypes(machine, p) -> tuple[str | None, str | None]:
    """(A, B) dtypes the kernel reads for primitive `p`, where they are not the operator's."""
    if p is None:
        return None, None
    kind = check(machine, p)
    if kind == "madd2":
        return "int16", "int16"
    if kind == "vector" and p.acc_dtype == "float32" and "bfloat16" in (p.a_dtype, p.b_dtype):
        return "float32", "float32"
    return ("uint8" if p.a_dtype == "uint8" else None), None


def lowering(machine, p) -> str:
    """"vector", or the name of the TensorIntrin registered for primitive `p`."""
    kind = check(machine, p)
    if kind == "vector":
        return kind
    return register(kind, p.n, p.a_dtype, p.intrinsic)


@cache
def register(kind: str, n: int, a_dtype: str, intrinsic: str) -> str:
    """Register the TensorIntrin of one primitive (kind, n lanes, A's dtype, the LLVM
    intrinsic it calls) and return its name."""
    from tvm import s_tir

    k = KINDS[kind].k
    name = f"tsl_cpu_{kind}_{n}x{k}_{a_dtype}_{intrinsic}"
    if kind == "mmla":
        s_tir.TensorIntrin.register(name, *_mmla(intrinsic), override=True)
        return name
    a_dtype, b_dtype, acc = _operand_types(kind, a_dtype)
    impl = (_dot_impl(kind, n, k, a_dtype, b_dtype, acc, intrinsic) if kind in ("dot4", "dot2")
            else _madd_impl(n, k, intrinsic))
    s_tir.TensorIntrin.register(name, _desc(n, k, a_dtype, b_dtype, acc), impl, override=True)
    return name


def _operand_types(kind: str, a_dtype: str) -> tuple[str, str, str]:
    """(A, B, accumulator) dtypes of a dot4 / dot2 / madd2 primitive's buffers."""
    if kind == "madd2":
        return "int16", "int16", "int32"
    if kind == "dot2":
        return a_dtype, "bfloat16", "float32"
    return a_dtype, "int8", "int32"


def _desc(n: int, k: int, a_dtype: str, b_dtype: str, acc: str):
    """C[n] += sum over k of A[k] * B[n, k], in the accumulator's dtype."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((k,), a_dtype, offset_factor=1),
             B: T.Buffer((n, k), b_dtype, offset_factor=1),
             C: T.Buffer((n,), acc, offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:n], A[0:k], B[0:n, 0:k])
            T.writes(C[0:n])
            for i in T.serial(0, n):
                for kk in T.serial(0, k):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, kk])
                        C[vi] = C[vi] + T.cast(A[vk], acc) * T.cast(B[vi, vk], acc)
    return desc


def _dot_impl(kind: str, n: int, k: int, a_dtype: str, b_dtype: str, acc: str, intrinsic: str):
    """dot4 and dot2 call (acc, A's k elements broadcast to every lane, B): their operand
    vectors are int8 (sdot, vpdpbusd) or, for bf16, int16 vectors of the bf16 bits (TVM's
    LLVM code generator has no bfloat type: `codegen` gives LLVM the bfloat overload)."""
    from tvm.script import tirx as T

    lane = "int16" if kind == "dot2" else "int8"

    def bits(x, w):
        """x's elements as `lane` bits. bf16 goes through fp32, exactly: BF16 legalization
        stores bf16 buffers allocated in the kernel (A's packing stage) as fp32, whose top
        16 bits are the bf16 value; LLVM folds the round trip for bf16 storage."""
        if kind == "dot4":
            return x
        return T.reinterpret(T.Cast(f"uint16x{w}", T.shift_right(
            T.reinterpret(T.Cast(f"float32x{w}", x), dtype=f"uint32x{w}"),
            T.Broadcast(T.uint32(16), w))), dtype=f"int16x{w}")

    return _impl(n, k, a_dtype, b_dtype, acc, lambda A, B, C: T.call_llvm_pure_intrin(
        T.llvm_lookup_intrinsic_id(intrinsic),
        C.vload([0], dtype=f"{acc}x{n}"),
        T.reinterpret(T.broadcast(T.reinterpret(bits(A.vload([0], f"{a_dtype}x{k}"), k),
                                                dtype="int32"), n),
                      dtype=f"{lane}x{k * n}"),
        bits(B.vload([0, 0], dtype=f"{b_dtype}x{k * n}"), k * n), dtype=f"{acc}x{n}"))


def _madd_impl(n: int, k: int, intrinsic: str):
    """madd2: C[n] += the intrinsic's n sums of 2 int16 products (A's pair broadcast)."""
    from tvm.script import tirx as T

    return _impl(n, k, "int16", "int16", "int32", lambda A, B, C: C.vload(
        [0], dtype=f"int32x{n}") + T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id(intrinsic),
            T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "int16x2"), dtype="int32"), n),
                          dtype=f"int16x{2 * n}"),
            B.vload([0, 0], dtype=f"int16x{2 * n}"), dtype=f"int32x{n}"))


def _impl(n: int, k: int, a_dtype: str, b_dtype: str, acc: str, value):
    """The impl of a one-instruction primitive: C's n lanes = `value(A, B, C)`. One
    expression: named temporaries would become buffers written every call. Its buffers repeat
    `_desc`'s: TensorIntrin.register requires the two signatures to match."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((k,), a_dtype, offset_factor=1),
             B: T.Buffer((n, k), b_dtype, offset_factor=1),
             C: T.Buffer((n,), acc, offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:n], A[0:k], B[0:n, 0:k])
            T.writes(C[0:n])
            C[T.ramp(T.int32(0), 1, n)] = value(A, B, C)
    return impl


def _mmla(intrinsic: str):
    """(desc, impl) of C[2, 2] += A[2, 8] * B[2, 8]^T: one 2x2 block of the accumulator tile,
    A's two rows and B's two columns of 8 int8, each operand 16 contiguous bytes (one load).
    `CPULowering` lays them out so (the tile in 2x2 blocks, A and B packed in blocks of 8 k);
    the impl's strides are explicit so that any other layout fails to lower instead of being
    read wrong."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((2, 8), "int8", offset_factor=1),
             B: T.Buffer((2, 8), "int8", offset_factor=1),
             C: T.Buffer((2, 2), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:2, 0:2], A[0:2, 0:8], B[0:2, 0:8])
            T.writes(C[0:2, 0:2])
            for i, j, kk in T.grid(2, 2, 8):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, kk])
                    C[vi, vj] = C[vi, vj] + T.cast(A[vi, vk], "int32") * T.cast(B[vj, vk], "int32")

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((2, 8), "int8", strides=(8, 1), offset_factor=1),
             B: T.Buffer((2, 8), "int8", strides=(8, 1), offset_factor=1),
             C: T.Buffer((2, 2), "int32", strides=(2, 1), offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:2, 0:2], A[0:2, 0:8], B[0:2, 0:8])
            T.writes(C[0:2, 0:2])
            C[0, T.ramp(T.int32(0), 1, 4)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(intrinsic), C.vload([0, 0], dtype="int32x4"),
                A.vload([0, 0], dtype="int8x16"), B.vload([0, 0], dtype="int8x16"),
                dtype="int32x4")

    return desc, impl
