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
