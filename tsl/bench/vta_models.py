"""`python -m tsl.bench --models --targets vta-...`: whole networks on VTA. ResNet-18 (torchvision's
architecture, seeded random weights and batch-norm statistics: no download) imported through
torch.export + TVM's torch frontend, quantized with `tsl.relax.quantize` (power-of-two scales
calibrated on seeded random images), then run with `tsl.relax.run_vta`: tsl's VTA programs and
the classic TVM tiles for the same layers, both checked bit-exact against the CPU int8 path.
The residual adds and relus run on VTA's ALU in the convs' epilogues; the first conv stays in
float as in the classic flow (`row(..., skip_first=False)` puts it on VTA too). A machine
without classic tiles (vta-1x32x32: they were published for 16-wide blocks) has no
classic_cycles / speedup."""

from __future__ import annotations

import time

import numpy as np


def resnet18(hw: int = 224):
    """(float Relax module, calibration inputs) of a seeded torchvision ResNet-18."""
    import torch
    import torchvision
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None).eval()
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    cal = [np.random.default_rng(i).standard_normal((1, 3, hw, hw), np.float32) for i in range(2)]
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(net, (torch.tensor(cal[0]),)))
    return mod, cal


def row(model: str, target: str, hw: int = 224, skip_first: bool = True) -> dict:
    """One `--models` row for `model` on VTA machine `target`."""
    import tvm
    from tvm import relax

    import tsl.relax

    mod, cal = {"torchvision_resnet18": resnet18}[model](hw)
    q = tsl.relax.quantize(mod, calibration=cal, skip_first=skip_first)
    x = cal[-1]
    t = time.perf_counter()
    ex = tvm.compile(q, target=tsl.relax.tvm_target(target),
                     relax_pipeline=tsl.relax.pipeline(target))
    compile_s = time.perf_counter() - t
    (got,), stats = tsl.relax.run_vta(ex, x)
    (bgot,), bstats = tsl.relax.run_vta(q, x, target, classic=True)
    ex = tvm.compile(q, target=tsl.relax.tvm_target("cpu"),
                     relax_pipeline=tsl.relax.pipeline("cpu"),
                     tir_pipeline=tsl.relax.tir_pipeline("cpu"))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    want = (out[0] if not hasattr(out, "numpy") else out).numpy()
    exact = bool(np.array_equal(got, want) and np.array_equal(bgot, want))
    # No layer with a classic program (its tiles were published for 16-wide blocks only):
    # no baseline to compare with.
    has_base = any(p["program"] == "baseline" for p in bstats["layers"])
    base = bstats["cycles"] if has_base else None
    return {"model": model, "target": target, "exact": exact,
            "vta_layers": len(stats["layers"]), "cycles": stats["cycles"],
            "classic_cycles": base, "speedup": base / stats["cycles"] if base else None,
            "classic_layers": sum(p["program"] == "baseline" for p in bstats["layers"]),
            "model_cycles": stats["model_cycles"], "cpu_ms": 1e3 * stats["cpu_s"],
            "sim_s": stats["sim_s"], "compile_s": compile_s}


def main(targets: list[str], json_path: str | None = None, models=("torchvision_resnet18",)) -> int:
    """Print (and with `json_path` write) one row per model and VTA target."""
    import json

    from ..backend import resolve_target

    for t in targets:
        if resolve_target(t)[0].name != "vta":
            raise SystemExit(f"--models --targets {t}: whole-network rows run on VTA machines "
                             "(vta-1x16x16, vta-1x32x32); drop --targets for the CPU models")
    out = []
    for m in models:
        for t in targets:
            r = row(m, t)
            out.append(r)
            vs = (f"classic={r['classic_cycles']:,} speedup={r['speedup']:.2f}x"
                  if r["speedup"] else "classic=(no classic tiles for this machine)")
            print(f"{m:20s} {t:12s} exact={r['exact']} cycles={r['cycles']:,} {vs} "
                  f"model={r['model_cycles']:,} cpu={r['cpu_ms']:.1f} ms "
                  f"sim={r['sim_s']:.1f} s compile={r['compile_s']:.1f} s", flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if all(r["exact"] for r in out) else 1
