"""Whole models through `tsl.relax`, timed: ResNet-18 and a BERT-base encoder layer
(`tsl.relax.models`).

`python -m tsl.bench --models` compiles each model twice with `tvm.compile` (TVM's default
Relax pipeline, and `tsl.relax.pipeline`: the same with tsl's kernels swapped in), checks both
against each other and against PyTorch eager with the same weights (when torch is importable),
and times the three alternately (medians of rounds: this shared machine's speed drifts).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..relax.models import bert_layer, export, resnet18, resnet18_int8, torch_forward
from ..timing import realtime

SETTLE_SECONDS = 1.0


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
    ex = tvm.compile(mod, target=tgt, relax_pipeline=pipe,
                     tir_pipeline=tsl_relax.tir_pipeline(target) if use_tsl else "default")
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
