"""Knob values of the project's own conv2d schedule tuned for vta-1x16x16 on ResNet-18's
C2-C11: a greedy search over the knobs under the cycle model (the same one that times the
classic baseline), started from the classic configuration. `VTAArtifact.benchmark` reports
them next to the default knobs."""

from __future__ import annotations

from . import classic

TUNED = {
    "C2": dict(h_inner=4, w_inner=56, ci_inner=1, co_inner=2, stages=2, parallel_axes="co"),
    "C3": dict(h_inner=2, w_inner=28, ci_inner=1, co_inner=4, stages=2, parallel_axes="co"),
    "C4": dict(h_inner=2, w_inner=28, ci_inner=2, co_inner=8, stages=2, parallel_axes="oh"),
    "C5": dict(h_inner=7, w_inner=28, ci_inner=1, co_inner=4, stages=2, parallel_axes="co"),
    "C6": dict(h_inner=7, w_inner=14, ci_inner=1, co_inner=4, stages=2, parallel_axes="co"),
    "C7": dict(h_inner=7, w_inner=14, ci_inner=1, co_inner=8, stages=2, parallel_axes="co"),
    "C8": dict(h_inner=14, w_inner=14, ci_inner=1, co_inner=2, stages=2, parallel_axes="co"),
    "C9": dict(h_inner=7, w_inner=7, ci_inner=1, co_inner=16, stages=2, parallel_axes="co"),
    "C10": dict(h_inner=7, w_inner=7, ci_inner=4, co_inner=16, stages=1, parallel_axes="co"),
    "C11": dict(h_inner=7, w_inner=7, ci_inner=1, co_inner=8, stages=2, parallel_axes="co"),
}


def knobs(op, machine) -> dict | None:
    """Tuned knobs of `op` (None when it is not one of the tuned layers or machines)."""
    name = classic.layer_of(op)
    if name is None or machine.name != "vta-1x16x16":
        return None
    return dict(TUNED[name], co_outer=1, reduce_rows=True)
