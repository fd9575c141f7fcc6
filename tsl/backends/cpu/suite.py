"""The CPU rows of `python -m tsl.bench` and the NumPy baseline they are compared with."""

from __future__ import annotations

from ... import ops

# (H=W, Cin, Cout, kernel, pad, stride) of ResNet-18's conv layers C2..C11.
RESNET18 = [(56, 64, 64, 3, 1, 1), (56, 64, 128, 3, 1, 2), (56, 64, 128, 1, 0, 2),
            (28, 128, 128, 3, 1, 1), (28, 128, 256, 3, 1, 2), (28, 128, 256, 1, 0, 2),
            (14, 256, 256, 3, 1, 1), (14, 256, 512, 3, 1, 2), (14, 256, 512, 1, 0, 2),
            (7, 512, 512, 3, 1, 1)]
# One BERT-base layer at sequence 128: fused QKV, attention output, the two FFN GEMMs, and
# the per-head attention products.
BERT = [(128, 2304, 768), (128, 768, 768), (128, 3072, 768), (128, 768, 3072)]


def suite(quick: bool) -> list:
    if quick:
        return [ops.matmul(256, 256, 256), ops.matmul(256, 256, 256, dtype="int8"),
                ops.dense(128, 768, 768, epilogue=ops.bias() + ops.relu()),
                ops.conv2d(1, 64, 14, 14, 64, 3, 3, padding=1)]
    rows = [ops.matmul(n, n, n) for n in (256, 512, 1024, 2048)]
    rows += [ops.matmul(n, n, n, dtype="int8") for n in (1024, 2048)]
    rows += [ops.matmul(1024, 1024, 1024, dtype="bfloat16")]
    rows += [ops.matmul(m, n, k) for m, n, k in BERT]
    rows += [ops.batch_matmul(12, 128, 128, 64), ops.batch_matmul(12, 128, 64, 128)]
    for layout in ("NCHW", "NHWC"):
        rows += [ops.conv2d(1, c, hw, hw, k, r, r, stride=st, padding=p, layout=layout)
                 for hw, c, k, r, p, st in RESNET18]
    return rows
