"""This host's rates: the file's, its micro-architecture's ([params.uarch.*]), then the probe's,
cached per host; and no bench row above 100% of peak."""

import dataclasses
import json

import pytest

import tsl
from tsl import ops
from tsl.backends.cpu import detect, host, probe, rates
from tsl.bench import rows
from tsl.errors import TAMError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The probe on, its cache in tmp_path, nothing measured in this process yet."""
    monkeypatch.setenv(rates.ENV_CACHE, str(tmp_path))
    monkeypatch.setenv(rates.ENV_PROBE, "1")
    monkeypatch.setattr(rates, "_MEMO", {})
    return tmp_path


@pytest.fixture
def fake_probe(monkeypatch):
    """Measurements without timing: 4 GHz, every primitive at twice its file's MACs/cycle at
    that clock, the L3 -> L2 fill at 8 bytes per cycle; `calls` counts what was measured."""
    calls = []

    def rate(m, p):
        calls.append(p.name)
        return 2 * p.macs_per_cycle * 4e9

    monkeypatch.setattr(probe, "clock_hz", lambda m: calls.append("clock") or 4e9)
    monkeypatch.setattr(probe, "primitive_rate", rate)
    monkeypatch.setattr(probe, "fill_rate", lambda m: calls.append("fill") or 8 * 4e9)
    return calls


def test_first_use_probes_and_caches_then_reads_the_cache(cache, fake_probe):
    m = detect()
    assert m.provenance == "probed" and fake_probe[0] == "clock"
    assert m.clock_hz == 4e9
    base = detect(probe=False)
    for p, q in zip(m.primitives, base.primitives):
        assert p.macs_per_cycle == pytest.approx(2 * q.macs_per_cycle, rel=0.01)
    filled = probe.filled_level(m)
    if filled is not None:  # a host whose cores share an L3
        assert "fill" in fake_probe and m.memory_level(filled.name).bandwidth == 8
    f32 = max(p.macs_per_cycle for p in m.primitives if p.a_dtype == "float32")
    assert m.peak("float32") == pytest.approx(2 * m.cores() * 4e9 * f32, rel=1e-3)
    [path] = cache.glob("host-*.json")
    doc = json.loads(path.read_text())
    assert doc["key"] == rates.host_key(host.info()) and doc["clock_hz"] == 4e9
    n = len(fake_probe)
    rates._MEMO.clear()  # a new process: the file is read, nothing measured again
    assert detect().primitives == m.primitives and len(fake_probe) == n
    assert any(str(path) in note for note in m.notes)


def test_a_changed_host_or_version_measures_again(cache, fake_probe):
    detect()
    h = host.info()
    other = dataclasses.replace(h, cores=h.cores + 1)
    assert rates.cache_path(other) != rates.cache_path(h)
    path = rates.cache_path(h)
    doc = json.loads(path.read_text())
    doc["key"]["tsl"] = "0.0.0-old"
    path.write_text(json.dumps(doc))
    rates._MEMO.clear()
    n = len(fake_probe)
    detect()
    assert len(fake_probe) > n  # measured again, and the file rewritten with this key
    assert json.loads(path.read_text())["key"] == rates.host_key(h)


def test_tsl_probe_0_keeps_the_builtin_figures(cache, fake_probe, monkeypatch):
    monkeypatch.setenv(rates.ENV_PROBE, "0")
    m = detect()
    assert m.provenance.startswith("built-in") and fake_probe == []
    assert not list(cache.glob("host-*.json"))
    assert any("TSL_PROBE=0" in n for n in m.notes)


def test_rates_within_the_tolerance_keep_the_files():
    m = detect(probe=False)
    near = rates.Measurement(m.clock_hz * 1.05, {probe.signature(p): p.macs_per_cycle *
                                                 m.clock_hz * 0.95 for p in m.primitives})
    kept = rates.apply(m, near)
    assert kept.provenance == "built-in" and kept.primitives == m.primitives
    assert kept.clock_hz == m.clock_hz and kept.peaks == m.peaks
    far = rates.Measurement(m.clock_hz, {probe.signature(m.primitives[0]):
                                         m.primitives[0].macs_per_cycle * m.clock_hz * 1.5})
    moved = rates.apply(m, far)
    assert moved.provenance == "probed" and moved.memory == m.memory
    for p, q in zip(moved.primitives, m.primitives):  # primitives of one instruction move
        same = probe.signature(q) == probe.signature(m.primitives[0])
        assert p.macs_per_cycle == pytest.approx(q.macs_per_cycle * (1.5 if same else 1))


def test_a_measured_fill_rate_is_the_filled_levels_bandwidth_beyond_the_tolerance():
    """x86-avx512's L2 fills from the shared L3: a probe within 10% of the file's bytes per
    cycle keeps it, one further off replaces that level's bandwidth and nothing else's."""
    m = tsl.load_machine("x86-avx512")
    lv = probe.filled_level(m)
    assert lv is not None and lv.name == "l2"
    sigs = {probe.signature(p): p.macs_per_cycle * m.clock_hz for p in m.primitives}
    near = rates.apply(m, rates.Measurement(m.clock_hz, sigs, {"l2": lv.bandwidth * 1.05 *
                                                              m.clock_hz}))
    assert near.memory == m.memory and near.provenance == "built-in"
    far = rates.apply(m, rates.Measurement(m.clock_hz, sigs, {"l2": 25.0 * m.clock_hz}))
    assert far.memory_level("l2").bandwidth == 25.0 and far.provenance == "probed"
    assert [lv for lv in far.memory if lv.name != "l2"] == \
        [lv for lv in m.memory if lv.name != "l2"]
    assert any("l2 fill 25" in n for n in far.notes)
    assert probe.filled_level(tsl.load_machine("aarch64-neon")) is None  # no shared L3 there


def amd(family, model, **kw):
    return host.HostCPU("x86_64", "test", "znver3", frozenset({"avx2", "fma"}), 2, (),
                        kw.get("vendor", "AuthenticAMD"), family, model)


@pytest.mark.parametrize("h, want", [
    (amd(0x19, 0x21), ("znver3", 24.3)), (amd(0x19, 0x01), ("znver3", 24.3)),
    (amd(0x19, 0x11), ("znver4", 25.4)), (amd(0x17, 0x01), ("znver1", 8.0)),
    (amd(0x17, 0x31), None),  # Zen 2: not measured, the file's figures stand
    (amd(0x19, 0x21, vendor="GenuineIntel"), None), (amd(None, None), None)])
def test_the_avx2_file_has_rates_per_micro_architecture(h, want):
    m = tsl.load_machine("x86-avx2")
    got = rates.for_uarch(m, h)
    madd = got.primitive("int8").macs_per_cycle
    if want is None:
        assert got.provenance == "built-in" and got.primitives == m.primitives
        return
    name, rate = want
    assert got.provenance == f"built-in, {name} figures" and madd == pytest.approx(rate)
    assert got.peak("int8") == pytest.approx(2 * m.cores() * got.clock_hz * rate, rel=1e-3)
    assert any(n.startswith(f"{name} figures: ") for n in got.notes)  # with its source


def test_zen3_runs_madd_at_1_52x_its_fma_rate_and_zen1_at_1x():
    m = tsl.load_machine("x86-avx2")
    for h, ratio in ((amd(0x19, 0x21), 1.52), (amd(0x17, 0x08), 1.0)):
        got = rates.for_uarch(m, h)
        fma = got.primitive("float32").macs_per_cycle
        assert got.primitive("int8").macs_per_cycle / fma == pytest.approx(ratio, abs=0.01)


def test_a_bad_uarch_table_is_a_typed_error():
    m = tsl.load_machine("x86-avx2")
    uarch = dict(m.params.uarch)
    uarch["znver9"] = {"family": 0x1a, "models": [[0, 255]], "macs_per_cycle": {"nope": 1.0}}
    bad = dataclasses.replace(m, params=dataclasses.replace(m.params, uarch=uarch))
    with pytest.raises(TAMError, match=r"uarch\.znver9.*names no primitive.*nope"):
        rates.for_uarch(bad, amd(0x1a, 1))
    uarch["znver9"] = {"family": 0x1a, "models": [[0, 255]], "speed": 2}
    with pytest.raises(TAMError, match=r"uarch\.znver9.*macs_per_cycle required"):
        rates.for_uarch(dataclasses.replace(m, params=dataclasses.replace(m.params, uarch=uarch)),
                        amd(0x1a, 1))


def test_a_users_own_file_keeps_its_figures(tmp_path, cache, fake_probe):
    from tsl.tam.writer import dumps

    path = tmp_path / "mine.toml"
    path.write_text(dumps(tsl.load_machine(detect(probe=False).name), "mine"))
    m = rates.for_host(tsl.load_machine(path), host.info())
    assert m.provenance == "file" and fake_probe == []


def test_the_real_probe_measures_this_host(cache):
    m = detect(probe=False)
    clock = probe.clock_hz(m)
    assert 0.5e9 < clock < 8e9  # a dependent one-cycle chain runs at about the core clock
    p = m.primitive("float32")
    assert probe.primitive_rate(m, p) > 0.1 * p.macs_per_cycle * clock
    if probe.filled_level(m) is not None:
        # Streaming reads: at least a byte per cycle, at most a few cache lines per cycle.
        assert clock < probe.fill_rate(m) < 256 * clock


def test_no_bench_row_prints_more_than_100_percent_of_peak(cache, monkeypatch):
    from tsl.backends.cpu import runtime
    from tsl.bench.report import fmt

    monkeypatch.setattr(runtime, "SETTLE_SECONDS", 0.0)
    m = detect()  # probed: this host's peaks
    for op in (ops.matmul(96, 80, 64), ops.matmul(96, 80, 64, dtype="int8")):
        art = tsl.build(op, m)
        row = {"op": op.name, "shape": op.shape_str, "dtype": op.dtype, "target": m.name,
               "verified": True, **art.benchmark(rounds=1)}
        row.update(rows.roofline_fields(art, row))
        assert row["pct_peak"] <= 100 and row["rates"] == m.provenance
        over = row["rate"] > m.peak(op.dtype)
        assert bool(row.get("peak_under_read")) == over
        assert fmt(row)[7].endswith("!") == over
    # A peak that under-reads the machine (a probe timed on a busy host) is exceeded: the row
    # says so instead of printing 100+%.
    low = dataclasses.replace(m, peaks={d: 1e6 for d in m.peaks})
    got = rows.peak_fields(low, "float32", {"rate": 5e6, "pct_peak": 500.0})
    assert got["pct_peak"] == 100.0 and got["peak_under_read"] == pytest.approx(5.0)
    assert "peak_under_read" not in rows.peak_fields(m, "float32", {"rate": 1.0,
                                                                   "pct_peak": 1e-9})
