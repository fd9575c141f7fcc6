"""Shape-generic builds (issue #25): one build of an operator family serves every value of
its symbolic dim.

`build_family` records the family's schedule at each rung of a ladder over [1, upper] (the
cost model or a tuning database choosing each rung's knobs: the micro-kernels), prices every
value's plan with the model (`plan.table`), compiles only the kernels some value uses, and
returns a `DynamicArtifact` that dispatches on the run-time value. Nothing here names a back
end: each kernel is the back end's own static artifact.
"""

from __future__ import annotations

from typing import Callable

from ..errors import ScheduleError
from ..model import evaluate
from ..ops.sym import Family
from ..schedules import default_schedule
from . import jobs, microkernel, plan, simulated, symbolic
from .microkernel import SMALL
from .calls import call_seconds
from .artifact import DynamicArtifact, DynamicBound
from .shape import Dims, dims_of

# Kernels with run-time extents cover any value, so the ladder's ranges stop doubling here:
# one more range above serves every larger value (its kernel chosen over all of them);
# a range (256, 2048] chose knobs 1.4x slower at 512 than doubling ranges do.
SYMBOLIC_TOP = 4096

__all__ = ["DynamicArtifact", "DynamicBound", "build_family", "kernels_for", "rungs"]


def rungs(fam: Family, machine, fn: Callable | None = None) -> tuple[Dims, list[int]]:
    """The symbol's dims and the ladder of values kernels are recorded at. The granule is
    the tile a static build of the smallest value pads the symbol's axis to (the primitive's
    rows, a VTA GEMM's block of rows, an MXU's 128)."""
    from ..record import record

    dims = dims_of(fam)
    sym = dims.symbol
    one = fam.at(**{sym.name: 1})
    s = record(one, machine, fn)
    ax = next(a.name for a, b in zip(one.axes, fam.upper().axes) if a.extent != b.extent)
    granule = max(1, min(s.padded_extents()[ax], sym.upper))
    return dims, plan.ladder(sym.upper, granule, dims.chunk_axis is not None)


def kernels_for(fam: Family, machine, fn: Callable | None, values: list[int],
                knobs: dict | None = None) -> list[plan.Kernel]:
    """One recorded schedule per value, `knobs` given per value ({value: knobs}) or one dict
    for all; knobs not given are the cost model's choice (the values' searches in
    parallel, `jobs`: a worker sends back the knobs it chose, recorded again here)."""
    from ..record import record

    per_value = knobs and all(isinstance(k, int) for k in knobs)
    given = [knobs.get(v) if per_value else knobs for v in values]
    ops = [fam.at(**{fam_symbol(fam): v}) for v in values]
    chosen = jobs.mapped(lambda n: dict(record(ops[n], machine, fn, given[n]).knob_values),
                         range(len(values)))
    out = []
    for n, v in enumerate(values):
        s = record(ops[n], machine, fn, chosen[n] if chosen else given[n])
        s.as_written = fn is not None or bool(given[n])
        out.append(plan.Kernel(v, s, evaluate(s).seconds))
    return out


def fam_symbol(fam: Family) -> str:
    return next(iter(fam.syms))


def build_family(fam: Family, backend, machine, fn: Callable | None = None, knobs=None,
                 values: list[int] | None = None, **options) -> DynamicArtifact:
    """Compile `fam` once for the whole range of its symbol (see the module's text)."""
    fn = fn or default_schedule(fam.name)
    dims = dims_of(fam)
    if runtime_rows(fam, backend, dims, options):  # its own ladder: no granule to search
        return _build_symbolic(fam, backend, machine, fn, knobs, dims, values)
    _, ladder = rungs(fam, machine, fn)
    values = sorted(values or ladder)
    if values[-1] < dims.symbol.upper and dims.chunk_axis is None:
        raise ScheduleError(f"{fam}: the kernels cover {dims.symbol.name} up to {values[-1]}, "
                            f"below the bound {dims.symbol.upper}, and {dims.symbol.name} "
                            f"cannot be cut in chunks here; include the bound")
    upper, chunkable = dims.symbol.upper, dims.chunk_axis is not None
    call_s = call_seconds(backend, machine)
    if backend.simulated:  # priced by what each call costs there
        def record(vs):
            return kernels_for(fam, machine, fn, vs, knobs)

        kernels, tab = simulated.refined(
            backend, record, simulated.priced(backend, record, values, chunkable, options),
            upper, chunkable, call_s, options)
        return DynamicArtifact(fam, dims, kernels, tab)
    kernels = kernels_for(fam, machine, fn, values, knobs)
    tab = plan.table(kernels, upper, chunkable, call_s)
    for n in sorted(tab.used()):
        kernels[n].artifact = backend.build(kernels[n].schedule, **options)
    return DynamicArtifact(fam, dims, kernels, tab)


def runtime_rows(fam: Family, backend, dims: Dims, options: dict) -> bool:
    """Whether the symbol can be the kernels' run-time row count: a GEMM's rows, on a back
    end that compiles such kernels, with no build options it would have to honour."""
    return (dims.plain and symbolic.supports(fam.upper(), dims.axes)
            and hasattr(backend, "build_symbolic") and not options)


def _build_symbolic(fam, backend, machine, fn, knobs, dims: Dims, values) -> DynamicArtifact:
    """Kernels with run-time rows, one per range of `symbolic_ladder` (`microkernel`);
    `knobs` by range top ({top: knobs}, a tuned family) are taken as they are."""
    tuned = knobs if knobs and all(isinstance(k, int) for k in knobs) else None
    per_range = microkernel.kernels(fam, machine, fn, dims.axes,
                                    sorted(values or symbolic_ladder(dims.symbol.upper)),
                                    dims.symbol.upper, None if tuned else knobs,
                                    _check(machine), tuned)
    kernels, tab = microkernel.table(fam, per_range, call_seconds(backend, machine))
    for k in kernels:
        k.artifact = backend.build_symbolic(k.schedule, k.blocks)
    return DynamicArtifact(fam, dims, kernels, tab)


def symbolic_ladder(upper: int) -> list[int]:
    """The rungs of a family built with run-time rows: every value up to SMALL, then doubling
    up to SYMBOLIC_TOP."""
    return sorted(set(range(1, min(upper, SMALL) + 1))
                  | set(plan.ladder(min(upper, SYMBOLIC_TOP), 1, True, ratio=2)))


def _check(machine):
    from ..backend import get_backend
    from ..errors import BackendUnavailable

    try:
        return get_backend(machine.backend).check
    except BackendUnavailable:
        return None
