"""The bench's knob search: "ours" is the better of the model's default knobs and a `tsl.tune`
search of a few programs over the same schedule, measured by the back end's `measure`. A tuned
program counts only after it is verified against NumPy."""

from __future__ import annotations

from ..record import record
from ..errors import LoweringError
from ..tune import tune


def improve(backend, machine, op, art, row: dict, trials: int, seed: int = 5):
    """Search `trials` programs for `op`; when one measures faster than `art` (the default
    knobs), rebuild it, verify it, and replace the row's numbers with its benchmark. Returns
    the artifact the row now describes."""
    default = backend.measure(art)
    result = tune(op, machine, trials=trials)
    label = f"{default.cycles:,} cyc" if default.cycles else f"{default.seconds * 1e3:.3f} ms"
    row["default_seconds"] = default.seconds
    row["notes"] = f"default knobs {label}; {trials}-program search"
    if result.seconds >= default.seconds:
        row["notes"] += ": nothing faster"
        return art
    tuned = backend.build(record(op, machine, knobs=result.knobs))
    ok, err = tuned.verify(seed=seed)
    if not ok:
        raise LoweringError(f"{op}: tuned program {result.knobs} is wrong (error {err})")
    row.update(tuned.benchmark())
    row["knobs"] = result.knobs
    row["notes"] += f" {default.seconds / result.seconds:.2f}x faster: {result.knobs}"
    return tuned
