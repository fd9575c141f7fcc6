"""The knob search, its database, its runners (in-process, process pool, RPC tracker) and CLI."""

import json
import warnings

import numpy as np
import pytest

import tsl
from tsl import tune
from tsl.backend import resolve_target
from tsl.backends.vta import classic
from tsl.tune import opspec
from tsl.tune.__main__ import main as cli
from tsl.tune.database import Database, Key


def vta_op(n=64):
    return classic.gemm(16, 128, n)  # int8 dense with VTA's requantizing epilogue


class Counting(tune.LocalRunner):
    """The in-process runner, remembering what it was asked to measure."""

    def __init__(self, check=True):
        super().__init__(check=check)
        self.seen = []

    def run(self, schedules, schedule_fn):
        self.seen += [s.knob_values for s in schedules]
        return super().run(schedules, schedule_fn)


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


def test_database_resumes_and_build_takes_its_best(tmp_path):
    op = vta_op()
    db = Database(tmp_path / "t.jsonl")
    first = tune.tune(op, "vta", trials=6, batch=2, pool=40, database=db)
    assert len(db) == 6 and first.resumed == 0
    rec = db.records()[0]
    assert rec.machine == "vta-1x16x16" and len(rec.machine_hash) == 12
    assert rec.schedule == "tsl.schedules.schedule_gemm" and rec.op.startswith("dense 16x64x128")
    assert rec.versions["tsl"] and rec.versions["tvm"] and rec.time > 0

    # A second run (from the file) measures only what the first did not.
    runner = Counting()
    again = tune.tune(op, "vta", trials=9, batch=2, pool=40, database=Database(db.path),
                      runner=runner)
    assert again.resumed == 6 and len(runner.seen) == 3 and len(again.log) == 9
    measured = [json.dumps(r.knobs, sort_keys=True) for r in Database(db.path).records()]
    assert len(measured) == len(set(measured)) == 9
    assert again.seconds <= first.seconds

    art = tsl.build(op, "vta", knobs=Database(db.path))
    assert art.schedule.knob_values == again.knobs and art.verify()[0]
    # The learned model is saved beside the database, for the next operator of the family.
    assert db.model_path(art.machine, tsl.default_schedule("dense")).exists()


def test_build_with_a_database_without_the_key_warns_and_uses_defaults(tmp_path):
    op = vta_op()
    with pytest.warns(UserWarning, match="no successful record .* default knobs"):
        art = tsl.build(op, "vta", knobs=Database(tmp_path / "empty.jsonl"))
    assert art.schedule.knob_values == tsl.schedule(op, "vta").knob_values


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    op = vta_op()
    m = tsl.load_machine("vta-1x16x16")
    key = Key.of(op, m, tsl.default_schedule("dense"))
    db = Database(tmp_path / "t.jsonl")
    for n in range(3):
        db.add(tune.database.make_record(key, {"k_inner": n}, 1e-3 * (n + 1), "seconds",
                                         1e-3 * (n + 1)))
    text = db.path.read_text()
    db.path.write_text(text + text.splitlines()[0][:57])  # a write cut short by a kill
    with pytest.warns(UserWarning, match="last line, cut short"):
        db2 = Database(db.path)
    assert len(db2) == 3 and db2.best(key).knobs == {"k_inner": 0}
    db2.add(tune.database.make_record(key, {"k_inner": 9}, None, "seconds", None, "boom"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        db3 = Database(db.path)
    assert len(db3) == 4 and "line 4" in str(caught[0].message)
    assert db3.measured(key)[json.dumps({"k_inner": 9})].error == "boom"


def test_pool_runner_measures_in_worker_processes(tmp_path):
    op = vta_op(32)
    with tune.PoolRunner(2) as runner:
        res = tune.tune(op, "vta", trials=4, batch=2, pool=20, runner=runner,
                        database=tmp_path / "p.jsonl")
    devices = {r.device for r in Database(tmp_path / "p.jsonl").records()}
    assert len(res.log) == 4 and all(d.startswith("pool-") for d in devices)
    assert res.kind in ("cycles", "model")


def test_spearman_is_reported_and_the_model_transfers(tmp_path):
    db = Database(tmp_path / "t.jsonl")
    res = tune.tune(vta_op(64), "vta", trials=16, batch=4, pool=60, database=db)
    assert len(res.predicted) == 16 - 2 * 4  # after two batches ranked by the analytic model
    assert res.ranked_by == ["analytic", "analytic", "own", "own"]
    assert res.run_spearman is not None and -1 <= res.run_spearman <= 1
    assert res.spearman_of(("own",)) == res.run_spearman and not res.transferred
    other = tune.tune(vta_op(96), "vta", trials=4, batch=2, pool=40, database=db)
    assert other.transferred
    assert tune.tune(vta_op(96), "vta", trials=4, batch=2, pool=40, database=db,
                     transfer=False).resumed == 4


def test_the_transferred_model_ranks_until_the_run_has_its_own(tmp_path):
    # The saved model ranks the batches before the run has 2 batches of its own measurements;
    # then, and in the model the run saves, only this run's measurements count.
    op, fn, m = vta_op(96), tsl.default_schedule("dense"), resolve_target("vta")[1]
    db = Database(tmp_path / "t.jsonl")
    tune.tune(vta_op(64), "vta", trials=8, batch=4, pool=40, database=db)
    res = tune.tune(op, "vta", trials=16, batch=4, pool=40, database=db)
    assert res.transferred
    assert res.ranked_by == ["transferred", "transferred", "own", "own"]
    assert {r for *_, r in res.predicted} == {"transferred", "own"}
    assert res.spearman_of(("transferred",)) is not None
    measured = [tune.record(op, m, fn, k) for k, _, _ in res.log]
    own = tune.LearnedModel()
    own.fit([tune.features(s) for s in measured], [t for *_, t in res.log],
            [a for _, a, _ in res.log])
    saved = tune.LearnedModel.load(db.model_path(m, fn), len(tune.features(measured[0])))
    pool = tune.candidates(op, m, fn, limit=20, seed=3)
    args = ([tune.features(s) for s in pool], [tune.analytic_seconds(s) for s in pool])
    np.testing.assert_allclose(saved.predict(*args), own.predict(*args), rtol=1e-5)


def test_a_transferred_model_ranks_the_first_batch(tmp_path):
    # A model saved beside the database (here: one that says the analytic model's three
    # favourites are 20x slower than it thinks) ranks the next run's first batch: after the
    # default knobs, the run measures the pool's best by analytic time x the model's correction.
    op, fn, m = vta_op(64), tsl.default_schedule("dense"), resolve_target("vta")[1]
    scratch = Counting()
    tune.tune(op, "vta", trials=8, batch=4, pool=40, runner=scratch, transfer=False)
    liked = scratch.seen[1:4]  # the first batch after the default: the analytic model's top 3
    trained = [tune.record(op, m, fn, k) for k in scratch.seen]
    analytic = [tune.analytic_seconds(s) for s in trained]
    prior = tune.LearnedModel()
    prior.fit([tune.features(s) for s in trained],
              [t * (20 if s.knob_values in liked else 1) for s, t in zip(trained, analytic)],
              analytic)
    db = Database(tmp_path / "warm.jsonl")
    prior.save(db.model_path(m, fn))
    pool = tune.candidates(op, m, fn, limit=40, seed=0)[1:]
    score = prior.predict([tune.features(s) for s in pool],
                          [tune.analytic_seconds(s) for s in pool])
    want = [pool[i].knob_values for i in np.argsort(score, kind="stable")[:3]]
    assert want != liked  # the model changes the ranking
    warm = Counting()
    res = tune.tune(op, "vta", trials=4, batch=4, pool=40, runner=warm, database=db)
    assert res.transferred and warm.seen == scratch.seen[:1] + want


def test_features_do_not_scale_with_the_operator():
    # The same knobs on an operator twice as large in every dimension: the knob features and
    # the padding waste are the same (the model trained on one ranks the other).
    m, fn = resolve_target("vta")[1], tsl.default_schedule("dense")
    small, large = classic.gemm(16, 128, 64), classic.gemm(32, 256, 128)
    knobs = tsl.schedule(small, m).knob_values
    f_small = tune.features(tune.record(small, m, fn, knobs))
    f_large = tune.features(tune.record(large, m, fn, knobs))
    n = len(knobs)
    assert f_small[-n:] == f_large[-n:] and f_small[0] == f_large[0] == 0.0
    assert len(f_small) == len(f_large)


def test_cli_json_and_errors(tmp_path, capsys):
    db = tmp_path / "c.jsonl"
    assert cli(["dense 16x64x128 int8 requantize=8", "--target", "vta", "--trials", "3",
                "--db", str(db), "--json"]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert summary["trials"] == 3 and summary["seconds"] <= summary["default_seconds"]
    assert "batch 1: 3/3 trials" in err  # the default knobs and the two the model ranks first
    assert len(Database(db)) == 3
    assert cli(["matmul 16x16", "--target", "vta"]) == 2
    assert "3 numbers" in capsys.readouterr().err


def test_opspec_parses_what_the_bench_tunes():
    op = opspec.parse("dense 128x3072x768 float32 bias relu")
    assert (op.name, op.params["shape"], [s.kind for s in op.epilogue.steps]) == \
        ("dense", (128, 3072, 768), ["bias", "relu"])
    conv = opspec.parse("conv2d 1x128x28x28x128x3x3 padding=1 NCHW")
    assert conv.output.shape == (1, 128, 28, 28)
    assert opspec.parse("matmul 8x8x8 int8").dtype == "int8"
    with pytest.raises(tsl.InputError, match="unknown word 'relux'"):
        opspec.parse("matmul 8x8x8 relux")


def test_rpc_tracker_survives_a_killed_server(tmp_path):
    """A tracker and two servers on 127.0.0.1; one server is killed after half the trials:
    its measurement in flight is recorded as lost, with the reason, and the run finishes on
    the other server."""
    pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado (the tune extra)")
    from tsl.tune import rpc

    op = tsl.ops.matmul(24, 16, 8)
    db = Database(tmp_path / "r.jsonl")
    with rpc.local_cluster(2, "tsl-test", lifetime=240) as (addr, servers):
        with rpc.RPCRunner(addr, "tsl-test", number=2, repeat=2) as runner:
            assert runner.parallelism == 2

            def progress(line):
                if len(db) >= 8 and servers[0].poll() is None:
                    rpc.kill(servers[0])

            res = tune.tune(op, "cpu", trials=16, batch=4, pool=200, database=db,
                            runner=runner, progress=progress)
    recs = Database(db.path).records()
    lost = [r for r in recs if r.lost]
    assert len(res.log) == 16 and len([r for r in recs if not r.lost]) == 16
    assert lost and all("lost while measuring" in r.error for r in lost)
    assert len({r.device for r in recs if r.ok}) == 2
    assert res.seconds <= res.default_seconds


def twin(s):
    e = tsl.model.evaluate(s)
    return tune.search.twin_key(s, e.seconds, tune.search.program_features(s, e))


def test_twins_are_deferred_behind_distinct_candidates():
    # Knob settings the analytic model and the program features cannot tell apart (on a dense
    # with one row: which of the outer loops comes first, when both have one iteration) are
    # one program: the run measures one of them while distinct candidates remain, and a twin
    # of a measured or picked candidate waits behind every distinct one.
    op, fn, m = classic.gemm(1, 128, 64), tsl.default_schedule("dense"), resolve_target("vta")[1]
    pool = tune.candidates(op, m, fn, limit=40, seed=0)
    by_time = sorted(pool, key=tune.analytic_seconds)[:8]
    assert len({twin(s) for s in by_time}) <= 5  # the analytic ranking's top has twins
    runner = Counting(check=False)  # which configurations are measured is the point here
    tune.tune(op, "vta", trials=8, batch=4, pool=40, runner=runner, transfer=False)
    seen = [tune.record(op, m, fn, k) for k in runner.seen]
    assert len(seen) == 8 and len({twin(s) for s in seen}) == 8

    rank, keys = [0, 1, 2, 3, 4], {0: "a", 1: "a", 2: "b", 3: "b", 4: "c"}
    assert tune.search.distinct(rank, 3, set(), keys.get) == [0, 2, 4]
    assert tune.search.distinct(rank, 3, {"a", "c"}, keys.get) == [2, 0, 1]  # twins last
