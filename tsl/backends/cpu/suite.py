"""The CPU rows of `python -m tsl.bench` and the NumPy baseline they are compared with."""

from __future__ import annotations

from ... import ops
from ...workloads import BERT_BASE, RESNET18

# One BERT-base layer at sequence 128: fused QKV, attention output, the two FFN GEMMs.
BERT = [BERT_BASE[k] for k in ("qkv", "attention_out", "ffn_in", "ffn_out")]


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
