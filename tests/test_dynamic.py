"""Symbolic dims (issue #25 step 1): tsl.ops.sym, operator families, verification at any value."""

import numpy as np
import pytest

import tsl
from tsl.errors import InputError, ScheduleError
from tsl.ops import Family, sym


def test_sym_needs_an_upper_bound():
    with pytest.raises(ScheduleError, match="upper="):
        sym("m")
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ScheduleError, match="positive integer"):
            sym("m", upper=bad)
    with pytest.raises(ScheduleError, match="identifier"):
        sym("1m", upper=8)


def test_one_symbol_one_bound():
    with pytest.raises(ScheduleError, match="two upper bounds"):
        tsl.ops.matmul(sym("m", upper=64), sym("m", upper=32), 16)


@pytest.mark.parametrize("make", [
    lambda m: tsl.ops.matmul(m, 24, 40),
    lambda m: tsl.ops.dense(m, 40, 24),
    lambda m: tsl.ops.batch_matmul(3, m, 24, 40, transpose_b=True),
    lambda m: tsl.ops.conv2d(m, 3, 9, 9, 4, 3, 3, padding=1),
])
@pytest.mark.parametrize("value", [1, 5, 31, 64])
def test_family_matches_the_static_operator(make, value):
    fam = make(sym("m", upper=64))
    assert isinstance(fam, Family)
    op = fam.at(m=value)
    static = make(value)
    assert op.params == static.params and op.inputs == static.inputs
    xs = fam.random_inputs(seed=value, m=value)
    assert all(np.any(x != 0) for x in xs)
    assert [x.shape for x in xs] == [t.shape for t in static.inputs]
    np.testing.assert_array_equal(fam.reference(*xs, m=value), static.reference(*xs))


def test_values_are_checked_against_the_bound():
    fam = tsl.ops.dense(sym("m", upper=100), 32, 16)
    assert fam.upper().params["shape"][0] == 100
    for bad in (0, 101, 3.0):
        with pytest.raises(InputError, match=r"m=.*\[1, 100\]"):
            fam.at(m=bad)
    with pytest.raises(InputError, match="missing"):
        fam.at()
    with pytest.raises(InputError, match="unknown"):
        fam.at(m=3, n=4)


def test_static_operators_unchanged_and_bad_static_args_still_fail_at_construction():
    assert not isinstance(tsl.ops.matmul(8, 8, 8), Family)
    with pytest.raises(ScheduleError, match="dtype"):
        tsl.ops.matmul(sym("m", upper=8), 8, 8, dtype="float64")


def test_each_value_of_a_family_builds_and_verifies_statically():
    fam = tsl.ops.dense(sym("m", upper=64), 40, 24)
    for m in (1, 17):
        op = fam.at(m=m)
        art = tsl.build(op, "cpu")
        xs = fam.random_inputs(seed=m, m=m)
        ok, err = op.check(art.run(*xs), fam.reference(*xs, m=m))
        assert ok, (m, err)
