"""Running a quantized model with its int8 layers on a back end that runs them as calls of its
own programs in a simulator (the VTA back end: `Backend.relax_offload`), the rest on the host.

`partition` replaces the int8 chain of every layer that `vta_layers.scan` finds (conv2d / dense,
bias, relu, shifts, the residual add, the clip to int8) by a call of a packed function
(`call_dps_packed`) that runs the layer's program in the simulator; the rest of the model
(quantize / dequantize at the edges, pooling, the float parts) is compiled for the CPU through
`tsl.relax.pipeline` of the host. So

    ex = tvm.compile(qmod, target=tsl.relax.tvm_target("vta"),
                     relax_pipeline=tsl.relax.pipeline("vta"))
    y, stats = tsl.relax.run_vta(ex, x)

runs the whole network; its logits are compared bit-exact with the same quantized model
compiled for the CPU alone (its int8 path).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

import numpy as np

from .vta_layers import scan

_ids = itertools.count()
_trace = threading.local()  # the layers run by the current `run_vta` call


@dataclass
class Partition:
    """A model with its layers as calls of their programs: the Relax module for the host, the
    (layer, artifact) of each call, and why the other conv2d / matmul calls stay on the CPU."""
    mod: object
    layers: list
    cpu_reasons: list


def _runner(layer, art):
    def run(*args):
        *ins, out = args
        t = time.perf_counter()
        x, res = ins[0].numpy(), ins[1].numpy() if len(ins) > 1 else None
        out.copyfrom(art.run(*layer.args(x, res)))
        if getattr(_trace, "layers", None) is not None:
            _trace.layers.append((layer, art, time.perf_counter() - t))
    return run


def _program(op, machine, baseline: bool):
    """The layer's program: tsl's (cached per shape) or, with `baseline`, the back end's
    baseline (`Backend.baseline`) where it has one."""
    from ..backend import get_backend
    from .swap import _build

    art = _build(op, machine, None)
    if baseline:
        art = get_backend(machine.backend).baseline(op, art.machine) or art
    return art


def partition(qmod, machine, baseline: bool = False) -> Partition:
    """`qmod` with each VTA layer a call of its program on `machine` (see the module doc)."""
    import tvm
    from tvm import relax

    from .targets import machine_for

    machine = machine_for(machine)
    fn = relax.transform.ToNonDataflow()(qmod)["main"]
    layers, why = scan(fn)
    swap, built = {}, []
    for layer in layers:
        art = _program(layer.op, machine, baseline)
        name = f"tsl.offload.layer{next(_ids)}"
        tvm.register_global_func(name, _runner(layer, art), override=True)
        built.append((layer, art))
        out = relax.TensorType([int(d) for d in layer.y.ty.shape], "int8")
        args = [layer.x] + ([layer.residual] if layer.residual is not None else [])
        swap[layer.y] = relax.call_dps_packed(name, args, out)
    blocks = [relax.BindingBlock([relax.VarBinding(b.var, swap.get(b.var, b.value))
                                  for b in blk.bindings]) for blk in fn.body.blocks]
    f = relax.Function(fn.params, relax.SeqExpr(blocks, fn.body.body), fn.body.body.ty,
                       attrs=fn.attrs)
    mod = relax.transform.DeadCodeElimination()(tvm.IRModule({"main": f}))
    return Partition(mod, built, why)


def offload_pipeline(machine, baseline: bool = False, reports: list | None = None):
    """The Relax pipeline for `machine`: `partition`, then the host CPU's pipeline.
    `reports` receives the `Partition`."""
    import tvm

    from . import pipeline
    from ..backend import get_backend

    host = get_backend(machine.backend).tvm_target(machine)

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.offload")
    def _offload(mod, _ctx):
        part = partition(mod, machine, baseline)
        if reports is not None:
            reports.append(part)
        return pipeline(host)(part.mod)

    return _offload


@dataclass
class OffloadReport:
    """Which calls of a quantized model go to the back end's programs and which stay on the
    host CPU, and why (`tsl.relax.report(mod, "vta")`)."""
    machine: str
    layers: list  # str of each offloaded layer's operator
    cpu: list  # (what, why) of every call left to the CPU

    def __str__(self) -> str:
        head = (f"tsl.relax on {self.machine}: {len(self.layers)} layer(s) to "
                f"{self.machine}, {len(self.cpu)} kind(s) of call on the CPU")
        return "\n".join([head] + [f"  {self.machine}  {l}" for l in self.layers]
                         + [f"  cpu  {w}: {why}" for w, why in self.cpu])


def offload_report(qmod, machine) -> OffloadReport:
    """The `OffloadReport` of `qmod` for `machine` (nothing is built)."""
    from tvm import relax

    from .quantize import _graph
    from .targets import machine_for

    machine = machine_for(machine)
    fn = relax.transform.ToNonDataflow()(qmod)["main"]
    layers, why = scan(fn)
    inside = {v for l in layers for v in l.vars}
    cores = ("relax.nn.conv2d", "relax.matmul")
    left: dict = {}
    for var, c in _graph(fn)[0].items():
        if var not in inside and c.op.name not in cores:
            left[c.op.name] = left.get(c.op.name, 0) + 1
    cpu = [(r.split(":")[0], r.split(":", 1)[1].strip() + " -> cpu") for r in why]
    cpu += [(f"{name.removeprefix('relax.')} x{n}",
             f"not in the {machine.name} ISA's layers (conv2d / dense + ALU epilogue) -> cpu")
            for name, n in sorted(left.items())]
    return OffloadReport(machine.name, [str(l.op) for l in layers], cpu)


def _stats(ran, wall) -> dict:
    from ..model import evaluate

    per = [{"layer": str(layer.op), "cycles": art.estimate().cycles,
            "model_cycles": evaluate(art.schedule).cycles, "sim_s": s}
           for layer, art, s in ran]
    sim = sum(p["sim_s"] for p in per)
    return {"layers": per, "cycles": sum(p["cycles"] for p in per),
            "model_cycles": sum(p["model_cycles"] for p in per), "sim_s": sim,
            "wall_s": wall, "cpu_s": wall - sim}


def run_vta(ex, x, machine: str = "vta", classic: bool = False):
    """Run a model on input `x` with its int8 layers in the simulator -> (outputs, stats).

    `ex`: what `tvm.compile(qmod, target=tvm_target(m), relax_pipeline=pipeline(m))` gave, or
    the quantized module itself (compiled here for `machine`; `classic`: the back end's
    baseline programs, the classic TVM tiles, where it has them). stats: simulated cycles per
    layer and the cost model's (`tsl.model.evaluate`), their totals, simulator and CPU time."""
    import tvm
    from tvm import relax

    from .targets import machine_for, tvm_target

    if isinstance(ex, tvm.IRModule):
        ex = tvm.compile(ex, target=tvm_target(machine),
                         relax_pipeline=offload_pipeline(machine_for(machine), classic))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    _trace.layers = []
    try:
        t = time.perf_counter()
        out = vm["main"](tvm.runtime.tensor(np.asarray(x)))
        wall = time.perf_counter() - t
        ran = _trace.layers
    finally:
        _trace.layers = None
    outs = [o.numpy() for o in out] if not hasattr(out, "numpy") else [out.numpy()]
    return outs, _stats(ran, wall)
