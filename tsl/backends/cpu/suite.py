"""The CPU rows of `python -m tsl.bench` and the NumPy baseline they are compared with."""

from __future__ import annotations

import time

import numpy as np

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


def median_seconds(f, repeat: int = 7) -> float:
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def numpy_baseline(op) -> tuple[str, float]:
    """(name, ops per second) of NumPy's float32 matmul with the operator's MAC count and GEMM
    shape (conv2d: its im2col GEMM, the im2col itself not counted)."""
    if op.name == "conv2d":
        n, c, h, w, k, r, s = op.params["shape"]
        out = op.output.shape
        pix = out[0] * (out[2] * out[3] if op.params["layout"] == "NCHW" else out[1] * out[2])
        shape, name = (pix, k, c * r * s), "numpy im2col-gemm f32"
    else:
        shape, name = op.params["shape"][-3:], "numpy f32"
    batch = op.params["shape"][0] if op.name == "batch_matmul" else 1
    return name, 2 * op.macs / _matmul_seconds(batch, *shape)


def _matmul_seconds(batch: int, m: int, n: int, k: int) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((batch, m, k), dtype=np.float32)
    b = rng.standard_normal((batch, k, n), dtype=np.float32)
    np.matmul(a, b)
    return median_seconds(lambda: np.matmul(a, b))
