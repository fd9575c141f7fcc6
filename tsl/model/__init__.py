"""The analytic cost model over the TAM, and the knob choice it makes.

    s = tsl.schedule(op, "vta")       # knobs left unset are the model's choice
    tsl.model.evaluate(s)             # -> Estimate: traffic and time per level, bound, notes
    print(tsl.model.explain(s))       # the best candidates and what limits each

Back ends return the same `Estimate` from `artifact.estimate()` (kind "model", "simulated" or
"measured"), adding their own detail; `evaluate(s, extra=[Transfer(...)], detail={...})` is how
a back end prices transfers its program makes beyond the staged tiles.

What is shared and what a back end supplies:

- shared (`cost`): the vocabulary (`Transfer`, built by keyword, with a `TransferKind`: TILE,
  THROUGH, WRITE_BACK, PASS; `Program`; `Estimate`) and the rules that price it: a transfer's
  cycles from its fills, rows, latency and bandwidth, the sharing of a parent's bandwidth, the
  overlap of each path with compute, the accumulator walk over the write-back, the bound and
  the utilization; the knob search (`search`) over any of them.
- the staged tiles (`transfers(s)`): what a back end gets without a `Program` of its own (CPU,
  VTA): each `cache` stage one TILE or WRITE_BACK transfer, priced with its machine's movers
  (hardware facts: rates, latencies) and its back end's `Capabilities`
  (`Backend.capabilities`, what its programs do with those movers: VTA's copies a row at a
  time, at any row pitch, skipped where the buffer holds the region, shared by threads).
- a back end's `Program` (`register_program`), where its kernel is not the staged tiles one
  for one: its transfers (TPU: the Mosaic kernel's blocks, write-back, VMEM<->MXU traffic and
  XLA passes; Tensor Cores: none, its own model of warps, occupancy and waves gives the compute
  cycles and the bound), its compute cycles with its fixed costs, and serial cycles.
"""

from .cost import (Program, Transfer, TransferKind, busy_units, evaluate, program_of,
                   register_program, transfers)
from .estimate import KINDS, Estimate
from .search import Choice, choose, explain, record_fixed, search

__all__ = ["Estimate", "KINDS", "Transfer", "TransferKind", "Program", "register_program", "program_of", "evaluate", "transfers", "busy_units", "choose",
           "explain", "search", "record_fixed", "Choice"]
