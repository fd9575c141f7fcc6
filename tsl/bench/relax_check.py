"""`python -m tsl.bench --check-relax`: does the bench's time of a conv hold inside a model?

A CPU row's time is what a caller pays per call for resident inputs (`art.bind` of the
weights, then on every call the activation's padding and packing into the bound function's
TVM tensors and the output's cropping; no NumPy copies in or out). A model compiled by `tsl.relax.pipeline` pays the same
work in its own way (layout conversion at the graph's entry and exit, the weight packed at
compile time), so the two should agree: this builds a one-conv Relax model (the ResNet-18
layer 1x64x56x56 -> 64, 3x3, NCHW, by default) through `tsl.relax.pipeline("cpu")`, checks
its output against NumPy's reference, and times it against the bench's user-level time for
the same `tsl.ops.conv2d`, each after a settle pause, alternately for `rounds` rounds;
a ratio off 1 by more than `tolerance` is flagged.
"""

from __future__ import annotations

import time

import numpy as np

from .. import ops, timing
from ..artifact import call_times
from ..backend import resolve_target
from ..record import record

CONV = dict(n=1, c=64, hw=56, k=64, r=3, pad=1)
REPEAT = 5  # single calls per timing, as the CPU rows' `user_time(repeat=5)`


def one_conv_module(n: int, c: int, hw: int, k: int, r: int, pad: int):
    """(Relax module with its weight bound, weight, input) of one NCHW conv, no bias."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend import nn

    class Conv(nn.Module):
        def __init__(self):
            self.weight = nn.Parameter((k, c, r, r), "float32")

        def forward(self, x):
            return nn.wrap_nested(relax.op.nn.conv2d(x._expr, self.weight._expr,
                                                     padding=pad), "conv")

    mod, _ = Conv().export_tvm({"forward": {"x": nn.spec.Tensor((n, c, hw, hw), "float32")}})
    rng = np.random.default_rng(0)
    w = rng.normal(0, np.sqrt(2.0 / (c * r * r)), (k, c, r, r)).astype("float32")
    x = rng.uniform(-1, 1, (n, c, hw, hw)).astype("float32")
    mod = relax.transform.BindParams("forward", {"weight": tvm.runtime.tensor(w)})(mod)
    return mod, w, x


def check(rounds: int = 5, tolerance: float = 0.15, conv: dict | None = None) -> dict:
    """{"relax_s", "bench_s", "kernel_s", "ratio", "verified", "error", "ok", ...} of the
    one-conv model (ok: its output verified and its time within `tolerance` of the bench's).

    Both sides are timed the way the bench times a row (`Artifact.user_time`: warm-up calls,
    the median of single calls, a settle pause first), alternately, and the medians
    over `rounds` compared, so that the ratio is the model's work against the row's, not one
    harness against another (TVM's time_evaluator runs many calls in a loop). The model
    gets a TVM tensor too, so neither side times a copy from NumPy."""
    import tvm

    from .models import compile_model

    cv = {**CONV, **(conv or {})}
    backend, machine = resolve_target("cpu")
    op = ops.conv2d(cv["n"], cv["c"], cv["hw"], cv["hw"], cv["k"], cv["r"], cv["r"],
                    padding=cv["pad"])
    art = backend.build(record(op, machine, None))
    mod, w, x = one_conv_module(**cv)
    model = compile_model(mod, "cpu")
    verified, error = op.check(model(x), op.reference(x, w))
    forward, xt = model.vm["forward"], tvm.runtime.tensor(x)
    relax_s, bench_s, kernel_s = [], [], []
    for _ in range(rounds):
        time.sleep(timing.SETTLE_SECONDS)
        with timing.realtime():
            relax_s.append(float(np.median(call_times(lambda: forward(xt), REPEAT))))
        time.sleep(timing.SETTLE_SECONDS)
        with timing.realtime():
            bench_s.append(art.user_time([x, w], repeat=REPEAT)["user_seconds"])
        kernel_s.append(art.time(x, w, number=3, repeat=3))
    r, b = float(np.median(relax_s)), float(np.median(bench_s))
    return {"what": f"conv2d {op.shape_str} NCHW on {machine.name}", "relax_s": r,
            "bench_s": b, "kernel_s": float(np.median(kernel_s)), "ratio": r / b,
            "ok": bool(verified) and abs(r / b - 1) <= tolerance, "verified": bool(verified),
            "error": error, "tolerance": tolerance}


def line(res: dict) -> str:
    return (f"check-relax: {res['what']}: tsl.relax.pipeline model {res['relax_s'] * 1e3:.3f} "
            f"ms, bench user-level {res['bench_s'] * 1e3:.3f} ms (kernel only "
            f"{res['kernel_s'] * 1e3:.3f} ms), ratio {res['ratio']:.2f} "
            f"({'within' if res['ok'] else 'OFF by more than'} {res['tolerance']:.0%}); "
            f"output {'verified' if res['verified'] else 'WRONG'} against NumPy (error "
            f"{res['error']:.2e})")
