"""Whole models through `tsl.relax`: ResNet-18 and a BERT-base encoder layer.

`python -m tsl.bench --models` compiles each model twice with `tvm.compile` (TVM's default
Relax pipeline, and `tsl.relax.pipeline`: the same with tsl's kernels swapped in), checks both
against each other and against PyTorch eager with the same weights (when torch is importable),
and times the three alternately (medians of rounds: this shared machine's speed drifts).

The models are written with `tvm.relax.frontend.nn` (no extra dependency); their PyTorch twins
(`torch_forward`) read the same weight arrays. BatchNorm is folded into the convolutions' bias,
as inference compilers do. `small=True` gives the same architectures, narrow and short, for the
tests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..timing import realtime

# ResNet-18: (channels, first stride) of the four stages, two basic blocks each.
RESNET_STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))
RESNET_SMALL = dict(width=8, image=32, classes=10)
RESNET_FULL = dict(width=64, image=224, classes=1000)
BERT_FULL = dict(seq=128, hidden=768, heads=12, ffn=3072)
BERT_SMALL = dict(seq=16, hidden=64, heads=2, ffn=128)
SETTLE_SECONDS = 1.0


def _nn():
    from tvm.relax.frontend import nn

    return nn


# -- ResNet-18 ---------------------------------------------------------------------------------
def _conv_module(nn):
    from tvm import relax

    class Conv(nn.Module):
        """conv2d + bias; NCHW with OIHW weights or NHWC with HWIO weights (what tsl's NHWC
        conv takes: input channels before output channels)."""

        def __init__(self, cin, cout, k, stride=1, padding=0, layout="NCHW", dtype="float32"):
            self.stride, self.padding, self.layout = stride, padding, layout
            shape = (cout, cin, k, k) if layout == "NCHW" else (k, k, cin, cout)
            self.weight = nn.Parameter(shape, dtype)
            self.bias = nn.Parameter((cout,), dtype)

        def forward(self, x):
            y = relax.op.nn.conv2d(x._expr, self.weight._expr, strides=self.stride,
                                   padding=self.padding, data_layout=self.layout,
                                   kernel_layout="OIHW" if self.layout == "NCHW" else "HWIO")
            b = relax.op.reshape(self.bias._expr,
                                 (1, -1, 1, 1) if self.layout == "NCHW" else (1, 1, 1, -1))
            return nn.wrap_nested(relax.op.add(y, b), "conv")
    return Conv


def resnet18(small: bool = False, layout: str = "NCHW", dtype: str = "float32"):
    """ResNet-18 (batch 1) as a `relax.frontend.nn` module and its input shape."""
    from tvm import relax

    nn = _nn()
    Conv = _conv_module(nn)
    cfg = RESNET_SMALL if small else RESNET_FULL
    w, chan = cfg["width"], 1 if layout == "NCHW" else 3
    kw = dict(layout=layout, dtype=dtype)

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            self.conv1 = Conv(cin, cout, 3, stride, 1, **kw)
            self.conv2 = Conv(cout, cout, 3, 1, 1, **kw)
            self.down = Conv(cin, cout, 1, stride, 0, **kw) if stride != 1 or cin != cout else None

        def forward(self, x):
            y = self.conv2(nn.relu(self.conv1(x)))
            return nn.relu(y + (self.down(x) if self.down is not None else x))

    class ResNet18(nn.Module):
        def __init__(self):
            self.conv1 = Conv(3, w, 7, 2, 3, **kw)
            blocks, cin = [], w
            for c, s in RESNET_STAGES:
                c = c * w // 64
                blocks += [Block(cin, c, s), Block(c, c, 1)]
                cin = c
            self.blocks = nn.ModuleList(blocks)
            self.fc = nn.Linear(cin, cfg["classes"], dtype=dtype)

        def forward(self, x):
            y = nn.relu(self.conv1(x))
            y = nn.wrap_nested(relax.op.nn.max_pool2d(y._expr, 3, 2, 1, layout=layout), "pool")
            for b in self.blocks:
                y = b(y)
            hw = [2, 3] if layout == "NCHW" else [1, 2]
            y = nn.wrap_nested(relax.op.mean(y._expr, hw), "gap")
            return self.fc(y)

    shape = (1, 3, cfg["image"], cfg["image"]) if chan == 1 else (1, cfg["image"], cfg["image"], 3)
    return ResNet18(), shape


# -- BERT-base encoder layer -------------------------------------------------------------------
def bert_layer(small: bool = False, dtype: str = "float32"):
    """One BERT-base encoder layer (post-LayerNorm, GELU) at batch 1 and its input shape."""
    nn = _nn()
    cfg = BERT_SMALL if small else BERT_FULL
    s, h, heads, f = cfg["seq"], cfg["hidden"], cfg["heads"], cfg["ffn"]
    d = h // heads

    class BertLayer(nn.Module):
        def __init__(self):
            self.q, self.k, self.v = (nn.Linear(h, h, dtype=dtype) for _ in range(3))
            self.o = nn.Linear(h, h, dtype=dtype)
            self.ln1 = nn.LayerNorm(h, eps=1e-12, dtype=dtype)
            self.ff1 = nn.Linear(h, f, dtype=dtype)
            self.ff2 = nn.Linear(f, h, dtype=dtype)
            self.ln2 = nn.LayerNorm(h, eps=1e-12, dtype=dtype)

        def forward(self, x):
            def heads_of(t):
                return nn.op.permute_dims(nn.op.reshape(t, (1, s, heads, d)), (0, 2, 1, 3))

            q, k, v = heads_of(self.q(x)), heads_of(self.k(x)), heads_of(self.v(x))
            scores = nn.op.matmul(q, nn.op.permute_dims(k, (0, 1, 3, 2))) / float(np.sqrt(d))
            ctx = nn.op.matmul(nn.op.softmax(scores, axis=-1), v)
            ctx = nn.op.reshape(nn.op.permute_dims(ctx, (0, 2, 1, 3)), (1, s, h))
            x = self.ln1(x + self.o(ctx))
            return self.ln2(x + self.ff2(nn.op.gelu(self.ff1(x))))

    return BertLayer(), (1, s, h)


# -- weights, export, PyTorch twins ------------------------------------------------------------
def random_weights(params, seed: int = 0, layout: str = "NCHW") -> dict:
    """He-scaled random weights (so activations stay O(1) through 18 layers), small biases,
    LayerNorm scales near 1. Conv weights are OIHW for NCHW models, HWIO for NHWC ones."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, p in params:
        shape = tuple(int(x) for x in p.shape)
        if name.endswith("bias"):
            w = rng.uniform(-0.1, 0.1, shape)
        elif name.startswith("ln"):
            w = 1 + rng.uniform(-0.1, 0.1, shape)
        else:
            fan_in = (shape[-1] if len(shape) == 2 else
                      int(np.prod(shape[1:] if layout == "NCHW" else shape[:3])))
            w = rng.normal(0, np.sqrt(2.0 / fan_in), shape)
        out[name] = w.astype(str(p.dtype))
    return out


def export(model, shape, dtype: str = "float32", seed: int = 0, layout: str = "NCHW"):
    """(Relax module with the weights bound as constants, weights, one input)."""
    import tvm
    from tvm import relax

    nn = _nn()
    mod, params = model.export_tvm({"forward": {"x": nn.spec.Tensor(shape, dtype)}})
    weights = random_weights(params, seed, layout)
    mod = relax.transform.BindParams("forward", {k: tvm.runtime.tensor(v)
                                                 for k, v in weights.items()})(mod)
    x = np.random.default_rng(seed + 1).uniform(-1, 1, shape).astype(dtype)
    return mod, weights, x


def torch_forward(name: str, weights: dict, small: bool = False):
    """The PyTorch eager twin of model `name` ("resnet18" / "bert") on the same weights (NCHW,
    float32): a function of one torch tensor."""
    import torch
    import torch.nn.functional as F

    W = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()}
    if name == "resnet18":
        def conv(p, x, stride, pad):
            return F.conv2d(x, W[p + ".weight"], W[p + ".bias"], stride, pad)

        def fwd(x):
            y = F.max_pool2d(F.relu(conv("conv1", x, 2, 3)), 3, 2, 1)
            i = 0
            for c, s in RESNET_STAGES:
                for stride in (s, 1):
                    p = f"blocks.{i}"
                    r = conv(p + ".down", y, stride, 0) if p + ".down.weight" in W else y
                    z = conv(p + ".conv2", F.relu(conv(p + ".conv1", y, stride, 1)), 1, 1)
                    y = F.relu(z + r)
                    i += 1
            return F.linear(y.mean((2, 3)), W["fc.weight"], W["fc.bias"])
        return fwd
    cfg = BERT_SMALL if small else BERT_FULL
    s, h, heads = cfg["seq"], cfg["hidden"], cfg["heads"]
    d = h // heads

    def lin(p, x):
        return F.linear(x, W[p + ".weight"], W[p + ".bias"])

    def fwd(x):
        def split(t):
            return t.reshape(1, s, heads, d).permute(0, 2, 1, 3)
        q, k, v = split(lin("q", x)), split(lin("k", x)), split(lin("v", x))
        p = torch.softmax(q @ k.transpose(-1, -2) / float(np.sqrt(d)), -1)
        ctx = (p @ v).permute(0, 2, 1, 3).reshape(1, s, h)
        x = F.layer_norm(x + lin("o", ctx), (h,), W["ln1.weight"], W["ln1.bias"], 1e-12)
        return F.layer_norm(x + lin("ff2", F.gelu(lin("ff1", x))), (h,), W["ln2.weight"],
                            W["ln2.bias"], 1e-12)
    return fwd


# -- compile, run, time ------------------------------------------------------------------------
@dataclass
class Compiled:
    vm: object
    seconds: float  # compile time
    report: object = None  # tsl.relax.Report (tsl's pipeline only)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        import tvm

        return self.vm["forward"](tvm.runtime.tensor(x)).numpy()

    def time(self, x: np.ndarray, repeat: int = 3) -> float:
        """Median seconds of one inference; calls per measurement chosen so that one lasts
        about 0.2 s (TVM's unscheduled default pipeline takes seconds per inference)."""
        import tvm

        dev, xt = tvm.cpu(), tvm.runtime.tensor(x)
        once = float(self.vm.time_evaluator("forward", dev, number=1, repeat=1)(xt).mean)
        number = max(1, min(20, int(0.2 / max(once, 1e-6))))
        if once > 1.0:
            return once
        f = self.vm.time_evaluator("forward", dev, number=number, repeat=repeat)
        with realtime():
            return float(f(xt).median)


def compile_model(mod, target="cpu", use_tsl: bool = True, database=None) -> Compiled:
    """`tvm.compile` for `target`'s TVM target, with tsl's pipeline or TVM's default one."""
    import tvm
    from tvm import relax

    from .. import relax as tsl_relax

    tgt = tsl_relax.tvm_target(target)
    reports = []
    t0 = time.perf_counter()
    pipe = tsl_relax.pipeline(target, database, reports) if use_tsl else "default"
    ex = tvm.compile(mod, target=tgt, relax_pipeline=pipe)
    secs = time.perf_counter() - t0
    vm = relax.VirtualMachine(ex, tvm.cpu()) if tgt.kind.name == "llvm" else ex
    return Compiled(vm, secs, reports[-1] if reports else None)


def _rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run_model(name: str, small: bool = False, rounds: int = 3, progress=print) -> dict:
    """Compile `name` with TVM's and tsl's pipelines for the host CPU, check the outputs, time
    tsl / TVM / PyTorch alternately for `rounds` rounds and report the medians."""
    from ..backends.cpu.runtime import set_threads
    from .. import relax as tsl_relax

    model, shape = resnet18(small) if name == "resnet18" else bert_layer(small)
    mod, weights, x = export(model, shape)
    machine = tsl_relax.machine_for("cpu")
    set_threads(machine.cores())
    progress(f"[models] {name}: compiling with TVM's default pipeline ...")
    tvm_c = compile_model(mod, "cpu", use_tsl=False)
    progress(f"[models] {name}: compiling with tsl.relax.pipeline ...")
    tsl_c = compile_model(mod, "cpu", use_tsl=True)
    y_tvm, y_tsl = tvm_c(x), tsl_c(x)
    row = {"model": name + (" (small)" if small else ""), "machine": machine.name,
           "tsl_calls": len(tsl_c.report.taken), "tvm_calls": len(tsl_c.report.left),
           "compile_tsl_s": round(tsl_c.seconds, 1), "compile_tvm_s": round(tvm_c.seconds, 1),
           "err_vs_tvm": _rel_err(y_tsl, y_tvm), "report": str(tsl_c.report)}
    timers = {"tsl": lambda: tsl_c.time(x), "tvm": lambda: tvm_c.time(x)}
    try:
        import torch
    except ImportError:
        row["torch"] = "not installed (pip install torch): no PyTorch column"
    else:
        torch.set_num_threads(machine.cores())
        fwd = torch_forward(name, weights, small)
        xt = torch.from_numpy(x)
        with torch.inference_mode():
            row["err_vs_torch"] = _rel_err(y_tsl, fwd(xt).numpy())

        def torch_time(reps: int = 5) -> float:
            with torch.inference_mode(), realtime():
                fwd(xt)
                ts = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    fwd(xt)
                    ts.append(time.perf_counter() - t0)
            return float(np.median(ts))
        timers["torch"] = torch_time
    progress(f"[models] {name}: timing {', '.join(timers)} alternately, {rounds} rounds ...")
    times = {k: [] for k in timers}
    for _ in range(rounds):
        for k, f in timers.items():
            # The previous runner's worker threads spin on for a while after its last call;
            # on 2 cores they would slow the next one.
            time.sleep(SETTLE_SECONDS)
            times[k].append(f())
    for k, v in times.items():
        row[f"{k}_ms"] = 1e3 * float(np.median(v))
    if "torch_ms" in row:
        row["tsl_vs_torch"] = row["torch_ms"] / row["tsl_ms"]
    row["tsl_vs_tvm"] = row["tvm_ms"] / row["tsl_ms"]
    return row


def format_row(r: dict) -> str:
    torch_part = (f"torch {r['torch_ms']:.2f} ms, tsl {r['tsl_vs_torch']:.2f}x torch, "
                  f"err vs torch {r['err_vs_torch']:.1e}" if "torch_ms" in r else r["torch"])
    return (f"{r['model']:<18} {r['machine']}: tsl {r['tsl_ms']:.2f} ms | TVM default "
            f"{r['tvm_ms']:.2f} ms ({r['tsl_vs_tvm']:.2f}x) | {torch_part} | err vs TVM "
            f"{r['err_vs_tvm']:.1e} | compile tsl {r['compile_tsl_s']} s, TVM "
            f"{r['compile_tvm_s']} s | {r['tsl_calls']} functions to tsl, {r['tvm_calls']} "
            f"GEMM/conv left to TVM")


# -- int8 ResNet-18 ----------------------------------------------------------------------------
def resnet18_int8(small: bool = False, seed: int = 0):
    """An int8 ResNet-18 as VTA runs it (Relax module with constant weights, one input): every
    conv is int8 x int8 -> int32, + bias, (relu), >> shift, clip to [-128, 127], -> int8; a
    residual is added in int32 before the clip. The classifier returns int32 logits."""
    from tvm import relax

    cfg = RESNET_SMALL if small else RESNET_FULL
    w, img = cfg["width"], cfg["image"]
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, img, img), "int8"))

    def requant(acc, shift, relu=False, residual=None):
        if relu and residual is None:
            acc = bb.emit(relax.op.nn.relu(acc))
        acc = bb.emit(relax.op.right_shift(acc, relax.const(shift, "int32")))
        if residual is not None:  # added at the output's scale, then relu
            acc = bb.emit(relax.op.add(acc, relax.op.astype(residual, "int32")))
            acc = bb.emit(relax.op.nn.relu(acc)) if relu else acc
        return bb.emit(relax.op.astype(relax.op.clip(acc, -128, 127), "int8"))

    def conv(t, cin, cout, k, stride, pad):
        wt = rng.integers(-64, 65, (cout, cin, k, k), dtype=np.int8)
        b = rng.integers(-512, 513, (1, cout, 1, 1), dtype=np.int32)
        y = bb.emit(relax.op.nn.conv2d(t, relax.const(wt), strides=stride, padding=pad,
                                       out_dtype="int32"))
        # Shift so that the int8 result uses its range: |acc| ~ sqrt(fan_in) * 40 * 40.
        shift = int(round(np.log2(np.sqrt(cin * k * k) * 40)))
        return bb.emit(relax.op.add(y, relax.const(b))), shift

    with bb.function("forward", [x]):
        with bb.dataflow():
            y, s = conv(x, 3, w, 7, 2, 3)
            y = requant(y, s, relu=True)
            y = bb.emit(relax.op.nn.max_pool2d(y, 3, 2, 1))
            cin = w
            for c, st in RESNET_STAGES:
                c = c * w // 64
                for stride in (st, 1):
                    h, s1 = conv(y, cin, c, 3, stride, 1)
                    h = requant(h, s1, relu=True)
                    h, s2 = conv(h, c, c, 3, 1, 1)
                    r = y
                    if stride != 1 or cin != c:
                        r, s3 = conv(y, cin, c, 1, stride, 0)
                        r = requant(r, s3)
                    y = requant(h, s2, relu=True, residual=r)
                    cin = c
            side = int(y.ty.shape[2])
            pooled = bb.emit(relax.op.sum(relax.op.astype(y, "int32"), [2, 3]))
            pooled = bb.emit(relax.op.astype(relax.op.clip(relax.op.right_shift(
                pooled, relax.const(int(np.log2(side * side)), "int32")), -128, 127), "int8"))
            fc = rng.integers(-64, 65, (cin, cfg["classes"]), dtype=np.int8)
            out = bb.emit(relax.op.matmul(pooled, relax.const(fc), out_dtype="int32"))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    xin = rng.integers(-128, 128, (1, 3, img, img), dtype=np.int8)
    return bb.get(), xin


def run_int8(small: bool = False, progress=print) -> dict:
    """int8 ResNet-18 through tsl's pipeline and TVM's: the logits must be equal exactly."""
    from ..backends.cpu.runtime import set_threads
    from .. import relax as tsl_relax

    mod, x = resnet18_int8(small)
    set_threads(tsl_relax.machine_for("cpu").cores())
    progress("[models] resnet18 int8: compiling with TVM's and tsl's pipelines ...")
    tvm_c, tsl_c = compile_model(mod, "cpu", use_tsl=False), compile_model(mod, "cpu")
    a, b = tsl_c(x), tvm_c(x)
    return {"model": "resnet18 int8" + (" (small)" if small else ""),
            "exact": bool(np.array_equal(a, b)), "max_abs_diff": int(np.abs(
                a.astype(np.int64) - b.astype(np.int64)).max()),
            "logit_range": (int(b.min()), int(b.max())),
            "tsl_calls": len(tsl_c.report.taken), "tvm_calls": len(tsl_c.report.left),
            "compile_tsl_s": round(tsl_c.seconds, 1), "tsl_ms": 1e3 * tsl_c.time(x),
            "tvm_ms": 1e3 * tvm_c.time(x), "report": str(tsl_c.report)}


# -- Tensor Cores (compile only without a GPU) -------------------------------------------------
def compile_tensorcore(name: str, small: bool = False, arch: str = "sm_90") -> dict:
    """`name` in float16 (ResNet-18 in NHWC: tsl's Tensor Core conv takes NHWC) compiled by
    `tvm.compile` for cuda with `arch` through tsl's pipeline: which calls were swapped."""
    import tvm

    from .. import relax as tsl_relax

    if name == "resnet18":
        model, shape = resnet18(small, layout="NHWC", dtype="float16")
        mod = export(model, shape, "float16", layout="NHWC")[0]
    else:
        model, shape = bert_layer(small, dtype="float16")
        mod = export(model, shape, "float16")[0]
    target = tvm.target.Target({"kind": "cuda", "arch": arch}, host={"kind": "llvm"})
    c = compile_model(mod, target)
    return {"model": f"{name} fp16" + (" (small)" if small else ""), "target": f"cuda {arch}",
            "machine": c.report.machine, "tsl_calls": len(c.report.taken),
            "tvm_calls": len(c.report.left), "compile_s": round(c.seconds, 1),
            "executable": type(c.vm).__name__, "report": str(c.report)}


def main(small: bool = False, json_path: str | None = None) -> int:
    """`python -m tsl.bench --models`: every model row, printed; 1 when a check fails."""
    import json
    import sys

    def progress(msg):
        print(msg, file=sys.stderr, flush=True)

    rows, ok = [], True
    for name in ("resnet18", "bert"):
        r = run_model(name, small, progress=progress)
        print(r["report"])
        print(format_row(r))
        ok &= r["err_vs_tvm"] < 1e-5 and r.get("err_vs_torch", 0) < 1e-4
        rows.append(r)
    r = run_int8(small, progress=progress)
    print(f"{r['model']:<18} exact vs TVM: {r['exact']} (max |diff| {r['max_abs_diff']}, logits "
          f"{r['logit_range']}) | tsl {r['tsl_ms']:.2f} ms, TVM default {r['tvm_ms']:.2f} ms | "
          f"compile {r['compile_tsl_s']} s | {r['tsl_calls']} functions to tsl, "
          f"{r['tvm_calls']} left")
    ok &= r["exact"]
    rows.append(r)
    for name in ("resnet18", "bert"):
        progress(f"[models] {name} fp16: compiling for cuda sm_90 ...")
        r = compile_tensorcore(name, small)
        print(f"{r['model']:<18} {r['target']} ({r['machine']}): compiled in {r['compile_s']} s "
              f"({r['executable']}), {r['tsl_calls']} functions to tsl, {r['tvm_calls']} left "
              f"to TVM; not run (compile only)")
        ok &= r["tsl_calls"] > 0
        rows.append(r)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0 if ok else 1
