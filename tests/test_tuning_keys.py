"""A tuning record applies to the schedule source and tsl version that made it: the database
refuses (reports, does not use) a record another source of the same schedule function made."""

import pytest

import tsl
from tsl import tune
from tsl.backends.vta import classic
from tsl.tune.database import Database, Key

DEFAULT = tsl.default_schedule("dense")


def mine(s):
    return DEFAULT(s)


def edited(s):  # the same function after an edit: same module and name, another source
    s.knob("unused", (1,))
    return DEFAULT(s)


edited.__qualname__ = mine.__qualname__


def test_the_database_refuses_a_record_made_by_another_schedule_source(tmp_path):
    op, m = classic.gemm(16, 128, 64), tsl.load_machine("vta-1x16x16")
    old, new = Key.of(op, m, mine), Key.of(op, m, edited)
    assert old.schedule == new.schedule and old.schedule_hash != new.schedule_hash
    db = Database(tmp_path / "t.jsonl")
    db.add(tune.database.make_record(old, {"k_inner": 2}, 1e-3, "seconds", 1e-3))
    again = Database(db.path)  # the hash travels in the file
    assert again.best_for(op, m, mine).knobs == {"k_inner": 2}
    with pytest.warns(UserWarning, match="1 records .* another source of the schedule"):
        assert again.best_for(op, m, edited) is None
    with pytest.warns(UserWarning) as caught:
        art = tsl.build(op, m, schedule=edited, knobs=again)
    said = " ".join(str(w.message) for w in caught)
    assert "another source" in said and "default knobs" in said
    assert art.schedule.knob_values == tsl.schedule(op, m, schedule=edited).knob_values
