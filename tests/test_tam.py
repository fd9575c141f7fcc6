"""Loading machine files: every built-in one, and every error path of the loader."""

import dataclasses
import subprocess
import sys
import textwrap

import pytest

import tsl
from tsl.errors import TAMError
from tsl.tam import writer

GOOD = """
[machine]
name = "toy"
backend = "cpu"
clock_hz = 1e9

[[compute]]
name = "core"
role = "core"
count = 1

[[memory]]
name = "dram"
role = "global"
capacity = "1 GiB"
holds = ["A", "B", "C"]

[[memory]]
name = "spad"
role = "scratchpad"
capacity = "64 KiB"
holds = ["A", "B"]

[[memory]]
name = "acc"
role = "accumulator"
parent = "dram"
capacity = 4096
holds = ["C"]

[[primitive]]
name = "mm"
kind = "matmul"
m = 1
n = 16
k = 1
a_dtype = "float32"
b_dtype = "float32"
acc_dtype = "float32"
a_level = "spad"
b_level = "spad"
c_level = "acc"
"""


def write(tmp_path, text, name="toy.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


@pytest.mark.parametrize("name", tsl.machines())
def test_builtin_machines_load(name):
    m = tsl.load_machine(name)
    assert m.name == name
    assert m.memory[0].role == "global"
    assert m.primitives, "every built-in machine has a tensor primitive"
    header = open(m.source).read().lstrip()
    assert header.startswith("#"), "machine files open with a comment on sources and limits"


def test_required_machines_present():
    assert {"x86-avx512", "vta-1x16x16", "tpu-v4", "tpu-v5e", "tensorcore-sm80",
            "tensorcore-sm90"} <= set(tsl.machines())


def test_good_file_and_lookups(tmp_path):
    m = tsl.load_machine(write(tmp_path, GOOD))
    assert m.memory_level("spad").capacity == 64 * 1024
    assert m.memory_level("spad").parent == "dram"
    assert m.memory_level("acc").parent == "dram"
    assert m.levels("scratchpad", "A")[0].name == "spad"
    assert m.levels("scratchpad", "C") == ()
    assert m.primitive("float32").name == "mm"
    assert m.primitive("int8") is None


@pytest.mark.parametrize("edit, where", [
    (lambda t: t.replace('clock_hz = 1e9', 'clock_hz = 1e9\ncolour = "red"'), "[machine] key 'colour'"),
    (lambda t: t.replace('name = "toy"\n', ''), "[machine] key 'name': missing"),
    (lambda t: t.replace('capacity = "64 KiB"', 'capacity = "2 GiB"'), "key 'capacity'"),
    (lambda t: t.replace('a_level = "spad"', 'a_level = "l9"'), "key 'a_level'"),
    (lambda t: t.replace('a_dtype = "float32"', 'a_dtype = "float33"'), "key 'a_dtype'"),
    (lambda t: t.replace('role = "scratchpad"', 'role = "cache"'), "key 'role'"),
    (lambda t: t.replace('holds = ["A", "B"]', 'holds = ["A", "X"]'), "key 'holds'"),
    (lambda t: t.replace('count = 1', 'count = 0'), "key 'count'"),
    (lambda t: t.replace('capacity = 4096', 'capacity = "4 parsecs"'), "key 'capacity'"),
    (lambda t: t.replace('parent = "dram"', 'parent = "nowhere"'), "key 'parent'"),
    (lambda t: t + '\n[extras]\nx = 1\n', "[extras]"),
    (lambda t: t + '\n[peaks]\nfloat99 = 1.0\n', "[peaks] key 'float99'"),
    (lambda t: t.replace('[machine]', '[machine]\n', 1).replace('m = 1\n', ''), "key 'm': missing"),
])
def test_loader_errors_name_file_table_key(tmp_path, edit, where):
    p = write(tmp_path, edit(GOOD))
    with pytest.raises(TAMError) as e:
        tsl.load_machine(p)
    assert "toy.toml" in str(e.value)
    assert where in str(e.value)


MOVER = """
[[mover]]
name = "dma"
src = "dram"
dst = "spad"
latency = 64
"""


@pytest.mark.parametrize("key", ["serial_rows", "row_pitch", "keeps_tiles", "shares_tiles"])
def test_a_mover_with_a_codegen_capability_says_it_is_the_back_ends(tmp_path, key):
    """The four codegen capabilities machine files used to give movers: the loader says
    where they live now instead of an unknown key."""
    assert tsl.load_machine(write(tmp_path, GOOD + MOVER)).movers[0].latency == 64
    with pytest.raises(TAMError) as e:
        tsl.load_machine(write(tmp_path, GOOD + MOVER + f"{key} = true\n"))
    assert f"[mover #0] key '{key}'" in str(e.value) and "Backend.capabilities" in str(e.value)


def test_not_toml_and_unknown_names(tmp_path):
    with pytest.raises(TAMError, match="not valid TOML"):
        tsl.load_machine(write(tmp_path, "[machine\nname="))
    with pytest.raises(TAMError, match="unknown machine 'x86-avx999'"):
        tsl.load_machine("x86-avx999")
    with pytest.raises(TAMError, match="no such machine file"):
        tsl.load_machine(tmp_path / "missing.toml")


def test_first_level_must_be_global(tmp_path):
    bad = GOOD.replace('role = "global"', 'role = "scratchpad"', 1)
    with pytest.raises(TAMError, match="outermost"):
        tsl.load_machine(write(tmp_path, bad))


def test_machines_are_immutable(cpu):
    with pytest.raises(AttributeError):
        cpu.clock_hz = 1.0


def test_show_cli():
    out = subprocess.run([sys.executable, "-m", "tsl.tam", "show", "x86-avx512"],
                         capture_output=True, text=True, check=True).stdout
    assert "vnni_1x16x4" in out and "accumulator" in out
    out = subprocess.run([sys.executable, "-m", "tsl.tam", "show", "tpu-v5e"],
                         capture_output=True, text=True, check=True).stdout
    assert "sources:" in out and "K3: grid_step_cycles is CALIBRATED" in out
    err = subprocess.run([sys.executable, "-m", "tsl.tam", "show", "nope"],
                         capture_output=True, text=True)
    assert err.returncode == 2 and "unknown machine" in err.stderr


def test_params_are_typed_per_back_end():
    m = tsl.load_machine("tensorcore-sm80")
    assert type(m.params).__name__ == "TensorCoreParams"
    assert m.params.smem_bytes_per_sm == 167936 and m.params.split_k == (1, 2, 4, 8)
    assert tsl.load_machine("x86-avx2").params.require == ("avx2", "fma")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.params.arch = "sm_90"


@pytest.mark.parametrize("params, where", [
    ('[params]\nmtripel = "x86_64-linux-gnu"\n', "[params] key 'mtripel': unknown key"),
    ('[params]\nrequire = "avx2"\n', "[params] key 'require': expected a list"),
    ('[params]\npipeline_stages = "two"\n', "[params] key 'pipeline_stages': expected int"),
])
def test_params_errors_name_file_key_and_valid_keys(tmp_path, params, where):
    with pytest.raises(TAMError) as e:
        tsl.load_machine(write(tmp_path, GOOD + params))
    assert "toy.toml" in str(e.value) and where in str(e.value)
    if "unknown" in where:
        assert "valid keys are" in str(e.value) and "'mtriple'" in str(e.value)


def test_missing_required_params_are_listed(tmp_path):
    text = GOOD.replace('backend = "cpu"', 'backend = "tpu"') + "[params]\ngeneration = 4\n"
    with pytest.raises(TAMError, match=r"toy.toml: \[params\] key\(s\) \['mxu_count'"):
        tsl.load_machine(write(tmp_path, text))


def test_unknown_back_end_is_named(tmp_path):
    with pytest.raises(TAMError, match="key 'backend': no back end named 'abacus'"):
        tsl.load_machine(write(tmp_path, GOOD.replace('backend = "cpu"', 'backend = "abacus"')))


@pytest.mark.parametrize("name", tsl.machines())
def test_writer_round_trips_every_builtin_machine(tmp_path, name):
    m = tsl.load_machine(name)
    back = tsl.load_machine(write(tmp_path, writer.dumps(m), f"{name}.toml"))
    assert dataclasses.replace(back, source=m.source) == m


CHILD = """
[machine]
name = "toy-big"
extends = "toy.toml"
clock_hz = 2e9

[sources]
clock = "a made-up figure"

[[memory]]
name = "spad"
capacity = "128 KiB"

[[primitive]]
replaces = "mm"
name = "mm4"
k = 4
"""


def test_extends_merges_tables_and_entries_by_name(tmp_path):
    write(tmp_path, GOOD)
    m = tsl.load_machine(write(tmp_path, CHILD, "big.toml"))
    base = tsl.load_machine(tmp_path / "toy.toml")
    assert (m.name, m.backend, m.clock_hz) == ("toy-big", "cpu", 2e9)
    assert m.memory_level("spad").capacity == 128 << 10
    assert [lv.name for lv in m.memory] == [lv.name for lv in base.memory]
    assert [p.name for p in m.primitives] == ["mm4"] and m.primitives[0].shape == (1, 16, 4)
    assert m.sources == {"clock": "a made-up figure"}


def test_extends_errors_name_the_key(tmp_path):
    write(tmp_path, GOOD)
    with pytest.raises(TAMError, match=r"big.toml: \[\[primitive\]\] 'mm4' key 'replaces'"):
        tsl.load_machine(write(tmp_path, CHILD.replace('replaces = "mm"', 'replaces = "mx"'),
                               "big.toml"))
    write(tmp_path, GOOD.replace('name = "toy"', 'name = "toy"\nextends = "big.toml"'))
    with pytest.raises(TAMError, match="a cycle"):
        tsl.load_machine(write(tmp_path, CHILD, "big.toml"))


def test_aarch64_files_hold_only_what_differs():
    for name in ("aarch64-neon-dotprod", "aarch64-neon-i8mm"):
        m = tsl.load_machine(name)
        text = open(m.source).read()
        assert 'extends = "aarch64-neon"' in text and text.count("\n") < 60
        assert m.memory == tsl.load_machine("aarch64-neon").memory and m.sources
