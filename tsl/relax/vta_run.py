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
compiled for the CPU alone (its int8 path). Between consecutive layers the activations stay in
the programs' blocked layout (NCHW1n16c on vta-1x16x16: the block is the machine's), as the
classic flow's graph pack; the simulated cycles of each program include its own DMA of them.
Each layer's stats say which program ran it ("tsl", or "baseline": `Backend.baseline`, the
classic TVM tiles on VTA) and which of its tensors stayed blocked.
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


def _unpadded(art, name: str) -> bool:
    """The program reads input `name` (or writes the output, "out") at the operator's shape
    (no tile padding): such a tensor can stay in the program's blocked layout between
    layers."""
    if name == "out":
        return art.ctx.op.output.shape == art.op.output.shape
    i = [t.name for t in art.op.inputs].index(name)
    return art.ctx.op.inputs[i].shape == art.op.inputs[i].shape


def _runner(layer, art, program: str, blocked: dict):
    """The packed function of one layer. `blocked[name]` (A, residual, out): that tensor
    arrives / leaves in the program's blocked layout (from / to another layer), else NCHW."""
    consts = dict(zip(("B", "bias"), layer.weights))
    names = [t.name for t in art.op.inputs]
    packed = {n: art._pack(i, art._pad(i, art.check_inputs([consts[n]], [art.op.inputs[i]])[0]))
              for i, n in enumerate(names) if n in consts}

    def run(*args):
        *ins, out = args
        t = time.perf_counter()
        given = dict(zip(["A", "residual"], [a.numpy() for a in ins]))
        xs = [packed[n] if n in consts else given[n] if blocked.get(n) else
              art._pack(i, art._pad(i, art.check_inputs([given[n]], [art.op.inputs[i]])[0]))
              for i, n in enumerate(names)]
        y = art.simulate(xs)
        if not blocked.get("out"):
            y = art.unpack_output(y)
        out.copyfrom(np.ascontiguousarray(y))
        if getattr(_trace, "layers", None) is not None:
            _trace.layers.append((layer, art, program, time.perf_counter() - t,
                                  sorted(k for k, v in blocked.items() if v)))
    return run


def _blocked_plan(built) -> list[dict]:
    """Per layer, which of A / residual / out stay blocked: an edge from one layer's output to
    another's input whose layouts and shapes agree and neither side pads."""
    made = {l.y: (k, art) for k, (l, art) in enumerate(built)}
    plan = [{} for _ in built]
    for k, (layer, art) in enumerate(built):
        for name, var in (("A", layer.x), ("residual", layer.residual)):
            src = made.get(var) if var is not None else None
            if src is None or not (_unpadded(art, name) and _unpadded(src[1], "out")):
                continue
            want = art.ctx.layouts[[t.name for t in art.op.inputs].index(name)]
            if want == src[1].out_layout:
                plan[k][name] = True
                plan[src[0]]["out"] = True
    return plan


def _to_nchw(yb, layer, art):
    """Bindings of the NCHW var `layer.y` from its blocked var `yb` (for the CPU's users)."""
    from tvm import relax

    lay, shape = art.out_layout, [int(d) for d in layer.y.ty.shape]
    names = [(d, p) for d in range(len(shape)) for p in (("o", "i") if d in lay.blocks
                                                          else ("o",))]
    perm = [lay.order.index(nm) for nm in names]
    split = [int(art.out_layout.shape(shape)[i]) for i in perm]
    t = relax.Var(f"{layer.y.name}_t", relax.TensorType(split, "int8"))
    return [relax.VarBinding(t, relax.op.permute_dims(yb, perm)),
            relax.VarBinding(layer.y, relax.op.reshape(t, shape))]


def _program(op, machine, baseline: bool):
    """The layer's program: tsl's (cached per shape) or, with `baseline`, the back end's
    baseline (`Backend.baseline`) where it has one."""
    from ..backend import get_backend
    from .swap import _build

    art = _build(op, machine, None)
    base = get_backend(machine.backend).baseline(op, art.machine) if baseline else None
    return (base, "baseline") if base is not None else (art, "tsl")


def partition(qmod, machine, baseline: bool = False) -> Partition:
    """`qmod` with each VTA layer a call of its program on `machine` (see the module doc);
    between consecutive layers the activations stay in the programs' blocked layout
    (`_blocked_plan`), converted to NCHW only where the CPU reads them."""
    import tvm
    from tvm import relax

    from .targets import machine_for

    machine = machine_for(machine)
    fn = relax.transform.ToNonDataflow()(qmod)["main"]
    layers, why = scan(fn)
    built = [(layer, *_program(layer.op, machine, baseline)) for layer in layers]
    plan = _blocked_plan([(l, a) for l, a, _ in built])
    swap, blocked_var = {}, {}
    for (layer, art, program), blocked in zip(built, plan):
        name = f"tsl.offload.layer{next(_ids)}"
        tvm.register_global_func(name, _runner(layer, art, program, blocked), override=True)
        args = [blocked_var[v] if blocked.get(n) else v
                for n, v in (("A", layer.x), ("residual", layer.residual)) if v is not None]
        if blocked.get("out"):
            shape = [int(d) for d in art.out_layout.shape(art.op.output.shape)]
            yb = relax.Var(f"{layer.y.name}_blocked", relax.TensorType(shape, "int8"))
            blocked_var[layer.y] = yb
            swap[layer.y] = [relax.VarBinding(yb, relax.call_dps_packed(
                name, args, relax.TensorType(shape, "int8")))] + _to_nchw(yb, layer, art)
        else:
            out = relax.TensorType([int(d) for d in layer.y.ty.shape], "int8")
            swap[layer.y] = [relax.VarBinding(layer.y, relax.call_dps_packed(name, args, out))]
    blocks = [relax.BindingBlock([nb for b in blk.bindings for nb in swap.get(b.var, [b])])
              for blk in fn.body.blocks]
    f = relax.Function(fn.params, relax.SeqExpr(blocks, fn.body.body), fn.body.body.ty,
                       attrs=fn.attrs)
    mod = relax.transform.DeadCodeElimination()(tvm.IRModule({"main": f}))
    return Partition(mod, [(l, a) for l, a, _ in built], why)


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

    per = [{"layer": str(layer.op), "program": program, "cycles": art.estimate().cycles,
            "model_cycles": evaluate(art.schedule).cycles, "sim_s": s, "blocked": blocked}
           for layer, art, program, s, blocked in ran]
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
