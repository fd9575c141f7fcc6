"""`tsl.relax.schedule_rest`: give every PrimFunc without a tsl kernel a vector schedule.

Run after the swap: functions carrying "tsl.machine" are tsl kernels and left alone; every other
PrimFunc is offered to `tsl.schedules.vector.RULES` in order; the first rule that applies wins.
The names of functions no rule took are returned through `left` (with the reason) for the report.

Before the rules, calls of PrimFuncs that only reshape (TVM's legalized reshapes, the swap's
crops and packs that change no element's order) become VM reshapes, views made without a copy:
TVM's `RewriteDataflowReshape` does this later in its own pipeline, but by then this pass has
scheduled those functions into loop nests it no longer recognizes. The swap's packs are
simplified first (`StmtSimplify`): their bound checks are always true where nothing is padded.
Then chains of copies are merged into their consumers (`tsl.relax.chains`): one loop nest each.
Divisions by a symbolic extent that a fused reshape left in a function's indices are taken out
where the loops' ranges prove them exact (`tsl.relax.reshapes.exact`): a vector of loads, not
a div and a mod per element.
"""

from __future__ import annotations

from ..schedules.vector import RULES, UPPER_BOUNDS, VectorFacts
from .chains import fuse_copy_chains
from .reshapes import exact
from .symbolic import symbols, upper_bounds


def schedule_rest(facts: VectorFacts, left: list | None = None, bounds: dict | None = None):
    """A module pass applying the vector rules for `facts` to every non-tsl PrimFunc. A
    scheduled function with symbolic dims carries their upper bounds (`UPPER_BOUNDS`: the
    graph's `tir_var_upper_bound`, overridden by `bounds`)."""
    import tvm
    from tvm import tirx

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.ScheduleRest")
    def _pass(mod, _ctx):
        known = upper_bounds(mod, bounds)
        mod = fuse_copy_chains(_reshapes_as_views(mod))
        for gv, f in list(mod.functions.items()):
            if not isinstance(f, tirx.PrimFunc) or "tsl.machine" in f.attrs:
                continue
            f = exact(f) or f
            sch = next((s for s in (r(f, facts) for r in RULES) if s is not None), None)
            if sch is None:
                if left is not None:
                    left.append((gv.name_hint, "no vector rule matches its blocks"))
                continue
            f = sch.mod["main"].with_attr("tsl.vector", 1)
            own = {str(v.name): known[str(v.name)] for v in symbols(f) if str(v.name) in known}
            mod[gv] = f.with_attr(UPPER_BOUNDS, own) if own else f
        return mod

    return _pass


def _reshapes_as_views(mod):
    """`mod` with every call of a reshape-only PrimFunc made a VM reshape (see above), the
    PrimFuncs no longer called dropped."""
    import tvm
    from tvm import relax, tirx

    from tvm.relax.analysis import has_reshape_pattern

    mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    simplify = tvm.s_tir.transform.StmtSimplify()
    for gv, f in list(mod.functions.items()):
        if isinstance(f, tirx.PrimFunc) and "tsl.machine" not in f.attrs:
            done = simplify(tvm.IRModule({"main": f}))["main"]
            # A reshape over a symbolic extent ((12, s, s) -> (1, 12, s, s)) simplified has
            # indices TVM's reshape check no longer proves: it stayed a copy (0.8 ms of the
            # dynamic-seq BERT layer at s = 128).
            if has_reshape_pattern(done) or not has_reshape_pattern(f):
                mod[gv] = done
    return relax.transform.DeadCodeElimination()(relax.transform.RewriteDataflowReshape()(mod))


def unscheduled(mod, target) -> list[tuple[str, str]]:
    """(function, why) for every PrimFunc of `mod` that neither a tsl kernel nor a rule for the
    rest takes on `target` (see `rest_schedules`)."""
    return [(name, why) for name, (rule, why) in rest_schedules(mod, target).items()
            if rule is None]


def rest_schedules(mod, target) -> dict[str, tuple[str | None, str]]:
    """function -> (rule, note) for every PrimFunc of `mod` after TVM's legalization and fusion
    (run on a copy, the graph's layouts planned for `target`): on CPU targets the tsl vector
    rule that takes it, on CUDA targets the dlight GPU rule TVM's CUDA pipeline applies (its
    result checked to be bound to GPU threads). A rule of None: nothing takes the function,
    the note says why."""
    import tvm

    from . import _stages, machine_for, tvm_target

    tgt = tvm_target(target)
    with tgt:
        fused = tvm.transform.Sequential(_stages(tgt, machine_for(target))[0])(mod)
    prims = [(gv.name_hint, f) for gv, f in fused.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc)]
    if tgt.kind.name == "cuda":
        return {name: _dlight_rule(f, tgt) for name, f in prims}
    if tgt.kind.name != "llvm":
        return {name: (None, f"no schedule for {tgt.kind.name} targets yet") for name, _ in prims}
    facts = _facts(target)
    return {name: _vector_rule(f, facts) for name, f in prims}


def _facts(target) -> VectorFacts:
    from ..backend import get_backend
    from .targets import machine_for

    m = machine_for(target)
    return get_backend(m.backend).vector_facts(m)


def _vector_rule(func, facts):
    for rule in RULES:
        if rule(func, facts) is not None:
            return rule.__name__, ""
    return None, "no vector rule matches its blocks"


def _dlight_rule(func, tgt):
    """The first of TVM's CUDA pipeline rules (`relax.backend.cuda.pipeline.legalize_passes`, in
    its order) that schedules `func`, with its threads bound."""
    from tvm.s_tir import dlight as dl

    for rule in (dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
                 dl.gpu.Fallback()):
        space = rule.apply(func.with_attr("target", tgt), tgt, False)
        if space is None:
            continue
        sch = space if not isinstance(space, list) else space[0]
        if "blockIdx" not in sch.mod["main"].script():
            return None, f"dlight {type(rule).__name__} left it unbound to GPU threads"
        return f"dlight.gpu.{type(rule).__name__}", ""
    return None, "no dlight GPU rule matches its blocks"
