"""`python -m tsl.bench --dynamic`, "encoder dyn-seq" rows: a Relax model with a symbolic
sequence length (issue #25 part 4) against the static build of one length.

The BERT-base layer (`nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True)`; --quick:
d_model 256, 4 heads, seq <= 128) is exported with `Dim("seq", max=...)` and compiled ONCE
through `tsl.relax.pipeline("cpu")`; it is checked against PyTorch at every length of
`SEQS`, then timed at each against the static build of `STATIC_SEQ` (compiled for that length
only), interleaved, with TVM's time evaluator (under `tsl.timing.exclusive`'s lock when
TSL_TIMING_LOCK is set). Numbers are read here, never asserted in tests.
"""

from __future__ import annotations

import numpy as np

from ..timing import exclusive, realtime
from .models import compile_model

SEQS = (1, 17, 128, 384, 512)
QUICK_SEQS = (1, 17, 128)
STATIC_SEQ = 128
ROUNDS = 5


def _export(model, seq_len: int, upper: int | None):
    import torch
    import tvm.relax.frontend.torch as frontend

    x = torch.randn(1, seq_len, model.self_attn.embed_dim)
    dyn = {"src": {1: torch.export.Dim("seq", min=1, max=upper)}} if upper else None
    ep = torch.export.export(model, (x,), dynamic_shapes=dyn)
    return frontend.from_exported_program(ep, keep_params_as_input=False)


def _seconds(vm, x) -> float:
    import tvm

    f = vm.time_evaluator("main", tvm.cpu(), number=10, repeat=1)
    with realtime():
        return float(f(x).mean)


def main(quick: bool = False) -> list[dict]:
    """The rows (also printed): per length, dynamic ms, static ms (at STATIC_SEQ), error."""
    import torch
    import tvm

    torch.manual_seed(0)
    d, heads, ff, upper = (256, 4, 1024, 128) if quick else (768, 12, 3072, 512)
    model = torch.nn.TransformerEncoderLayer(d, heads, ff, batch_first=True,
                                             dropout=0.0).eval()
    built = compile_model(_export(model, 17, upper))
    dyn, dyn_s = built.vm, built.seconds
    built = compile_model(_export(model, STATIC_SEQ, None))
    static, static_s = built.vm, built.seconds
    print(f"\nencoder dyn-seq (d_model {d}, {heads} heads, seq <= {upper}): one build "
          f"{dyn_s:.1f} s (static seq {STATIC_SEQ}: {static_s:.1f} s)", flush=True)
    print(f"  {'seq':>6} {'dynamic ms':>11} {'static ms':>10} {'dyn/static':>10} "
          f"{'max err':>9}", flush=True)
    rows = []
    for s in QUICK_SEQS if quick else SEQS:
        x = np.random.default_rng(s).standard_normal((1, s, d)).astype("float32")
        xt = tvm.runtime.tensor(x)
        ref = model(torch.from_numpy(x)).detach().numpy()
        err = float(np.abs(dyn["main"](xt)[0].numpy() - ref).max())
        td, ts = [], []
        with exclusive():
            for _ in range(ROUNDS):
                td.append(_seconds(dyn, xt))
                if s == STATIC_SEQ:
                    ts.append(_seconds(static, xt))
        r = {"family": "encoder dyn-seq", "value": s, "dynamic_s": float(np.median(td)),
             "static_s": float(np.median(ts)) if ts else None, "error": err,
             "verified": err <= 1e-4, "compile_s": dyn_s}
        ratio = r["dynamic_s"] / r["static_s"] if ts else None
        r["ratio"] = ratio
        rows.append(r)
        print(f"  {s:>6} {r['dynamic_s'] * 1e3:>11.3f} "
              f"{(r['static_s'] or 0) * 1e3 if ts else float('nan'):>10.3f} "
              f"{ratio if ratio else float('nan'):>10.3f} {err:>9.1e}", flush=True)
    return rows
