"""Families on a back end that measures by simulation (VTA): the plan priced by the
kernels' simulated cycles (`tsl.dynamic.simulated`), values cut into calls of any kernel,
and the calls bit-exact against NumPy at values that are not multiples of any rung."""

import pytest

import tsl
from tsl.dynamic import plan, simulated
from tsl.ops import sym


def _dense(upper, k=32, n=16):
    return tsl.ops.dense(sym("m", upper=upper), k, n, dtype="int8",
                         epilogue=tsl.ops.bias() + tsl.ops.requantize(8))


def test_cut_any_lets_every_kernel_cut_not_only_the_top():
    ks = [plan.Kernel(v, None, s) for v, s in ((4, 1.0), (8, 2.5), (16, 8.0))]
    top_only = plan.table(ks, 24, chunkable=True, call_s=0.0)
    assert plan.pieces(top_only, ks, 12) == [(2, 12)]  # padded to 16: 8.0
    anyk = plan.table(ks, 24, chunkable=True, call_s=0.0, cut_any=True)
    assert plan.pieces(anyk, ks, 12) == [(0, 4), (0, 4), (0, 4)]  # 3 x 1.0
    assert anyk.price(12) == 3.0 and top_only.price(12) == 8.0


def test_a_rung_is_added_in_the_gap_priced_worst_against_the_line():
    ks = [plan.Kernel(v, None, s) for v, s in ((1, 1.0), (64, 64.0))]
    tab = plan.table(ks, 64, chunkable=True, call_s=0.0, cut_any=True)
    assert simulated._worst_gap(ks, tab) is None  # v calls of 1 row cost the line exactly
    ks = [plan.Kernel(v, None, s) for v, s in ((16, 16.0), (64, 40.0))]
    tab = plan.table(ks, 64, chunkable=True, call_s=0.0, cut_any=True)
    assert simulated._worst_gap(ks, tab) == (ks[0], ks[1])  # 17 as 16 + 16: 32, line 16.5
    assert simulated._worst_gap(ks, tab, {(16, 64)}) is None
    assert simulated._middle(16, 64) == 40 and simulated._middle(32, 34) == 33


def test_a_vta_family_is_priced_by_its_simulated_cycles_and_bit_exact(monkeypatch):
    # The plateau at once: the second rung tops the ladder, so values above it are cut into
    # calls of the rungs below (values not multiples of any rung: 5, 7, 11).
    monkeypatch.setattr(simulated, "PLATEAU", 1.0)
    art = tsl.build(_dense(12), "vta")
    built = [k for k in art.kernels if k.artifact is not None]
    assert len(built) == len(art.kernels) and max(k.value for k in art.kernels) < 12
    for k in art.kernels:  # the table's prices are the simulator's, not the model's
        assert k.seconds == k.artifact.estimate().seconds
    tab = art.table
    for v in range(1, 13):
        calls = art.pieces(v)
        assert sum(t for _, t in calls) == v
        got = sum(art.kernels[k].seconds + tab.call_seconds for k, _ in calls)
        assert got == pytest.approx(tab.price(v))
        for k in art.kernels:  # no one padded call is cheaper in simulated cycles
            if k.value >= v:
                assert tab.price(v) <= k.seconds + tab.call_seconds + 1e-15
    assert any(len(art.pieces(v)) > 1 for v in (5, 7, 11))
    assert "(simulated seconds per call" in art.dispatch()
    for m in (5, 7, 11, 12):
        assert art.verify(m=m) == (True, 0.0), m

    from tsl.bench import dynamic_vta

    r = dynamic_vta.row("dense", art.family, art, 7)  # the bench's VTA row: cycles of the calls
    assert r["verified"] and r["calls"] == len(art.pieces(7))
    assert r["dynamic_cycles"] == sum(art.kernels[k].artifact.estimate().cycles
                                      for k, _ in art.pieces(7))
    assert r["static_cycles"] > 0 and r["ratio"] == r["dynamic_cycles"] / r["static_cycles"]
