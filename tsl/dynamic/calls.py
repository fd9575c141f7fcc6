"""The fixed cost of one more kernel call, per machine: what a plan's extra call costs.

A plan that cuts a value into chunks, or pads it to a bigger rung, weighs kernel time against
calls; each call pays the artifact's argument conversion, padding and packing of the free
inputs, and the thread pool's fork-join, which no cost model of the kernel prices. Where the
back end's artifacts run on this host (its measurement is of kind "measured"), that cost is
timed once per machine and process: the bound call of a one-row dense whose columns give
every core a block (so the fork-join is in it) and whose work is negligible. Elsewhere (a simulated or modelled target: timing the
simulator would price Python, not the device) it is CALL_SECONDS, the figure the CPU back
end's calls measured with the thread pool's fork-join (8 us on a 2-core Xeon, KVM; a plan
chose with 30 us before it was measured).
"""

from __future__ import annotations

CALL_SECONDS = 3e-5
CALLS = 30  # bound calls timed (the least counts: other processes only add time)

_MEASURED: dict[tuple, float] = {}


def call_seconds(backend, machine) -> float:
    """Seconds of one call's fixed cost for `machine`'s artifacts (see the module's text)."""
    key = (machine.name, machine.source)
    if key not in _MEASURED:
        _MEASURED[key] = _timed(backend, machine)
    return _MEASURED[key]


def _timed(backend, machine) -> float:
    from ..artifact import call_times
    from ..errors import TSLError
    from ..ops import dense
    from ..record import record
    from ..timing import exclusive

    try:
        op = dense(1, 16, 64 * machine.cores())
        art = backend.build(record(op, machine))
        if backend.measure(art).kind != "measured":
            return CALL_SECONDS
        names = art.constants()
        xs = list(zip(op.inputs, op.random_inputs(0)))
        f = art.bind(**{t.name: x for t, x in xs if t.name in names})
        free = [x for t, x in xs if t.name not in names]
        with exclusive():
            return min(call_times(lambda: f(*free), CALLS))
    except TSLError:  # no float32 dense here: the back end's calls are priced, not timed
        return CALL_SECONDS
