"""What `target="cpu"` means on this host, machine files for hosts this one is not (cross-compiled,
their assembly read), and `python -m tsl.backends.cpu detect | probe`."""

import dataclasses
import os
import subprocess
import sys

import pytest

import tsl
from tsl import ops
from tsl.backends.cpu import suite
from tsl.backend import get_backend
from tsl.errors import BackendUnavailable
from tsl.backends.cpu import detect, host

from conftest import cross_cpu_machines

# Mnemonics the primitives' instruction kinds must become, per architecture and dtype.
ASM = {("x86_64", "float32"): "vfmadd", ("aarch64", "float32"): "fmla",
       ("x86_64", "int8"): ("vpmaddwd", "vpdpbusd"),
       ("aarch64", "int8"): ("smmla", "sdot", "smlal")}


def test_detect_picks_a_runnable_machine_with_the_hosts_cores():
    m = detect()
    h = host.info()
    assert host.missing(m) == []
    assert m.cores() == h.cores == len(os.sched_getaffinity(0))
    assert m.notes and any(m.name in n or "forced" in n for n in m.notes)
    l1 = host.info().cache(1)
    if l1 is not None:
        assert m.levels("operand", "A")[-1].capacity == l1.bytes
    assert tsl.build(ops.matmul(8, 8, 8), "cpu").machine.name == m.name


def test_tsl_cpu_forces_a_machine_and_refuses_one_the_host_cannot_run(monkeypatch):
    base = min(host.runnable(), key=lambda m: len(m.params.require))
    monkeypatch.setenv("TSL_CPU", base.name)
    assert detect().name == base.name
    assert tsl.build(ops.matmul(8, 8, 8), "cpu").machine.name == base.name
    foreign = "aarch64-neon" if host.info().arch == "x86_64" else "x86-avx2"
    monkeypatch.setenv("TSL_CPU", foreign)
    with pytest.raises(BackendUnavailable, match=rf"cannot run machine {foreign}.*lacks"):
        tsl.build(ops.matmul(8, 8, 8), "cpu")


@pytest.mark.parametrize("name", [n for n in cross_cpu_machines()])
def test_a_machine_this_host_cannot_run_is_refused_and_names_one_that_works(name):
    with pytest.raises(BackendUnavailable, match=r"lacks .* machines it runs: \[.+\]"):
        tsl.build(ops.matmul(8, 8, 8), name)


@pytest.mark.parametrize("name", [n for n in cross_cpu_machines()])
def test_cross_compiled_machines_emit_their_instructions(name):
    m = tsl.load_machine(name)
    arch = m.params.arch
    for dtype in ("float32", "int8"):
        art = tsl.build(ops.matmul(37, 50, 64, dtype=dtype), name, cross=True)
        asm = art.source("asm")
        want = ASM[(arch, dtype)]
        assert any(w in asm for w in ((want,) if isinstance(want, str) else want)), name
        p = art.schedule.primitive
        if p.intrinsic:
            assert p.intrinsic in art.source("ll")
        with pytest.raises(BackendUnavailable, match="cross-compiled"):
            art.run(*art.op.random_inputs())


def test_the_default_suite_cross_compiles_for_aarch64():
    """Every default-suite operator built for AArch64 with dotprod, read in its assembly."""
    for op in suite.suite(quick=False):
        art = tsl.build(op, "aarch64-neon-dotprod", cross=True)
        asm = art.source("asm")
        want = "sdot" if op.dtype == "int8" else "fmla"
        assert asm.count(want) >= 4, f"{op}: {want} missing"


AARCH64 = [m.name for m in host.cpu_machines() if m.params.arch == "aarch64"]


def _emulatable(name):
    from tsl.backends.cpu import emulator

    why = emulator.unavailable(tsl.load_machine(name))
    if why:
        pytest.skip(why)


@pytest.mark.parametrize("name", AARCH64)
def test_aarch64_code_runs_right_under_qemu(name):
    """The cross-compiled default suite (quick) plus shapes off every tile, executed by QEMU on
    a CPU model with only the file's features, against NumPy on random data."""
    if host.info().arch == "aarch64":
        pytest.skip("this host runs AArch64 natively: test_cpu.py runs these machines")
    _emulatable(name)
    cases = suite.suite(quick=True) + [ops.matmul(37, 50, 64, dtype="int8"),
                                       ops.matmul(29, 43, 71, dtype="float32"),
                                       ops.matmul(33, 40, 24, dtype="bfloat16")]
    cases += [ops.conv2d(1, 48, 9, 10, 24, 3, 3, stride=st, padding=1, layout="NHWC", dtype=dt)
              for st, dt in ((1, "float32"), (2, "int8"))]  # activations in channel blocks
    for op in cases:
        ok, err = tsl.build(op, name, cross=True).emulate().verify(seed=3)
        assert ok, f"{name} {op}: error {err}"


def test_i8mm_keeps_2x2_blocks_exact_on_ragged_edges_under_qemu():
    """smmla's 2x2 int32 blocks with odd M and N (ragged blocks), the epilogue reading the
    blocks back, and conv2d's pairs of output pixels in both layouts, stride 2 (data split by
    column phase) and a width the stride does not divide, against NumPy on full-range int8."""
    if host.info().arch == "aarch64":
        pytest.skip("this host runs AArch64 natively: test_cpu.py runs these machines")
    _emulatable("aarch64-neon-i8mm")
    cases = [ops.dense(37, 50, 64, dtype="int8", epilogue=ops.bias() + ops.relu()),
             ops.batch_matmul(2, 19, 21, 40, dtype="int8"),
             ops.conv2d(1, 16, 9, 9, 10, 3, 3, stride=2, padding=1, dtype="int8"),
             ops.conv2d(1, 16, 9, 9, 10, 3, 3, padding=1, dtype="int8", layout="NHWC")]
    for op in cases:
        art = tsl.build(op, "aarch64-neon-i8mm", cross=True)
        assert art.schedule.primitive.instruction == "mmla"
        assert "smmla" in art.source("asm"), op
        ok, err = art.emulate().verify(seed=5)
        assert ok, f"{op}: error {err}"


def test_bfdot_under_qemu_matches_numpy_on_bf16_inputs():
    """bf16 through bfdot (the LLVM IR's i16 operands given to the bfloat overload,
    `codegen.bfloat_operands`), A packed inside the kernel and B by the artifact, off-tile,
    against NumPy's reference of the bf16 inputs."""
    if host.info().arch == "aarch64":
        pytest.skip("this host runs AArch64 natively: test_cpu.py runs these machines")
    _emulatable("aarch64-neon-i8mm")
    for op in [ops.dense(37, 50, 64, dtype="bfloat16", epilogue=ops.bias() + ops.relu()),
               ops.conv2d(1, 16, 9, 9, 10, 3, 3, stride=2, padding=1, dtype="bfloat16")]:
        art = tsl.build(op, "aarch64-neon-i8mm", cross=True)
        assert art.schedule.primitive.instruction == "dot2"
        assert "bfdot\tv" in art.source("asm"), op
        ok, err = art.emulate().verify(seed=5)
        assert ok and err < 1e-5, f"{op}: error {err}"


@pytest.mark.parametrize("name, cpu, dtype", [("aarch64-neon-dotprod", "cortex-a72", "int8"),
                                              ("aarch64-neon-i8mm", "neoverse-n1", "int8"),
                                              ("aarch64-neon-i8mm", "neoverse-n1", "bfloat16")])
def test_qemu_traps_an_instruction_the_cpu_model_lacks(name, cpu, dtype):
    """The emulated check is real: sdot code on a QEMU CPU without dotprod, smmla and bfdot
    code on one without i8mm and BF16, stop with SIGILL."""
    if host.info().arch == "aarch64":
        pytest.skip("this host runs AArch64 natively")
    _emulatable(name)
    m = tsl.load_machine(name)
    plain = dataclasses.replace(m, params=dataclasses.replace(m.params, qemu_cpu=cpu))
    art = tsl.build(ops.matmul(16, 16, 16, dtype=dtype), plain, cross=True).emulate()
    with pytest.raises(tsl.LoweringError, match="Illegal instruction"):
        art.verify()


@pytest.mark.parametrize("features, want", [
    ({"neon"}, "aarch64-neon"), ({"neon", "dotprod"}, "aarch64-neon-dotprod"),
    ({"neon", "dotprod", "bf16"}, "aarch64-neon-dotprod"),
    ({"neon", "dotprod", "i8mm", "bf16"}, "aarch64-neon-i8mm")])
def test_an_aarch64_host_gets_the_file_of_its_extensions(features, want):
    h = host.HostCPU("aarch64", "test", "neoverse-n2", frozenset(features), 4, ())
    assert host.runnable(h)[0].name == want


def test_detect_cli():
    out = subprocess.run([sys.executable, "-m", "tsl.backends.cpu", "detect"],
                         capture_output=True, text=True, check=True).stdout
    assert f"cpu -> {detect().name}" in out and "host:" in out
    assert "rates: built-in" in out  # the suite runs with TSL_PROBE=0 (conftest)


def test_probe_writes_a_machine_file_that_builds(tmp_path):
    from tsl.backends.cpu import hostmachine

    m, text = hostmachine.probe_file("probed-here")
    path = tmp_path / "probed.toml"
    path.write_text(text)
    loaded = tsl.load_machine(path)
    assert loaded.name == "probed-here" and loaded.cores() == host.info().cores
    for p in loaded.primitives:
        assert p.macs_per_cycle > 0
    assert "measured by `python -m tsl.backends.cpu probe`" in text.splitlines()[0]
    art = tsl.build(ops.matmul(33, 40, 50, dtype="int8"), loaded)
    assert art.verify()[0]


def test_writer_round_trips_every_builtin_machine(tmp_path):
    from tsl.tam.writer import dumps

    for name in tsl.machines():
        m = tsl.load_machine(name)
        p = tmp_path / f"{name}.toml"
        p.write_text(dumps(m, "round trip"))
        back = tsl.load_machine(p)
        assert dataclasses.replace(back, source=m.source) == m, name


@pytest.mark.parametrize("name", [n for n in cross_cpu_machines()])
def test_every_build_path_refuses_a_machine_this_host_cannot_run(name):
    """A back end's own `build` (what the Relax swap, the tuner's runner and the bench call)
    checks the host as `tsl.build` does, and builds with `cross=True`."""
    m = tsl.load_machine(name)
    s = tsl.schedule(ops.matmul(8, 8, 8), m)
    backend = get_backend(m.backend)
    with pytest.raises(BackendUnavailable, match=rf"cannot build for {name} here: .*lacks"):
        backend.build(s)
    assert backend.build(s, cross=True).machine.name == name
