"""How far tsl's VTA programs of a network are from the fastest the ISA allows, layer by layer.

    python benchmarks/vta_network_bound.py [--target vta-1x16x16] [--hw 224]

For the int8 ResNet-18 of `python -m tsl.bench --models` (tsl/bench/vta_models.py, the same
partition: the first conv in float on the CPU), per VTA layer: tsl's and the classic tiles'
simulated cycles, the compute module's busy cycles, its GEMM / reset / ALU uops, and two floors
on the cycles of ANY program of the layer. VTA's compute module runs LOAD UOP, LOAD ACC, GEMM
and ALU in program order, one at a time (docs/vta.md §4), so its busy cycles bound a program
from below:

- every multiply-accumulate uop (MACs / 256: ResNet-18's channels are multiples of 16, nothing
  is padded) takes gemm_ii; every output entry (1 x 16 int32) is started once (a reset uop, or
  zero padding of a LOAD ACC: one entry per cycle; a LOAD of its bias: 64 B at 8 B/cycle) and
  goes through SHR, MAX and MIN on the ALU (alu_ii each: one entry per ALU uop; the STORE only
  truncates, and the `clip range` column shows that with these weights (acc + bias) >> shift
  reaches far outside [-128, 127] on both sides for inputs in [0, 127], every VTA layer's input
  being a ReLU's output, so neither MIN nor MAX can be dropped);
- a residual step adds the residual in ACC (an ALU ADD per entry: a GEMM could only add it
  times an int8 weight, and the shift before it, 2^7 or more here, does not fit one), brought
  into ACC by a LOAD ACC_8BIT (16 B per entry at 8 B/cycle, on the compute module), and a
  second shift after the add is one more ALU op per entry.

The load module runs on its own, but must bring the weights and the input at least once (at
min(bus, DRAM) bytes per cycle): a layer's floor is the larger of the two (the dense layer's
weights make it DMA-bound). `floor` grants the bias add for free (as if it were folded into the GEMMs); `floor+bias` adds
its ALU ADD per entry (what every program here, tsl's and classic, does). The totals give the
highest speedup over the classic tiles any program can reach under the shared cycle model.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _clip_range(layer) -> tuple[int, int]:
    """The extremes of (acc + bias) >> (first shift) over inputs in [0, 127]."""
    w, b = (np.asarray(x, dtype=np.int64) for x in layer.weights)
    w = w.reshape(w.shape[0], -1)
    shift = next(s.value[0] for s in layer.op.epilogue.steps if s.kind == "shift")
    hi = 127 * np.clip(w, 0, None).sum(1) + b
    lo = 127 * np.clip(w, None, 0).sum(1) + b
    return int(lo.min()) >> shift, int(hi.max()) >> shift


def _floors(op, cfg) -> tuple[int, int]:
    """(floor, floor+bias) of the compute module's cycles for `op` (module docstring)."""
    kinds = [s.kind for s in op.epilogue.steps]
    entries = math.prod(op.output.shape) // (cfg.batch * cfg.block_out)
    macs = op.macs // (cfg.batch * cfg.block_in * cfg.block_out)
    alu = 3 + ("residual" in kinds) + max(0, kinds.count("shift") - 1)
    bw = min(cfg.bus_bytes, cfg.dram_bytes_per_cycle)
    res = math.ceil(cfg.batch * cfg.block_out / bw) if "residual" in kinds else 0
    compute = macs * cfg.gemm_ii + entries * (1 + alu * cfg.alu_ii + res)
    load = math.ceil(sum(math.prod(t.shape) for t in op.inputs if t.name in ("A", "B")) / bw)
    bias = entries * cfg.alu_ii * ("bias" in kinds)
    return max(compute, load), max(compute + bias, load)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="vta-1x16x16")
    ap.add_argument("--hw", type=int, default=224)
    args = ap.parse_args()
    import tsl.relax
    from tsl.bench.vta_models import resnet18
    from tsl.relax.vta_run import partition

    mod, cal = resnet18(args.hw)
    q = tsl.relax.quantize(mod, calibration=cal, skip_first=True)
    ours, base = partition(q, args.target).layers, partition(q, args.target, True).layers
    print("| layer | tsl | busy | GEMM | reset | ALU uops | classic | floor | floor+bias "
          "| clip range |\n|---|---|---|---|---|---|---|---|---|---|")
    tot = np.zeros(5, dtype=np.int64)
    convs = np.zeros(5, dtype=np.int64)
    for (layer, art), (_, bart) in zip(ours, base):
        st, cfg = art.estimate().detail["stats"], art.program().config
        f, fb = _floors(layer.op, cfg)
        c = bart.estimate().cycles
        row = [st.cycles, c, f, fb, st.busy["compute"]]
        tot += row
        convs += row if layer.op.name == "conv2d" else 0
        print(f"| {layer.op} | {st.cycles:,} | {st.busy['compute']:,} | {st.gemm_uops:,} | "
              f"{st.reset_uops:,} | {st.alu_uops:,} | {c:,} | {f:,} | {fb:,} | "
              f"{_clip_range(layer)} |")
    for what, v in (("total", tot), ("convs only (the classic flow's dense is on the CPU)",
                                       convs)):
        t, c, f, fb, busy = (int(x) for x in v)
        print(f"\n{what}: tsl {t:,} (compute busy {busy:,}), classic {c:,}: {c / t:.4f}x; "
              f"floor {f:,}: at most {c / f:.4f}x; floor+bias {fb:,}: at most {c / fb:.4f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
