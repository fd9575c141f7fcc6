"""Running a quantized model with its VTA layers in the VTA simulator (`run_vta`).

`partition` replaces the int8 chain of every layer that `vta_layers.scan` finds by a call of a
packed function (`call_dps_packed`) that runs the layer's VTA program in the simulator; the
rest of the model (quantize / dequantize, pooling, the float adds and activations) is compiled
for the CPU through `tsl.relax.pipeline("cpu")`. The layers' int8 outputs flow into the CPU
parts and on into the next layers, so the run is the whole network: its logits are compared
bit-exact with the same quantized model compiled for the CPU alone (its int8 path).
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from .vta_layers import scan

_ids = itertools.count()


class VTANetwork:
    """A partitioned model: the CPU executable and, per VTA layer, its artifact and stats."""

    def __init__(self, qmod, machine: str = "vta", classic: bool = False):
        import tvm
        from tvm import relax

        from .. import build
        from ..backends.vta import classic as classic_vta
        from . import pipeline, tvm_target

        fn = relax.transform.ToNonDataflow()(qmod)["main"]
        layers, self.cpu_reasons = scan(fn)
        self.layers, self.cycles, self.seconds = [], [], []
        swap = {}
        for layer in layers:
            art = build(layer.op, machine)
            if classic and classic_vta.knobs(layer.op, art.machine) is not None:
                art = classic_vta.build(layer.op, art.machine)
            name = f"tsl.vta.layer{next(_ids)}"
            tvm.register_global_func(name, self._runner(len(self.layers), art, layer.weights),
                                     override=True)
            self.layers.append((layer, art))
            out = relax.TensorType([int(d) for d in layer.y.ty.shape], "int8")
            swap[layer.y] = relax.call_dps_packed(name, [layer.x], out)
        blocks = [relax.BindingBlock([relax.VarBinding(b.var, swap.get(b.var, b.value))
                                      for b in blk.bindings]) for blk in fn.body.blocks]
        f = relax.Function(fn.params, relax.SeqExpr(blocks, fn.body.body), fn.body.body.ty,
                           attrs=fn.attrs)
        mod = relax.transform.DeadCodeElimination()(tvm.IRModule({"main": f}))
        t = time.perf_counter()
        self.vm = relax.VirtualMachine(tvm.compile(mod, target=tvm_target("cpu"),
                                                   relax_pipeline=pipeline("cpu")), tvm.cpu())
        self.compile_seconds = time.perf_counter() - t

    def _runner(self, i, art, weights):
        def run(x, out):
            t = time.perf_counter()
            out.copyfrom(art.run(x.numpy(), *weights))
            self.seconds[i] = time.perf_counter() - t
        return run

    def __call__(self, x):
        """(outputs, stats): stats has the simulated cycles per VTA layer (the simulator's
        cycle model) and the cost model's prediction (`tsl.model.evaluate`), their totals, the
        simulator's wall time and the whole run's."""
        import tvm

        self.seconds = [0.0] * len(self.layers)
        t = time.perf_counter()
        out = self.vm["main"](tvm.runtime.tensor(np.asarray(x)))
        wall = time.perf_counter() - t
        outs = [o.numpy() for o in out] if not hasattr(out, "numpy") else [out.numpy()]
        from ..model import evaluate

        per = [{"layer": str(layer.op), "cycles": art.estimate().cycles,
                "model_cycles": evaluate(art.schedule).cycles, "sim_s": s}
               for (layer, art), s in zip(self.layers, self.seconds)]
        return outs, {"layers": per, "cycles": sum(p["cycles"] for p in per),
                      "model_cycles": sum(p["model_cycles"] for p in per),
                      "sim_s": sum(self.seconds), "wall_s": wall,
                      "cpu_s": wall - sum(self.seconds), "cpu_reasons": self.cpu_reasons}


def run_vta(qmod, x, machine: str = "vta", classic: bool = False):
    """Run the quantized model `qmod` on input `x` with its int8 layers on VTA (`machine`;
    `classic`: the classic TVM tiles where the table has the layer) -> (outputs, stats)."""
    return VTANetwork(qmod, machine, classic)(x)
