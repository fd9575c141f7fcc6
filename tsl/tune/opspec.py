"""Operators written as text on the command line: "matmul 1024x1024x1024 float32".

    NAME SHAPE [DTYPE] [WORD ...]

SHAPE is the operator's `shape_str`: matmul MxNxK, batch_matmul BxMxNxK, dense MxNxK (batch x
out features x in features), conv2d NxCxHxWxKxRxS. Words: a dtype (float32, float16,
bfloat16, int8), `bias`, `relu`, `requantize=SHIFT` (int8: + bias, shift, clip to int8),
`transpose_b`, `NCHW` / `NHWC`, `stride=S`, `padding=P`, `dilation=D` (conv2d).
"""

from __future__ import annotations

from .. import ops
from ..errors import InputError
from ..ops.operator import FLOAT_DTYPES, INT_DTYPES

DIMS = {"matmul": 3, "batch_matmul": 4, "dense": 3, "conv2d": 7}


def parse(spec: str):
    """The operator `spec` describes; InputError naming the word that is wrong."""
    words = spec.split()
    if len(words) < 2 or words[0] not in DIMS:
        raise InputError(f"operator {spec!r}: write NAME SHAPE [DTYPE] [WORD ...] with NAME one "
                         f"of {sorted(DIMS)}, e.g. 'matmul 1024x1024x1024 float32'")
    name, shape_text, rest = words[0], words[1], words[2:]
    try:
        shape = [int(x) for x in shape_text.lower().split("x")]
    except ValueError:
        shape = []
    if len(shape) != DIMS[name]:
        raise InputError(f"operator {spec!r}: {name} takes a shape of {DIMS[name]} numbers "
                         f"joined by x, got {shape_text!r}")
    kw: dict = {"dtype": "float32"}
    steps = []
    for w in rest:
        k, _, v = w.partition("=")
        if w in FLOAT_DTYPES + INT_DTYPES:
            kw["dtype"] = w
        elif w in ("bias", "relu"):
            steps.append(getattr(ops, w)())
        elif k == "requantize" and v.lstrip("-").isdigit():
            steps = [ops.requantize(int(v), bias=True)]
        elif w == "transpose_b" and name in ("matmul", "batch_matmul"):
            kw["transpose_b"] = True
        elif w in ("NCHW", "NHWC") and name == "conv2d":
            kw["layout"] = w
        elif k in ("stride", "padding", "dilation") and name == "conv2d" and v.isdigit():
            kw[k] = int(v)
        else:
            raise InputError(f"operator {spec!r}: unknown word {w!r} for {name}; see "
                             f"`python -m tsl.tune --help`")
    epilogue = None
    for s in steps:
        epilogue = s if epilogue is None else epilogue + s
    if name == "dense":
        m, n, k = shape
        kw["epilogue"] = epilogue if epilogue is not None else ops.Epilogue(())  # words, not defaults
        return ops.dense(m, k, n, **kw)
    kw["epilogue"] = epilogue
    return getattr(ops, name)(*shape, **kw)
