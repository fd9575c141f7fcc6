"""Tuning a family (#25 part 3): one tuning for a symbol's whole range, one database entry,
and `tsl.build(family, knobs=db)` running the tuned kernels at any value."""

import pytest

import tsl
from tsl import tune
from tsl.dynamic import microkernel
from tsl.errors import InputError, ScheduleError
from tsl.ops import sym
from tsl.tune.database import Database, make_record
from tsl.tune.family import family_key, ranges
from tsl.tune.keys import knobs_key

from test_tuning_keys import edited, mine  # one schedule function, and its edited source

TRIALS = 8  # one per range of m <= 8 (every value to 6 its own, then (6, 8]) and one more


def family(upper=8):
    return tsl.ops.dense(sym("m", upper=upper), 40, 24, epilogue=tsl.ops.bias() + tsl.ops.relu())


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    db = Database(tmp_path_factory.mktemp("fam") / "t.jsonl")
    res = tune.tune(family(), "cpu", trials=TRIALS, schedule=mine, database=db)
    return db, res


def test_a_family_is_tuned_once_into_one_entry_and_built_at_any_value(tuned):
    db, res = tuned
    fam = family()
    assert res.trials == TRIALS and res.failed == 0 and res.measurements > TRIALS
    assert res.ranked_by[0] == "analytic"
    # one key for the whole family: the symbol and its bound in it, measurements at several m
    (key,) = db.keys()
    assert key == family_key(fam, tsl.backend.resolve_target("cpu")[1], mine) and "m<=8" in key.op
    assert len({r.knobs["value"] for r in db.records()}) >= 5
    assert all(res.seconds[top] <= d for top, d in res.default_seconds.items())

    again = Database(db.path)  # reloaded from the file
    art = tsl.build(fam, "cpu", schedule=mine, knobs=again)
    assert {k.value: k.knobs for k in art.kernels} == res.knobs
    for m in (1, 3, 5, 7, 8):  # incl. values that are not whole blocks
        ok, err = art.verify(seed=m, m=m)
        assert ok, (m, err)


def test_a_stopped_family_tuning_resumes(tuned, tmp_path):
    db, first = tuned
    copy = Database(tmp_path / "t.jsonl")
    for r in db.records():
        copy.add(r)
    more = tune.tune(family(), "cpu", trials=TRIALS + 2, schedule=mine, database=copy)
    assert more.resumed == TRIALS and more.trials == TRIALS + 2
    assert len(Database(copy.path)) > len(db)
    # each range keeps its least total (the near-tied best two timed again: `settle`)
    assert set(more.knobs) == set(first.knobs)
    assert all(more.seconds[t] <= d for t, d in more.default_seconds.items())


def test_records_of_another_bound_or_schedule_source_are_refused(tuned):
    db, res = tuned
    with pytest.warns(UserWarning) as caught:
        art = tsl.build(family(12), "cpu", schedule=mine, knobs=db)
    said = " ".join(str(w.message) for w in caught)
    assert "m<=8" in said and "another bound" in said and "cost model's knobs" in said
    assert art.verify(m=11)[0]
    with pytest.warns(UserWarning) as caught:
        art = tsl.build(family(), "cpu", schedule=edited, knobs=db)
    said = " ".join(str(w.message) for w in caught)
    assert "another source of the schedule" in said and "cost model's knobs" in said
    assert art.verify(m=7)[0]


def test_what_a_family_tuning_cannot_do_is_a_typed_error():
    conv = tsl.ops.conv2d(sym("n", upper=4), 4, 6, 6, 8, 3, 3, padding=1)
    with pytest.raises(ScheduleError, match="run-time rows"):
        tune.tune(conv, "cpu", trials=2)
    with pytest.raises(InputError, match="leave runner unset"):
        tune.tune(family(), "cpu", trials=2, runner=tune.PoolRunner(1))


def test_a_range_opens_with_the_untuned_kernels_and_a_symbol_in_two_axes_gets_inside_ones(
        tmp_path):
    """Each range's first candidates are the kernels an untuned build runs there, measured
    first, top first (a tuned range never lacks a reading of what it replaces). Attention's
    scores (s in rows and columns) also get the model's best at each range's inside samples,
    whose column blocks suit that value; where those knobs do not record at the range's
    top, they are measured, stored and built recorded at their own value, and the kernel
    runs every value of the range."""
    from tsl.backends.cpu import host
    from tsl.dynamic import _check as checker, symbolic_ladder
    from tsl.dynamic.shape import dims_of
    from tsl.record import record
    from tsl.schedules import default_schedule
    from tsl.tune.family_search import _Search

    fam = tsl.ops.batch_matmul(1, sym("s", upper=24), sym("s", upper=24), 16, transpose_b=True)
    backend, m = tsl.backend.resolve_target("cpu")
    fn, axes = default_schedule(fam.name), dims_of(fam).axes
    db = Database(tmp_path / "t.jsonl")
    run = _Search(fam, backend, m, fn, axes, db, 0)
    untuned = tsl.build(fam, "cpu")
    assert [k.knobs for k in untuned.kernels] == [
        dict(r.cands[i].knob_values) for r in run.ranges for i in r.opening]
    assert [i for _, i in run.picks(len(run.ranges), None)] == [r.opening[0]
                                                               for r in run.ranges]
    # The host's file may plan one kernel per range here (x86-avx2's and x86-avx512's do);
    # the Zen 4 file's plan (priced, not run) has a second kernel in (8, 16] and (16, 24]
    zen4 = host.specialize(tsl.load_machine("x86-avx512-zen4"), host.info())
    planned = _Search(fam, backend, zen4, fn, axes, None, 0)
    per = microkernel.kernels(fam, zen4, fn, axes, symbolic_ladder(24), 24, None,
                              checker(zen4))
    assert [[k.knobs for k in ks] for ks in per] == [
        [dict(r.cands[i].knob_values) for i in r.opening] for r in planned.ranges]
    assert max(len(r.opening) for r in planned.ranges) > 1  # a second kernel opens too
    assert [i for _, i in planned.picks(len(planned.ranges), None)] == [
        r.opening[0] for r in planned.ranges]

    r, i = next((r, i) for r in run.ranges for i in r.at)
    knobs, at = dict(r.cands[i].knob_values), r.at[i]
    assert r.lo < at < r.hi and at in r.pts
    with pytest.raises(ScheduleError):
        record(fam.at(s=r.hi), m, fn, knobs)
    run.measure(r, i)  # the range's only candidate measured: the build takes it
    assert r.done[i].error is None and set(r.done[i].seconds) == set(r.pts)
    assert {rec.knobs.get("at") for rec in db.records()} == {at}
    art = tsl.build(fam, "cpu", knobs=Database(db.path))
    k = art.kernels[art.pieces(r.hi)[0][0]]
    assert k.knobs == knobs
    assert all(art.kernels[art.pieces(v)[0][0]].knobs == knobs
               for v in range(r.lo + 1, r.hi + 1))
    for v in (r.lo + 1, at, r.hi):  # padded to its blocks below and above its own value
        ok, err = art.verify(seed=v, s=v)
        assert ok, (v, err)


def test_the_build_takes_each_range_s_least_total_and_only_complete_ones(tmp_path):
    fam, m = family(), tsl.backend.resolve_target("cpu")[1]
    key = family_key(fam, m, mine)
    (lo, top, pts), = [r for r in ranges(fam) if r[1] == 8]
    model = microkernel.choose(fam, m, mine, ("i",), lo, top, None, None)[0].knobs
    other = {**model, "k_inner": 1 if model["k_inner"] != 1 else 2, "outer": "m"}
    db = Database(tmp_path / "t.jsonl")
    for knobs, t, vals in ((model, 2e-3, pts), (other, 1e-3, pts), ({**other, "outer": "n"},
                                                                   1e-4, pts[:-1])):
        for v in vals:  # the last one's timings stop short: it is not used
            db.add(make_record(key, {"knobs": knobs, "top": top, "value": v}, t, "seconds", t))
    art = tsl.build(fam, "cpu", schedule=mine, knobs=db)
    assert art.kernels[-1].knobs == other and art.verify(m=lo + 1)[0]


def test_beside_the_best_a_range_runs_the_candidates_that_beat_it_where_the_others_do_not():
    from tsl.tune.family import Measured, beside

    pts = [65, 86, 107, 128]

    def cand(*ms):
        return Measured(128, {"n": len(ms)}, dict(zip(pts, ms)))
    top = cand(1.0, 1.0, 1.0, 1.0)  # least total: 4.0
    low = cand(0.5, 0.9, 1.2, 1.5)  # beats it at 65 and 86
    again = cand(0.55, 0.95, 1.3, 1.6)  # beats the top where `low` already does: not taken
    high = cand(1.3, 1.2, 0.99, 0.9)  # beats both at 128
    near = cand(1.1, 1.1, 0.97, 0.97)  # within NOISE of the top everywhere
    assert beside(top, [top, near, again, high, low], pts) == [low, high]
    assert beside(top, [top, near], pts) == []


def _range_and_a_smaller_block():
    """family(16)'s range (8, 16]: the family, its key, the range's bounds and samples, the
    untuned build's top schedule there, and the knobs of the same with a smaller row block
    (its `rows`)."""
    from tsl.dynamic.symbolic import blocks_of

    fam, m = family(16), tsl.backend.resolve_target("cpu")[1]
    (lo, top, pts), = [r for r in ranges(fam) if r[1] == 16]
    best = microkernel.choose(fam, m, mine, ("i",), lo, top, None, None)[0].schedule
    rows = 2 if blocks_of(best, ("i",))["i"] == 4 else 4
    return (fam, family_key(fam, m, mine), lo, top, pts, best, rows,
            {**best.knob_values, "m_inner": rows, "m_outer": 1})


def test_a_range_runs_a_second_candidate_where_its_timings_are_lower(tmp_path):
    """Where another candidate (a smaller row block) was timed faster than the range's best
    at its low samples, the build compiles both and splits the range by the timings."""
    from tsl.dynamic.symbolic import padded

    fam, key, lo, top, pts, best, rows, small = _range_and_a_smaller_block()
    db = Database(tmp_path / "t.jsonl")
    for v in pts:  # the best: 0.8 ms anywhere; the small block: 60 us per padded row
        for knobs, t in ((dict(best.knob_values), 8e-4), (small, 6e-5 * padded(v, rows))):
            db.add(make_record(key, {"knobs": knobs, "top": top, "value": v}, t, "seconds", t))
    art = tsl.build(fam, "cpu", schedule=mine, knobs=db)
    ran = {v: art.kernels[art.pieces(v)[0][0]].knobs for v in range(lo + 1, top + 1)}
    assert ran[top] == dict(best.knob_values) and ran[lo + 1] == small
    # the one of least total runs first: the other takes a value only where its timing is
    # lower by more than the noise (2-row blocks, x86-avx2's file: the small block's total)
    noise = 1 + microkernel.MEASURED_NOISE
    if sum(6e-5 * padded(v, rows) for v in pts) < 8e-4 * len(pts):
        want = {v for v in ran if not 8e-4 * noise < 6e-5 * padded(v, rows)}
    else:
        want = {v for v in ran if 6e-5 * padded(v, rows) * noise < 8e-4}
    assert {v for v, k in ran.items() if k == small} == want
    for v in (lo + 1, 11, 13, top):
        ok, err = art.verify(seed=v, m=v)
        assert ok, (v, err)


def test_the_untuned_top_runs_the_values_no_tuned_kernel_is_timed_clearly_faster_at(tmp_path):
    """A smaller row block, least in total, runs the range's low values, which it pads
    less; the untuned top runs its top, where the other is timed within the noise of it
    (0.8% slower: a static build at the top runs the untuned top)."""
    from tsl.dynamic.symbolic import padded

    fam, key, lo, top, pts, untuned, rows, small = _range_and_a_smaller_block()
    db = Database(tmp_path / "t.jsonl")
    for v in pts:
        t = 6.3e-5 * padded(v, rows)
        db.add(make_record(key, {"knobs": small, "top": top, "value": v}, t, "seconds", t))
        db.add(make_record(key, {"knobs": dict(untuned.knob_values), "top": top, "value": v,
                                 "untuned": True}, 1e-3, "seconds", 1e-3))
    art = tsl.build(fam, "cpu", schedule=mine, knobs=db)
    ran = {v: art.kernels[art.pieces(v)[0][0]].knobs for v in (lo + 1, top)}
    assert ran == {lo + 1: small, top: dict(untuned.knob_values)}
    for v in (lo + 1, top):
        ok, err = art.verify(seed=v, m=v)
        assert ok, (v, err)


def test_a_range_s_near_tied_best_two_are_timed_again_and_the_first_readings_replaced(
        tmp_path):
    from tsl.tune.family import measured

    fam, m = family(), tsl.backend.resolve_target("cpu")[1]
    key = family_key(fam, m, mine)
    (lo, top, pts), = [r for r in ranges(fam) if r[1] == 8]
    model = microkernel.choose(fam, m, mine, ("i",), lo, top, None, None)[0].knobs
    other = {**model, "k_inner": 1 if model["k_inner"] != 1 else 2}
    far = {**model, "outer": "m" if model["outer"] != "m" else "n"}
    db = Database(tmp_path / "t.jsonl")
    read = {knobs_key(model): 1.0e-3, knobs_key(other): 1.05e-3, knobs_key(far): 2e-3}
    for knobs in (model, other, far):  # the first two within TIE of each other
        for v in pts:
            t = read[knobs_key(knobs)]
            db.add(make_record(key, {"knobs": knobs, "top": top, "value": v}, t, "seconds", t))
    res = tune.tune(fam, "cpu", trials=3, schedule=mine, database=db)
    assert res.resumed == 3 and res.settled == 1
    kept = Database(db.path)
    count = {k: sum(knobs_key(r.knobs["knobs"]) == k for r in kept.records()) for k in read}
    assert count == {knobs_key(model): 2 * len(pts), knobs_key(other): 2 * len(pts),
                     knobs_key(far): len(pts)}  # the far one is not timed again
    again = measured(kept, key)
    for v in pts:  # the new readings at the first readings' level: the least of the two
        assert min(again[top, knobs_key(k)].seconds[v] for k in (model, other)) == \
            pytest.approx(1.0e-3)


def test_bench_row_compares_the_tuned_family_with_a_static_tune(tuned, tmp_path):
    from tsl.bench import dynamic as bench

    db, _ = tuned
    art = tsl.build(family(), "cpu", schedule=mine, knobs=db)
    r = bench.tuned_row(family(), art, 5, 2, tmp_path)
    assert r["verified"] and r["family_s"] > 0 and r["static_s"] > 0 and r["static_tune_s"] > 0


def test_candidates_are_timed_at_real_time_priority_under_the_lock(monkeypatch, tmp_path):
    """Every timing of the family tuner runs inside `tsl.timing.realtime` and `exclusive`
    (as the static tuner's runner's), so TSL_TIMING=realtime protects it from other work."""
    import contextlib

    from tsl.tune import family_search

    inside = {"realtime": 0, "exclusive": 0}
    timed = []

    def entered(name):
        @contextlib.contextmanager
        def cm(*args, **kwargs):
            inside[name] += 1
            try:
                yield
            finally:
                inside[name] -= 1
        return cm
    real_times = family_search.call_times

    def call_times(*args, **kwargs):
        timed.append(dict(inside))
        return real_times(*args, **kwargs)
    monkeypatch.setattr(family_search, "realtime", entered("realtime"))
    monkeypatch.setattr(family_search, "exclusive", entered("exclusive"))
    monkeypatch.setattr(family_search, "call_times", call_times)
    tune.tune(family(upper=2), "cpu", trials=2, schedule=mine,
              database=Database(tmp_path / "t.jsonl"))
    assert timed and all(t == {"realtime": 1, "exclusive": 1} for t in timed)


def fake_timings(monkeypatch, reading):
    """The family tuner's kernels tagged (the range's top, the candidate's knobs) as they are
    compiled, and each timing `reading(tag of the call timed, {top: the range's first tag})`
    seconds; returns (the tags of the calls made, in order; the firsts)."""
    from tsl.tune import family_search

    calls, firsts = [], {}
    real_bound = family_search._Search._bound

    def bound(self, s, pts):
        f, frees, err = real_bound(self, s, pts)
        tag = (pts[-1], knobs_key(s.knob_values))
        firsts.setdefault(pts[-1], tag)

        def tagged(*xs):
            calls.append(tag)
            return f(*xs)
        return tagged, frees, err

    def call_times(fn, repeat, warmup=0):
        for _ in range(max(1, warmup)):
            fn()
        return [reading(calls[-1], firsts)] * repeat
    monkeypatch.setattr(family_search._Search, "_bound", bound)
    monkeypatch.setattr(family_search, "call_times", call_times)
    return calls, firsts


def test_a_later_candidate_is_timed_alternately_with_the_range_s_first_and_read_at_its_level(
        monkeypatch, tmp_path):
    """The host slows down 2x between a range's two trials: the second candidate's calls
    alternate with the first's (the reference's), and its reading is the ratio of the two
    at the first's level (1.5 ms), not its slowed time (3 ms) against the first's 1 ms."""
    from tsl.tune import family_search

    slow = {"x": 1}
    # a range's first kernel reads 1 ms, the others 1.5 ms; all twice that when slow
    calls, firsts = fake_timings(monkeypatch, lambda tag, firsts: slow["x"] * (
        1e-3 if tag in firsts.values() else 1.5e-3))
    db = Database(tmp_path / "t.jsonl")
    res = tune.tune(family(upper=2), "cpu", trials=4, schedule=mine, database=db,
                    progress=lambda _: slow.update(x=2))
    seconds = {(r.knobs["top"], knobs_key(r.knobs["knobs"])): r.seconds for r in db.records()}
    assert len(seconds) == 4 and set(firsts.values()) <= set(seconds)
    assert all(t == pytest.approx(1e-3 if k in firsts.values() else 1.5e-3)
               for k, t in seconds.items())
    for top in (1, 2):
        later = next(k for k in seconds if k[0] == top and k != firsts[top])
        timed = [c for c in calls if c[0] == top]
        end = max(i for i, c in enumerate(timed) if c == later) + 1
        # the later one's calls alternate with the reference's (after the warm-up of each)
        assert timed[end - 2 * family_search.REPEAT:end] == \
            [firsts[top], later] * family_search.REPEAT
        assert res.seconds[top] == pytest.approx(1e-3)


def test_every_range_is_read_at_the_level_of_its_reference_timed_again_each_round(
        monkeypatch, tmp_path):
    """The host is 2x slow during one range's first reading only: its reference and the
    candidate read against it are not left at twice the other range's level (2 and 3 ms
    where the same kernels read 1 and 1.5 ms): every range's reference is timed again each
    round, in one pass, and its candidates read at the median of its readings."""
    burst = {"left": 1}

    def reading(tag, firsts):
        t = 1e-3 if tag in firsts.values() else 1.5e-3
        if tag == firsts.get(1) and burst["left"]:  # range (0, 1]'s first reading
            burst["left"] -= 1
            t *= 2
        return t
    _, firsts = fake_timings(monkeypatch, reading)
    db = Database(tmp_path / "t.jsonl")
    res = tune.tune(family(upper=2), "cpu", trials=4, schedule=mine, database=db)
    assert burst["left"] == 0
    seconds = {(r.knobs["top"], knobs_key(r.knobs["knobs"])): r.seconds for r in db.records()}
    assert len(seconds) == 4  # the last record of each counts (a build's, a resume's reading)
    assert all(t == pytest.approx(1e-3 if k in firsts.values() else 1.5e-3)
               for k, t in seconds.items())
    assert res.seconds == {1: pytest.approx(1e-3), 2: pytest.approx(1e-3)}
