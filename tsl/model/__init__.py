"""The analytic cost model over the TAM, and the knob choice it makes.

    s = tsl.schedule(op, "vta")       # knobs left unset are the model's choice
    tsl.model.evaluate(s)             # -> Estimate: traffic and time per level, bound, notes
    print(tsl.model.explain(s))       # the best candidates and what limits each

Back ends return the same `Estimate` from `artifact.estimate()` (kind "model", "simulated" or
"measured"), adding their own detail; `evaluate(s, extra=[Transfer(...)], detail={...})` is how
a back end prices transfers its program makes beyond the staged tiles.
"""

from .cost import Program, Transfer, busy_units, evaluate, program_of, register_program, transfers
from .estimate import KINDS, Estimate
from .search import Choice, choose, explain, record_fixed, search

__all__ = ["Estimate", "KINDS", "Transfer", "Program", "register_program", "program_of", "evaluate", "transfers", "busy_units", "choose",
           "explain", "search", "record_fixed", "Choice"]
