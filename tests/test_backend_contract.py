"""The back-end contract: every back end types its build options, so a misspelled keyword of
`tsl.build` is an OptionError naming the valid ones instead of a knob silently ignored."""

import pytest

import tsl
from tsl import ops
from tsl.backend import Backend, get_backend
from tsl.errors import OptionError, TSLError

# (target, the options it takes, a misspelling of one)
TARGETS = [("cpu", ["cross"], "corss"), ("vta", ["cthreads"], "cthread"),
           ("tpu", ["emitter"], "emiter"), ("cuda_tensorcore", ["wgmma"], "wgmmma")]


@pytest.mark.parametrize("target,valid,typo", TARGETS)
def test_a_misspelled_build_option_is_a_typed_error_naming_the_valid_ones(target, valid, typo):
    with pytest.raises(OptionError) as e:
        tsl.build(ops.matmul(32, 32, 32, dtype="int8"), target, **{typo: True})
    assert isinstance(e.value, TSLError) and typo in str(e.value)
    for name in valid:
        assert name in str(e.value)


@pytest.mark.parametrize("target,valid,typo", TARGETS)
def test_every_back_end_declares_its_options_as_a_frozen_dataclass(target, valid, typo):
    be = get_backend(target)
    assert isinstance(be, Backend)
    opts = be.options()
    assert [f for f in type(opts).__dataclass_fields__] == valid
    with pytest.raises(AttributeError):  # frozen
        setattr(opts, valid[0], None)


def test_a_bool_option_refuses_a_value_of_another_type():
    with pytest.raises(OptionError, match="cross"):
        get_backend("cpu").options(cross="yes")


def test_a_back_end_without_build_cannot_be_made():
    class Half(Backend):
        name = "half"

    with pytest.raises(TypeError):
        Half()


def test_codegen_capabilities_are_declared_by_the_back_end_not_the_machine():
    """What a back end's programs do with the movers (VTA: rows one by one, at a pitch, copies
    kept and shared) is the back end's, read by the schedules of its machines, and no field
    of a machine's movers."""
    import dataclasses

    from tsl.tam import Mover
    from tsl.tam.capabilities import Capabilities

    vta = get_backend("vta").capabilities
    assert vta == Capabilities(serial_rows=True, row_pitch=True, keeps_tiles=True,
                               shares_tiles=True)
    for name in ("cpu", "tpu", "cuda_tensorcore"):
        assert get_backend(name).capabilities == Capabilities()
    assert tsl.schedule(ops.matmul(32, 32, 32, dtype="int8"), "vta").capabilities is vta
    names = {f.name for f in dataclasses.fields(Capabilities)}
    assert not names & {f.name for f in dataclasses.fields(Mover)}


def test_the_bench_runs_the_detected_machine_by_the_back_ends_name_and_every_other_machine():
    from tsl.backend import get_backend, registry, targets
    from tsl.bench.__main__ import default_targets
    from tsl.tam.loader import load as load_machine

    detected = [b for b in registry() if get_backend(b).host_detected]
    assert detected == ["cpu"]
    want = detected + [t for t in targets() if load_machine(t).backend != "cpu"]
    assert default_targets() == want
