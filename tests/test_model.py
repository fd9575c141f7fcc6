"""The analytic cost model (tsl.model): traffic with the loop order's real reuse, checked
against the VTA simulator's own counters; the model's knob choice; one Estimate everywhere;
and the model's ranking of knob settings against simulated cycles (and, loosely, CPU time)."""

import math
import re
from pathlib import Path

import pytest

import tsl
from tsl import model
from tsl.backend import resolve_target
from tsl.backends.vta import backend as vta
from tsl.bench import model_check
from tsl.model import Estimate
from tsl.model.search import TIE

EP = tsl.ops.requantize(shift=8, bias=True, clip=(0, 127))
VTA = tsl.load_machine("vta-1x16x16")


def conv(c=32, hw=14, k=32, r=3, pad=1, stride=1):
    return tsl.ops.conv2d(1, c, hw, hw, k, r, r, stride=stride, padding=pad, dtype="int8",
                          epilogue=EP)


KNOBS = {"w_inner": 7, "co_inner": 1, "h_inner": 2, "co_outer": 1, "ci_inner": 1,
         "parallel_axes": "co", "stages": 2}


def test_a_tile_under_a_loop_it_does_not_depend_on_is_reloaded():
    """reduce_rows=False puts the h_inner output rows outside the reduction loop where the
    weights are staged: the weight tile is loaded once per row instead of once per block."""
    once = model.evaluate(tsl.schedule(conv(), VTA, knobs={**KNOBS, "reduce_rows": True}))
    per_row = model.evaluate(tsl.schedule(conv(), VTA, knobs={**KNOBS, "reduce_rows": False}))
    assert per_row.traffic["wgt"] == KNOBS["h_inner"] * once.traffic["wgt"]
    assert per_row.seconds > once.seconds


@pytest.mark.parametrize("op", [conv(pad=0), conv(c=64, hw=12, k=48, r=1, pad=0, stride=2),
                                tsl.ops.dense(16, 128, 96, dtype="int8", epilogue=EP)], ids=str)
def test_traffic_matches_the_simulators_dram_counters(op):
    """Without zero padding every byte the model moves into inp/wgt is a DRAM byte the VTA
    simulator counts (the model knows nothing of the simulator: only the schedule)."""
    s = tsl.schedule(op, VTA)
    est, sim = model.evaluate(s), vta.build(s).estimate()
    assert est.traffic["inp"] == sim.traffic["INP"]
    assert est.traffic["wgt"] == sim.traffic["WGT"]
    assert est.traffic["dram"] == sim.traffic["OUT"]  # the accumulator tile written back


def test_default_knobs_are_the_models_choice_and_explained():
    op = conv()
    s = tsl.schedule(op, "vta")
    best = model.evaluate(s).seconds
    assert all(c.estimate.seconds >= best for c in s.choice.candidates)
    assert s.choice.candidates[0].knobs == s.knob_values
    text = model.explain(s, top=3)
    assert "bound by" in text and text.count("x)") == 3
    # Fixed knobs stay fixed; the others are chosen around them.
    t = tsl.schedule(op, "vta", knobs={"stages": 1, "parallel_axes": "oh"})
    assert t.knob_values["stages"] == 1 and t.knob_values["parallel_axes"] == "oh"
    assert "fixed by the caller" in model.explain(t)


def test_knobs_that_cannot_fit_are_an_error_naming_the_level():
    with pytest.raises(tsl.ScheduleError, match="bytes over"):
        tsl.schedule(conv(c=256, k=256), VTA, knobs={**KNOBS, "ci_inner": 16, "co_inner": 16,
                                                     "co_outer": 1, "reduce_rows": True})


def test_hardware_cache_traffic_counts_only_what_does_not_fit():
    """l2 is a cache (managed = false): a tile is refetched only under loops whose working set
    no longer fits, so the model's l2 traffic never exceeds the tile-by-tile count."""
    m = tsl.load_machine("x86-avx2")
    s = tsl.schedule(tsl.ops.matmul(256, 256, 256), m)
    est = model.evaluate(s)
    nominal = sum(st.bytes * math.prod(lp.extent for lp in s.loops[:s.loops.index(st.at) + 1])
                  for st in s.stages if st.level.name == "l2")
    assert 0 < est.traffic["l2"] <= nominal
    a_and_b = 2 * 256 * 256 * 4
    assert est.traffic["l2"] >= a_and_b  # every input byte comes in at least once


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_write_back_across_the_output_layout_stores_each_run(layout):
    """The core stores the accumulator tile itself: one store per contiguous run of the output,
    up to a vector. NCHW output from vectors of channels runs along pixels (2 or 4 of them per
    channel here), NHWC along the channels (one vector store each); NCHW's runs cross the
    lanes, so each of its elements is gathered too: one more store slot per element, whatever
    the tile."""
    m = tsl.load_machine("x86-avx2")
    op = tsl.ops.conv2d(1, 64, 32, 32, 64, 1, 1, stride=2, layout=layout)
    base = {"h_inner": 1, "co_outer": 1, "ci_inner": 4, "reduce_rows": True,
            "parallel_axes": "oh", "stages": 1}
    parts = {}
    for w, co in ((2, 4), (4, 2)):
        s = tsl.schedule(op, m, knobs={**base, "w_inner": w, "co_inner": co})
        parts[w] = model.cost.compute_parts(s)[0]["store"]
    tiles = 16 * 16 * 64 / 64  # output elements over the tile's 64 (8 x 8 lanes)
    vector_store = 8 * 4 / 32  # cycles: a vector of eight float32 at 32 B per cycle
    units = 2
    if layout == "NCHW":  # 32 runs of 2 pixels, 16 of 4, and the tile's 64 elements gathered
        assert parts == pytest.approx({2: tiles * (32 + 64) * vector_store / units,
                                       4: tiles * (16 + 64) * vector_store / units}, rel=0.01)
    else:
        assert parts[2] == parts[4] == pytest.approx(tiles * 8 * vector_store / units, rel=0.01)


def test_a_cache_moves_whole_lines_unless_the_next_fill_reads_on_along_them():
    """Seven stacked output rows of a 3x3 stride-2 window read, per input channel, 15 input
    rows of 3 pixels: in NCHW each row is a line of its own (the next channel is another
    plane); in NHWC the next channel is the next element of the same lines, so the element
    bytes stand."""
    m = tsl.load_machine("x86-avx2")
    knobs = dict(h_inner=7, w_inner=1, co_inner=1, co_outer=1, ci_inner=1, reduce_rows=True,
                 parallel_axes="co", stages=1)
    got = {}
    for layout in ("NCHW", "NHWC"):
        op = tsl.ops.conv2d(1, 256, 14, 14, 64, 3, 3, stride=2, padding=1, layout=layout)
        s = tsl.schedule(op, m, knobs=knobs)
        a = next(st for st in s.stages if st.operand == "A" and st.level.name == "l1")
        got[layout] = model.cost.cache_reuse(s, a)
    assert got["NCHW"][0] == got["NHWC"][0]
    assert got["NHWC"][1] == 15 * 3 * 4
    assert got["NCHW"][1] == 14 * 64  # the 14 rows of the input (the 15th is padding)


def test_a_tile_reused_across_the_inner_part_of_a_fused_loop_is_filled_once_per_outer_part():
    """ResNet-18's 512x7x7 3x3 conv, every block loop fused into the parallel loop (n, then
    row and channel blocks in the order `outer` gives): a core runs consecutive iterations, so
    with the channel blocks outermost each block's weights (590 KB) stay in the 2 MiB L2 over
    the 7 rows -- 16 fills, not one per iteration of the fused loop (112) -- and the model
    prices that order below the one that streams the weights once per row."""
    m = tsl.load_machine("x86-avx512")
    op = tsl.ops.conv2d(1, 512, 7, 7, 512, 3, 3, padding=1)
    knobs = dict(ci_inner=1, co_inner=2, co_outer=1, h_inner=1, parallel_axes="n_oh_co",
                 reduce_rows=True, stages=1, w_inner=7)
    fills, seconds = {}, {}
    for outer in ("oh", "co"):
        s = tsl.schedule(op, m, knobs=dict(knobs, outer=outer))
        b = next(st for st in s.stages if st.operand == "B" and st.level.name == "l2")
        fills[outer] = model.cost.cache_reuse(s, b)
        seconds[outer] = model.evaluate(s).seconds
    assert fills["co"] == (16, 512 * 9 * 32 * 4) and fills["oh"] == (16 * 7, 512 * 9 * 32 * 4)
    assert seconds["co"] < seconds["oh"]


def test_one_estimate_type_on_every_back_end():
    op = tsl.ops.matmul(128, 128, 128, dtype="int8")
    vta_est = tsl.build(tsl.ops.dense(4, 64, 32, dtype="int8", epilogue=EP), "vta").estimate()
    assert isinstance(vta_est, Estimate) and vta_est.kind == "simulated" and vta_est.cycles > 0
    assert vta_est.stats.gemm_uops > 0  # the back end's detail reads as an attribute
    for target in ("tpu-v5e", "tensorcore-sm80"):
        est = tsl.build(op, target).estimate()
        assert isinstance(est, Estimate) and est.kind == "model" and est.seconds > 0
    est = model.evaluate(tsl.schedule(op, "vta"))
    assert est.kind == "model" and est.bound and 0 < est.utilization <= 1
    with pytest.raises(ValueError, match="kind"):
        Estimate(1.0, kind="guessed")


def test_back_ends_import_nothing_above_them():
    root = Path(tsl.__file__).parent / "backends"
    for f in root.rglob("*.py"):
        text = f.read_text()
        for m in re.finditer(r"^\s*from\s+(?:\.\.\.|tsl\b)(\S*)\s+import\s+(.+)$", text, re.M):
            module = m.group(1).lstrip(".").split(".")[0] or m.group(2)
            assert not re.search(r"\b(tune|bench|build)\b", module), f"{f}: {m.group(0)}"


def test_spearman():
    assert model_check.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1)
    assert model_check.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1)
    assert list(model_check.ranks([5, 1, 5, 2])) == [2.5, 0, 2.5, 1]


@pytest.fixture(scope="module")
def vta_check():
    return model_check.check_op(conv(c=32, hw=8, k=32), "vta", n=20)


FLOOR = 0.8  # the floor for VTA cycles


def test_model_ranks_knob_settings_like_the_vta_simulator(vta_check):
    """VTA cycles are deterministic: the floor is the issue's, on a small layer."""
    row = vta_check
    assert row["n"] == 20 and row["kind"] == "simulated"
    assert row["spearman"] >= FLOOR, row
    assert row["default_vs_best"] <= 1.1, row


@pytest.mark.parametrize("permute", ["reversed", "shuffled", "swap halves"])
def test_the_spearman_floor_fails_a_model_that_ranks_wrongly(vta_check, permute):
    """The floor is a real one: the model's predictions for the same settings, permuted
    (backwards, in an arbitrary order, the faster half swapped with the slower), fall below
    it against the same simulated cycles."""
    pred = vta_check["model_seconds"]
    sim = [t[0] for t in vta_check["seconds"]]
    order = sorted(range(len(pred)), key=pred.__getitem__)
    half = len(order) // 2
    moved = {"reversed": order[::-1],
             "shuffled": [order[(7 * i) % len(order)] for i in range(len(order))],
             "swap halves": order[half:] + order[:half]}[permute]
    wrong = [0.0] * len(pred)
    for src, dst in zip(order, moved):
        wrong[dst] = pred[src]
    assert model_check.spearman(wrong, sim) < FLOOR


def test_model_check_measures_cpu_settings_consistently():
    """The CPU row of `--model-check`: settings drawn, built, each timed `rounds` times, and
    the noise statistics in range. How well the model ranks them is a timing and belongs to
    the bench (`python -m tsl.bench --model-check --targets cpu`), not to an assertion here:
    the deterministic ranking check is the VTA simulator's above."""
    backend, machine = resolve_target("cpu")
    if backend.unavailable(machine):
        pytest.skip(backend.unavailable(machine))
    row = model_check.check_op(tsl.ops.matmul(96, 96, 96), "cpu", n=12, rounds=2)
    assert row["kind"] == "measured" and row["n"] == 12, row
    assert all(len(t) == 2 and min(t) > 0 for t in row["seconds"]), row
    assert len(row["model_seconds"]) == 12 and min(row["model_seconds"]) > 0, row
    assert -1 <= row["spearman"] <= 1 and -1 <= row["retest"] <= 1, row
    assert 0 <= row["resolved"] <= 1 and row["noise"] >= 0 and row["default_vs_best"] >= 1, row


def test_bench_trials_and_model_check_flags():
    from tsl.bench.__main__ import main

    assert main(["--targets", "vta", "--quick", "--ops", "dense", "--trials", "0"]) == 0
    rows = model_check.run(["vta"], {"dense"}, True, 8, lambda msg: None)
    assert rows and all(r["kind"] == "simulated" and r["n"] == 8 for r in rows)
    tpu = model_check.run(["tpu-v5e"], {"dense"}, True, 4, lambda msg: None)
    assert tpu == [{"target": "tpu-v5e", "skipped": "its measure is the model itself"}]


def test_transfers_are_built_by_keyword_and_priced_by_kind_not_label():
    """A `Transfer` is built by keyword (14 fields, most numbers of one type), and what the
    model does with it follows its `TransferKind`, whatever label a back end gives it: the
    TPU kernel's program priced with every label replaced costs the same."""
    import dataclasses

    from tsl.model import Program, Transfer, TransferKind, program_of

    with pytest.raises(TypeError):
        Transfer(TransferKind.TILE, "A", "vmem", "hbm", 1, 128)
    s = tsl.schedule(tsl.ops.matmul(256, 384, 512, dtype="bfloat16"), "tpu-v5e")
    prog = program_of(s)
    kinds = {t.kind for t in prog.transfers}
    assert {TransferKind.TILE, TransferKind.WRITE_BACK} <= kinds
    blind = dataclasses.replace(prog, transfers=tuple(
        dataclasses.replace(t, what=f"path {i}") for i, t in enumerate(prog.transfers)))
    assert isinstance(blind, Program)
    assert model.evaluate(s, program=blind).seconds == model.evaluate(s, program=prog).seconds


def _launches(s) -> int:
    """How many times the schedule's parallel loops start: once per iteration of the loops
    around each."""
    return sum(math.prod(o.extent for o in s.loops[:i])
               for i, lp in enumerate(s.loops) if lp.parallel)


def test_parallel_launches_are_priced_so_the_stem_conv_starts_its_cores_once():
    """ResNet-18's stem (3->64 7x7 s2): with parallel launches free in the AVX-512 machine
    file the model spread the 2 channel blocks over the cores inside the 112-row loop, waking
    and joining the thread pool 112 times a call (2-3 us each on the 2-core Emerald Rapids:
    ~10% of the conv). With the file's launch cost it picks a nest that starts the cores once,
    and prices the nested one above it by the 111 extra launches."""
    m = tsl.load_machine("x86-avx512")
    op = tsl.ops.conv2d(1, 3, 224, 224, 64, 7, 7, stride=2, padding=3)
    chosen = tsl.schedule(op, m)
    assert _launches(chosen) == 1
    nested = tsl.schedule(op, m, knobs=dict(chosen.knob_values, outer="oh", co_outer=1,
                                           parallel_axes="co"))
    assert _launches(nested) == 112
    extra = model.evaluate(nested).seconds - model.evaluate(chosen).seconds
    assert extra >= 0.5 * 111 * m.compute_level("core").launch_cycles / m.clock_hz


def test_near_ties_go_to_the_tile_reading_the_fewest_operand_bytes():
    """The encoder's out-projection (128 x 768 -> 768) with and without a bias: every register
    tile of 8 or more accumulators is priced within 0.5% (compute bound); the search used to
    return whichever its sample met first (4x3 blocks without the bias, 8x2 with it, both
    measured slower than 8x3). Now both take the tile that reads the fewest operand bytes per
    MAC among the near ties, and no setting priced further from the best is picked."""
    m = tsl.load_machine("x86-avx512")
    tiles = set()
    for ep in (None, tsl.ops.bias()):
        s = tsl.schedule(tsl.ops.matmul(128, 768, 768, epilogue=ep), m)
        cands = s.choice.candidates
        best = min(c.estimate.seconds for c in cands)
        assert model.evaluate(s).seconds <= best * (1 + TIE)
        near = [c.schedule for c in cands if c.estimate.seconds <= best * (1 + TIE)]
        assert model.cost.operand_bytes_per_mac(s) == min(map(model.cost.operand_bytes_per_mac,
                                                                near))
        tiles.add((s.knob_values["m_inner"], s.knob_values["n_inner"]))
    assert tiles == {(8, 3)}
    s43 = tsl.schedule(tsl.ops.matmul(128, 768, 768), m, knobs=dict(m_inner=4, n_inner=3))
    assert model.cost.operand_bytes_per_mac(s43) == pytest.approx((4 * 4 + 3 * 64) / (12 * 16))
