"""The knob search: candidates from the schedule's space, XGBoost after the first batches."""

import tsl
from tsl import tune


def test_tune_finds_a_valid_configuration():
    op = tsl.ops.matmul(96, 80, 64)
    result = tune.tune(op, "cpu", trials=10, batch=2, pool=60)
    assert len(result.log) == 10
    assert result.seconds <= result.default_seconds
    art = tsl.build(op, "cpu", knobs=result.knobs)
    assert art.verify()[0]
    assert "best" in str(result)


def test_features_and_analytic_model_are_finite():
    op = tsl.ops.matmul(256, 256, 256, dtype="int8")
    m = tsl.load_machine("x86-avx512")
    cands = tune.candidates(op, m, tsl.default_schedule("matmul"), limit=20, seed=1)
    assert len(cands) > 5
    assert len({tuple(sorted(s.knob_values.items())) for s in cands}) == len(cands)
    for s in cands:
        assert all(x == x for x in tune.features(s))
        assert 0 < tune.analytic_seconds(s) < 1
