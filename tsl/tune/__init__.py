"""Knob search with a tuning database, measured locally, in a process pool or on RPC devices.

    db = tsl.tune.Database("tuning.jsonl")                  # one JSON line per measurement
    result = tsl.tune.tune(op, "cpu", trials=64, database=db)  # resumes what db already has
    art = tsl.build(op, "cpu", knobs=db)                     # the best record for op here
    tsl.tune.tune(family, "cpu", trials=128, database=db)    # a tsl.ops.sym family: its whole
    art = tsl.build(family, "cpu", knobs=db)                 # range tuned once, one entry

Modules: `search` (candidates, the analytic ranking, the XGBoost model, an operator's `tune`),
`keys` (what a record is keyed by), `database`
(the JSON-lines records), `family` / `family_search` (a family's database entry and its
tuning across the symbol's range), `runner` (in-process and process-pool measurement), `rpc`
(measurement on devices registered with a TVM RPC tracker), `metaschedule` (TVM MetaSchedule
on the same operator, for comparison); `python -m tsl.tune` is the command line.
"""

from .database import Database, Key, Record, signature
from .family_search import FamilyResult, tune
from .runner import LocalRunner, Outcome, PoolRunner, Runner
from .search import (LearnedModel, TuneResult, analytic_seconds, candidates, features,
                     neighbours, record)

__all__ = ["Database", "Key", "Record", "signature", "Runner", "LocalRunner", "PoolRunner",
           "Outcome", "TuneResult", "FamilyResult", "LearnedModel", "tune", "candidates",
           "features", "analytic_seconds", "neighbours", "record"]
