"""Per-layer conv times: tsl against ONNX Runtime on one-conv models of the same shape.

`python benchmarks/conv_layers.py [--lock /tmp/rt.lock] [--only resnet|pw|dw]` (the lock held
while each party times, not while it builds; timed at real-time priority, `tsl.timing`) times every
ResNet-18 conv layer (`tsl.workloads.RESNET18`, fp32 NCHW, batch 1), MobileNetV2's pointwise
1x1 convs and its depthwise 3x3 convs, each side alone in its own process (ONNX Runtime's spinning pool and
TVM's would otherwise share the cores):

* tsl, dense convs: the user-level time (`art.bind` of the weight, then the median of single
  calls on a resident input: padding, packing and cropping included) and the kernel alone;
* tsl, depthwise: a one-conv Relax model (conv + bias + relu6, as MobileNetV2 has it) compiled
  with `tsl.relax.pipeline("cpu")` (the window rule), the median of single VM calls;
* ONNX Runtime: a one-node ONNX model (Conv, + Clip for the depthwise rows), CPU execution
  provider, intra-op threads = the host's cores, the median of single `run` calls.

Every tsl result is checked against NumPy's reference first.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

# MobileNetV2 (224x224) depthwise 3x3 convs: (channels, input H=W, stride).
MOBILENET_DW = ((32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1),
                (192, 28, 2), (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1))
# MobileNetV2 (224x224) pointwise 1x1 convs, expand and project: (in channels, H=W, out channels).
MOBILENET_PW = ((32, 112, 16), (16, 112, 96), (96, 56, 24), (24, 56, 144), (144, 56, 24),
                (144, 28, 32), (32, 28, 192), (192, 28, 32), (192, 14, 64), (64, 14, 384),
                (384, 14, 64), (384, 14, 96), (96, 14, 576), (576, 14, 96), (576, 7, 160),
                (160, 7, 960), (960, 7, 160), (960, 7, 320), (320, 7, 1280))
REPEAT = 30


def _median_call(fn, repeat: int = REPEAT) -> float:
    """Median of `repeat` single calls after 10 untimed ones, at real-time priority where
    TSL_TIMING=realtime (`tsl.timing`)."""
    from tsl import timing
    from tsl.artifact import call_times

    with timing.realtime():
        return float(np.median(call_times(fn, repeat)))


def rows(only: str | None):
    from tsl.workloads import RESNET18

    out = []
    if only in (None, "resnet"):
        out += [dict(kind="conv", hw=hw, c=c, k=k, r=r, pad=pad, stride=st)
                for hw, c, k, r, pad, st in RESNET18]
    if only in (None, "pw"):
        out += [dict(kind="conv", hw=hw, c=c, k=k, r=1, pad=0, stride=1)
                for c, hw, k in MOBILENET_PW]
    if only in (None, "dw"):
        out += [dict(kind="dw", hw=hw, c=c, k=c, r=3, pad=1, stride=st)
                for c, hw, st in MOBILENET_DW]
    return out


def name(row: dict) -> str:
    dw = "dw " if row["kind"] == "dw" else ""
    return f"{dw}{row['c']}x{row['hw']}x{row['hw']}->{row['k']} {row['r']}x{row['r']} s{row['stride']}"


def _dw_module(row):
    import tvm
    from tvm import relax
    from tvm.relax.frontend import nn

    c, hw, st = row["c"], row["hw"], row["stride"]

    class DW(nn.Module):
        def __init__(self):
            self.weight = nn.Parameter((c, 1, 3, 3), "float32")
            self.bias = nn.Parameter((c,), "float32")

        def forward(self, x):
            y = relax.op.nn.conv2d(x._expr, self.weight._expr, strides=st, padding=1, groups=c)
            y = relax.op.add(y, relax.op.reshape(self.bias._expr, (1, -1, 1, 1)))
            return nn.wrap_nested(relax.op.clip(y, 0.0, 6.0), "dw")

    mod, _ = DW().export_tvm({"forward": {"x": nn.spec.Tensor((1, c, hw, hw), "float32")}})
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.5, (c, 1, 3, 3)).astype("float32")
    b = rng.normal(0, 0.5, (c,)).astype("float32")
    mod = relax.transform.BindParams("forward", {"weight": tvm.runtime.tensor(w),
                                                 "bias": tvm.runtime.tensor(b)})(mod)
    return mod, w, b


def _dw_reference(x, w, b, st):
    import torch

    y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b),
                                   stride=st, padding=1, groups=x.shape[1])
    return y.clamp(0, 6).numpy()


def build_tsl(row: dict):
    """A call that times the row's tsl side (built and checked against the reference now)."""
    import tvm

    from tsl import ops
    from tsl.backend import resolve_target
    from tsl.record import record

    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (1, row["c"], row["hw"], row["hw"])).astype("float32")
    if row["kind"] == "dw":
        from tsl.bench.models import compile_model

        mod, w, b = _dw_module(row)
        model = compile_model(mod, "cpu")
        ref = _dw_reference(x, w, b, row["stride"])
        err = float(np.abs(model(x) - ref).max() / np.abs(ref).max())
        fwd, xt = model.vm["forward"], tvm.runtime.tensor(x)
        return lambda: {"tsl_ms": _median_call(lambda: fwd(xt)) * 1e3, "error": err}
    backend, machine = resolve_target("cpu")
    op = ops.conv2d(1, row["c"], row["hw"], row["hw"], row["k"], row["r"], row["r"],
                    stride=row["stride"], padding=row["pad"])
    s = record(op, machine, None)
    art = backend.build(s)
    w = rng.normal(0, 0.1, (row["k"], row["c"], row["r"], row["r"])).astype("float32")
    ok, err = op.check(art.run(x, w), op.reference(x, w))

    def timed():
        from tsl import timing

        with timing.realtime():
            user = art.user_time([x, w], repeat=REPEAT)["user_seconds"]
            kernel = art.time(x, w, number=5, repeat=5)
        return {"tsl_ms": user * 1e3, "kernel_ms": kernel * 1e3, "error": float(err),
                "ok": bool(ok), "knobs": dict(s.knob_values)}
    return timed


def build_ort(row: dict, threads: int):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    c, k, r, hw = row["c"], row["k"], row["r"], row["hw"]
    groups = c if row["kind"] == "dw" else 1
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.1, (k, c // groups, r, r)).astype("float32")
    b = rng.normal(0, 0.1, (k,)).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y0" if groups > 1 else "y"],
                              kernel_shape=[r, r], pads=[row["pad"]] * 4,
                              strides=[row["stride"]] * 2, group=groups)]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    if groups > 1:
        inits += [numpy_helper.from_array(np.float32(0), "lo"),
                  numpy_helper.from_array(np.float32(6), "hi")]
        nodes.append(helper.make_node("Clip", ["y0", "lo", "hi"], ["y"]))
    g = helper.make_graph(nodes, "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x = rng.uniform(-1, 1, (1, c, hw, hw)).astype("float32")
    return lambda: {"ort_ms": _median_call(lambda: sess.run(None, {"x": x})) * 1e3}


def worker(party: str, only: str | None) -> None:
    """Build every row of one party, then time them all holding the timing lock
    (TSL_TIMING_LOCK), each after a settle pause."""
    from tsl import timing
    from tsl.backends.cpu import host

    threads = host.info().cores
    calls = [build_tsl(row) if party == "tsl" else build_ort(row, threads) for row in rows(only)]
    out = []
    with timing.exclusive():
        for call in calls:
            time.sleep(0.5)
            out.append(call())
    print(json.dumps(out))


def _run(party: str, only: str | None, lock: str | None) -> list:
    import os

    cmd = [sys.executable, __file__, "--worker", party] + (["--only", only] if only else [])
    env = {**os.environ, "TSL_TIMING": "realtime"} | ({"TSL_TIMING_LOCK": lock} if lock else {})
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=("tsl", "ort"))
    ap.add_argument("--only", choices=("resnet", "pw", "dw"))
    ap.add_argument("--lock", help="flock this file around each party's process")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker, a.only)
    tsl_rows, ort_rows = _run("tsl", a.only, a.lock), _run("ort", a.only, a.lock)
    print(f"{'layer':32} {'tsl ms':>8} {'kernel':>8} {'ORT ms':>8} {'vs ORT':>7}  error   knobs")
    tot_t = tot_o = 0.0
    for row, t, o in zip(rows(a.only), tsl_rows, ort_rows):
        tot_t, tot_o = tot_t + t["tsl_ms"], tot_o + o["ort_ms"]
        kern = f"{t['kernel_ms']:8.3f}" if "kernel_ms" in t else f"{'-':>8}"
        print(f"{name(row):32} {t['tsl_ms']:8.3f} {kern} {o['ort_ms']:8.3f} "
              f"{o['ort_ms'] / t['tsl_ms']:6.2f}x  {t['error']:.1e} {t.get('knobs', '')}")
    print(f"{'sum':32} {tot_t:8.3f} {'':8} {tot_o:8.3f} {tot_o / tot_t:6.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows(a.only), "tsl": tsl_rows, "ort": ort_rows}, f, indent=1)


if __name__ == "__main__":
    main()
