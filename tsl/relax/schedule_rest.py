"""`tsl.relax.schedule_rest`: give every PrimFunc without a tsl kernel a vector schedule.

Run after the swap: functions carrying "tsl.machine" are tsl kernels and left alone; every other
PrimFunc is offered to `tsl.schedules.vector.RULES` in order; the first rule that applies wins.
The names of functions no rule took are returned through `left` (with the reason) for the report.
"""

from __future__ import annotations

from ..schedules.vector import RULES, VectorFacts


def schedule_rest(facts: VectorFacts, left: list | None = None):
    """A module pass applying the vector rules for `facts` to every non-tsl PrimFunc."""
    import tvm
    from tvm import tirx

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.ScheduleRest")
    def _pass(mod, _ctx):
        for gv, f in list(mod.functions.items()):
            if not isinstance(f, tirx.PrimFunc) or "tsl.machine" in f.attrs:
                continue
            sch = next((s for s in (r(f, facts) for r in RULES) if s is not None), None)
            if sch is None:
                if left is not None:
                    left.append((gv.name_hint, "no vector rule matches its blocks"))
                continue
            mod[gv] = sch.mod["main"].with_attr("tsl.vector", 1)
        return mod

    return _pass


def unscheduled(mod, target) -> list[tuple[str, str]]:
    """(function, why) for every PrimFunc of `mod` that neither a tsl kernel nor a vector rule
    takes on `target`: TVM's legalization and fusion are run on a copy, then the vector rules."""
    import tvm

    from . import _stages, _vector_pass, tvm_target

    tgt = tvm_target(target)
    left: list = []
    with tgt:
        fused = tvm.transform.Sequential(_stages(tgt)[0])(mod)
        if not _vector_pass(target, tgt):
            return [(gv.name_hint, f"no vector schedule for {tgt.kind.name} targets yet")
                    for gv, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
        from ..backend import get_backend
        from .targets import machine_for

        m = machine_for(target)
        schedule_rest(get_backend(m.backend).vector_facts(m), left)(fused)
    return left
