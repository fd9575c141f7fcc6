"""TSL primitives: the recorded loop nest, and every ScheduleError path."""

import pytest

import tsl
from tsl import ScheduleError
from tsl.primitives import Schedule


@pytest.fixture
def s(cpu):
    return Schedule(tsl.ops.matmul(100, 64, 48), cpu)


def test_tile_pads_outermost_and_names_loops(s):
    i, j, k = s.loops
    i0, i1, i2 = s.tile(i, 32, 8)
    assert [lp.name for lp in (i0, i1, i2)] == ["i.0", "i.1", "i.2"]
    assert (i0.extent, i1.extent, i2.extent) == (4, 4, 8)
    assert s.padded_extents()["i"] == 128
    j0, j1 = s.tile(j, 16)
    assert s.padded_extents()["j"] == 64 and j0.extent == 4


def test_tile_errors(s):
    i, j, k = s.loops
    with pytest.raises(ScheduleError, match=r"tile\(i, \(24, 16\)\): 16 does not divide 24"):
        s.tile(i, 24, 16)
    i0, i1 = s.tile(i, 32)
    with pytest.raises(ScheduleError, match="does not divide the loop's span 32"):
        s.tile(i1, 12)
    with pytest.raises(ScheduleError, match="positive ints"):
        s.tile(j, 0)
    f = s.fuse(*s.loops[:2])
    with pytest.raises(ScheduleError, match="fused loop cannot be tiled"):
        s.tile(f, 2)


def test_reorder_fuse(s):
    i, j, k = s.loops
    s.reorder(k, i, j)
    assert [lp.name for lp in s.loops] == ["k", "i", "j"]
    with pytest.raises(ScheduleError, match="adjacent"):
        s.fuse(k, j)
    f = s.fuse(i, j)
    assert f.extent == 100 * 64 and s.loops[-1] is f
    with pytest.raises(ScheduleError, match="named twice"):
        s.reorder(k, k)


def test_reorder_keeps_axis_order(s):
    i, j, k = s.loops
    i0, i1 = s.tile(i, 10)
    with pytest.raises(ScheduleError, match="inside a finer loop"):
        s.reorder(i1, i0)


def test_stale_loop(s):
    i, j, k = s.loops
    s.tile(i, 10)
    with pytest.raises(ScheduleError, match="not a current loop"):
        s.reorder(i, j)


def test_parallel(s, cpu):
    i, j, k = s.loops
    p = s.parallel([i, j], "core")
    assert p.parallel == "core" and p.extent == 6400
    with pytest.raises(ScheduleError, match="reduction loop"):
        s.parallel(k, "core")


def test_split_reduction_lets_the_outer_reduction_loop_run_in_parallel(s):
    """split_reduction marks the outermost loop of the reduction; only that one may run in
    parallel, and C may be staged inside it (each part has its own partial sums)."""
    i, j, k = s.loops
    with pytest.raises(ScheduleError, match="not a reduction loop"):
        s.split_reduction(i)
    k0, k1 = s.tile(k, 16)
    with pytest.raises(ScheduleError, match="only the outermost loop of axis k"):
        s.split_reduction(k1)
    with pytest.raises(ScheduleError, match="reduction loop"):
        s.parallel(k0, "core")
    s.split_reduction(k0)
    with pytest.raises(ScheduleError, match="one reduction loop at most"):
        s.split_reduction(k0)
    s.reorder(k0, i, j, k1)
    p = s.parallel([k0, i], "core")
    assert s.split_parts == 3 and p.extent == 300 and not s.reduces(p) and s.reduces(k1)
    assert "split_reduction(k.0)" in str(s)


def test_parallel_absent_level_is_serial_and_recorded(s):
    i, j, k = s.loops
    assert s.parallel([i, j], "subcore") is None
    assert "serial: machine has no subcore level" in str(s)


def test_cache_capacity_error_names_tile_level_and_bytes(cpu):
    s = Schedule(tsl.ops.matmul(256, 256, 256), cpu)
    i, j, k = s.loops
    i0, i1 = s.tile(i, 32)
    j0, j1 = s.tile(j, 32)
    s.reorder(i0, j0, i1, j1, k)
    with pytest.raises(ScheduleError) as e:
        s.cache("C", "accumulator", at=j0)   # 32x32 fp32 = 4096 B > 1536 B of zmm
    msg = str(e.value)
    assert "cache('C', 'accumulator', at=j.0)" in msg
    assert "'zmm'" in msg and "4096 bytes" in msg and "2560 bytes over" in msg




def test_pipeline_depth_checked(cpu):
    s = Schedule(tsl.ops.matmul(64, 256, 2048), cpu)
    i, j, k = s.loops
    k0, k1 = s.tile(k, 1024)
    s.reorder(k0, i, j, k1)
    s.cache("B", "scratchpad", at=k0)  # 256 x 1024 x 4 = 1 MiB: fits 2 MiB once
    with pytest.raises(ScheduleError, match=r"pipeline\(k.0, 3\).*l2.*bytes over"):
        s.pipeline(k0, 3)
    with pytest.raises(ScheduleError, match="stages must be an int >= 1"):
        s.pipeline(k0, 0)


def test_cache_errors(s):
    i, j, k = s.loops
    with pytest.raises(ScheduleError, match="operand must be 'A', 'B' or 'C'"):
        s.cache("D", "scratchpad", at=i)
    s.reorder(k, i, j)
    with pytest.raises(ScheduleError, match="outside every reduction loop"):
        s.cache("C", "accumulator", at=i)
    assert s.cache("C", "operand", at=i) is None   # the CPU has no operand level for C


def test_tensorize_shape_checked(cpu):
    s = Schedule(tsl.ops.matmul(64, 64, 64), cpu)
    i, j, k = s.loops
    j0, j1 = s.tile(j, 8)
    s.reorder(i, j0, k, j1)
    with pytest.raises(ScheduleError, match=r"\(m, n, k\) = \(1, 8, 64\) but the primitive is 1x16x1"):
        s.tensorize(k)
    i0, i1 = s.tile(i, 2)
    with pytest.raises(ScheduleError, match="two m-loops"):
        s.tensorize(i0)


def test_tensorize_without_primitive():
    m = tsl.load_machine("x86-avx512")
    with pytest.raises(ScheduleError, match="no tensor primitive for operands of float16"):
        tsl.schedule(tsl.ops.matmul(32, 32, 32, dtype="float16"), m)


def test_knob(s):
    assert s.knob("t", (4, 8), 8) == 8
    s2 = Schedule(s.op, s.machine, knobs={"t": 5})
    with pytest.raises(ScheduleError, match=r"knob\('t'\): value 5 is not one of its choices"):
        s2.knob("t", (4, 8))
    with pytest.raises(ScheduleError, match="at least one choice"):
        s.knob("u", ())


def test_pack_errors(s):
    with pytest.raises(ScheduleError, match="only inputs"):
        s.pack("C")


def test_default_schedule_records_roles(cpu):
    s = tsl.schedule(tsl.ops.matmul(512, 512, 512), cpu)
    text = str(s)
    assert "tensorize(i.3, 'fma_1x16x1_f32')" in text
    assert "cache('C', 'accumulator', j.1) -> ['zmm']" in text
    assert s.primitive.name == "fma_1x16x1_f32"
