"""The TPU back end: TPU v4 / v5e TAMs, an emitter from the scheduled TIR to an XLA program
(StableHLO and HLO text) whose loops and tiles are the schedule's, execution on XLA's CPU client
for numerics (optional jax/jaxlib), and a roofline estimate from the TAM."""

from __future__ import annotations

from ...backend import Backend
from ...lower import lower
from ...ops import bias, conv2d, dense, matmul, relu
from .lowering import TPULowering
from .runtime import TPUArtifact, check_vmem


class TPUBackend(Backend):
    name = "tpu"
    default_machine = "tpu-v5e"

    def unavailable(self, machine, **options) -> str | None:
        return None  # emitting needs no jax; running says what to install

    def build(self, schedule, **options) -> TPUArtifact:
        if options:
            raise TypeError(f"the TPU back end takes no build options, got {sorted(options)}")
        check_vmem(schedule)
        return TPUArtifact(schedule, lower(schedule, TPULowering(schedule.machine)))

    def bench_suite(self, quick: bool) -> list:
        bf16 = dict(dtype="bfloat16", acc_dtype="float32")
        if quick:
            return [matmul(512, 512, 512, **bf16), dense(128, 768, 768, **bf16),
                    matmul(256, 256, 512, dtype="int8")]
        return [matmul(1024, 1024, 1024, **bf16), matmul(2048, 2048, 2048, **bf16),
                matmul(4096, 4096, 4096, **bf16),
                # BERT-base GEMMs at sequence length 128: attention projections, FFN in/out, QKV
                matmul(128, 768, 768, **bf16), matmul(128, 3072, 768, **bf16),
                matmul(128, 768, 3072, **bf16), matmul(128, 2304, 768, **bf16),
                dense(128, 768, 3072, epilogue=bias() + relu(), **bf16),
                matmul(1024, 1024, 1024, dtype="int8"),
                conv2d(1, 128, 58, 58, 128, 3, 3, layout="NHWC", **bf16)]


backend = TPUBackend()
