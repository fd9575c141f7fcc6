"""What the MXU primitive is on the TPU back end: a marked region, not a TensorIntrin.

XLA has no instruction for one 128x128x128 MXU pass that a program could call; the TPU compiler
issues MXU passes for a `dot_general` itself. So the tensorized nest is `blockize`d into one
block annotated with the primitive's name (the TIR equivalent of "this nest is one primitive
call"), and the emitter turns that block, with the on-chip loops around it, into `dot_general`
with the primitive's operand and accumulator element types.
"""

from __future__ import annotations

from ...errors import LoweringError

ANNOTATION = "tsl.primitive"

# TVM dtype -> MLIR element type, for every dtype a TPU program touches.
MLIR_TYPES = {"bfloat16": "bf16", "float32": "f32", "int8": "i8", "int32": "i32",
              "float16": "f16", "bool": "i1"}


def mlir_type(dtype: str) -> str:
    try:
        return MLIR_TYPES[str(dtype)]
    except KeyError:
        raise LoweringError(f"the TPU emitter has no XLA element type for {dtype}") from None


def mark(sch, loop_rv, prim) -> object:
    """Make the nest from `loop_rv` inwards one block that stands for `prim`."""
    if (prim.a_dtype, prim.acc_dtype) not in (("bfloat16", "float32"), ("int8", "int32")):
        raise LoweringError(f"the TPU back end lowers MXU primitives bf16 -> f32 and "
                            f"int8 -> int32; {prim.name} is {prim.a_dtype} -> {prim.acc_dtype}")
    block = sch.blockize(loop_rv)
    sch.annotate(block, ANNOTATION, prim.name)
    return block
