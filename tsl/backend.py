"""Back ends: the plug-in interface and the registry.

A back end is found through the `tsl.backends` entry-point group (so a third party can ship
one); the built-in four are also known by module path, so a source checkout works without
installing. `tsl.build` resolves a target name: a back end's name ("cpu", "vta") builds for its
default machine, a machine name ("tpu-v5e") builds for the back end its file names.
"""

from __future__ import annotations

import dataclasses
import importlib
from abc import ABC, abstractmethod
from importlib.metadata import entry_points

from .errors import BackendUnavailable, OptionError
from .tam import Machine, builtin_names, load
from .tam import capabilities as codegen_capabilities
from .tam import params as machine_params

BUILTIN = {"cpu": "tsl.backends.cpu:backend", "vta": "tsl.backends.vta:backend",
           "tpu": "tsl.backends.tpu:backend",
           "cuda_tensorcore": "tsl.backends.cuda_tensorcore:backend"}


@dataclasses.dataclass(frozen=True)
class Options:
    """The build options of a back end (`tsl.build(op, target, **options)`): each back end
    derives its own frozen dataclass, one field per keyword it takes, so a misspelled keyword
    is an `OptionError` naming the valid ones instead of a knob silently ignored."""

    @classmethod
    def parse(cls, backend: str, given: dict) -> "Options":
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(given) - set(valid))
        if unknown:
            raise OptionError(f"the {backend} back end takes no build option "
                              f"{', '.join(unknown)}; its options are "
                              f"{', '.join(valid) if valid else '(none)'}")
        for f in dataclasses.fields(cls):
            # Annotations are strings here (`from __future__ import annotations`).
            if f.name in given and f.type in ("bool", bool) and \
                    not isinstance(given[f.name], bool):
                raise OptionError(f"the {backend} back end's option {f.name} is True or "
                                  f"False, got {given[f.name]!r}")
        return cls(**given)


class Backend(ABC):
    """What a back end provides, and all that `tsl.build`, `tsl.tune` and `tsl.bench` use:

    - `Options`: its build options, a frozen `Options` dataclass (`options(**kw)` checks them);
    - `Params`: the typed [params] of its machine files (`tsl.tam.params.Params`, declared in
      the back end's `machine.py`), checked when a machine file is loaded;
    - `capabilities`: what its programs do with the machine's movers
      (`tsl.tam.capabilities.Capabilities`), read by the schedule's capacity checks and the
      cost model;
    - `build(schedule, **options)` -> an `Artifact` (whose `estimate()` is a
      `tsl.model.Estimate`), through the back end's `_build(schedule, options)`;
    - `unavailable(machine, options)` -> why it cannot build here, or None;
    - `check(schedule)` -> raises ScheduleError for what it cannot lower beyond the TAM;
    - `measure(artifact)` -> an `Estimate` of one run: measured time (kind "measured"),
      simulated cycles ("simulated"), or, where nothing here can run it, the model ("model");
    - `suite(quick)` -> the operators `python -m tsl.bench` runs on it;
    - `relax_options(machine)` -> the build options of a kernel inside a Relax model;
    - `tvm_target(machine)` -> the TVM Target a Relax model is compiled with for `machine`
      (what `tsl.relax` asks, so the bridge names no back end);
    - `relax_offload(machine)` -> True where a Relax model's layers run as calls of the back
      end's programs in its simulator, the rest on the host CPU (`tsl.relax.run_vta`);
    - `baseline(op, machine)` -> the artifact of the baseline program the back end is compared
      with for `op` (VTA: the classic TVM tiles), or None.

    A back end imports nothing above this layer (no tsl.build, tsl.tune or tsl.bench).
    """

    name: str = ""
    default_machine: str = ""
    Options: type[Options] = Options
    Params: type[machine_params.Params] = machine_params.Params
    capabilities: codegen_capabilities.Capabilities = codegen_capabilities.NONE
    # Programs `python -m tsl.bench` searches per operator by default (`--trials` overrides):
    # worth it where `measure` is cheap and exact, as a simulator's cycle count is.
    bench_trials: int = 0
    # True where `measure` is a simulation (kind "simulated"): exact and deterministic, so
    # a family's plan is priced by it (`tsl.dynamic.simulated`), not by the model.
    simulated: bool = False
    # True where the back end's name means the machine detected on this host (`default`): the
    # bench then runs that name, not every built-in machine of the back end.
    host_detected: bool = False

    def default(self) -> Machine:
        """The machine the back end's name means (a CPU back end: the host's)."""
        return load(self.default_machine)

    def vector_facts(self, machine: Machine):
        """The vector unit facts `tsl.relax.schedule_rest` schedules the non-tsl functions with:
        register width (lanes x the unit's first dtype's bits) and cores, from the machine file."""
        from .schedules.vector import VectorFacts

        v = machine.vectors[0]
        bits = int("".join(c for c in v.dtypes[0] if c.isdigit()) or 32)
        return VectorFacts(vector_bits=v.lanes * bits, cores=machine.cores())

    def for_host(self, machine: Machine) -> Machine:
        """`machine` as this back end runs it here (a CPU back end: the host's core count and
        caches when the host runs it)."""
        return machine

    def options(self, **given) -> Options:
        """`given` as this back end's `Options`; OptionError for a keyword it does not take."""
        return self.Options.parse(self.name, given)

    def unavailable(self, machine: Machine, options: Options | None = None) -> str | None:
        """Why this back end cannot build for `machine` here with these build options (None
        when it can)."""
        return None

    def require(self, machine: Machine, options: Options) -> None:
        """BackendUnavailable, naming what is missing, when `unavailable` gives a reason."""
        why = self.unavailable(machine, options)
        if why:
            raise BackendUnavailable(f"cannot build for {machine.name} here: {why}")

    def build(self, schedule, **options):
        """The artifact of `schedule` built with `options` (checked against `Options`);
        every build path comes through here, so each meets `unavailable`'s check (a CPU
        artifact this host cannot execute is refused, not compiled and crashed later)."""
        checked = self.options(**options)
        self.require(schedule.machine, checked)
        return self._build(schedule, checked)

    @abstractmethod
    def _build(self, schedule, options):
        """The artifact of `schedule` with checked `options` (an instance of `Options`)."""

    def check(self, schedule) -> None:
        """Raise ScheduleError when this back end cannot lower `schedule` for limits beyond
        the TAM's capacities (the model's knob search skips such settings)."""

    def measure(self, artifact):
        """An `Estimate` of one run of `artifact`; by default its own `estimate()`."""
        return artifact.estimate()

    def suite(self, quick: bool) -> list:
        """The operators of this back end's rows in `python -m tsl.bench` (quick: a few)."""
        return []

    def relax_options(self, machine: Machine) -> dict:
        """The build options of a kernel `tsl.relax` puts inside a Relax model (by default
        none: the artifact `tsl.build` makes is what the model calls)."""
        return {}

    def relax_layouts(self, machine: Machine) -> tuple:
        """The activation layouts this back end's conv kernels may exchange inside a Relax
        model, the first the graph's own (`tsl.relax.channels_last` plans the others where
        the cost model says so). By default only NCHW: nothing is planned."""
        return ("NCHW",)

    def relax_tir_pipeline(self, machine: Machine) -> str:
        """The name of the TIR pipeline `tvm.compile` lowers a Relax model's functions with for
        `machine` (its `tir_pipeline`): TVM's default, unless the back end registers its own
        (passes its `tsl.build` kernels get too)."""
        return "default"

    def tvm_target(self, machine: Machine):
        """The TVM Target to compile a whole Relax model with for `machine`, so that tsl's
        kernels and TVM's own code both use the machine's instructions."""
        raise BackendUnavailable(f"machine {machine.name} ({self.name}) is not compiled through "
                                 f"TVM's Relax pipeline")


    def relax_offload(self, machine: Machine) -> bool:
        """True where `tsl.relax.pipeline(machine)` partitions a model: its layers become calls
        of this back end's programs (run in its simulator), the rest compiles for the host."""
        return False

    def baseline(self, op, machine: Machine):
        """The baseline program of `op` that rows compare with (None: no baseline)."""
        return None


def _load_ref(ref: str) -> Backend:
    mod, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(mod), attr)
    except ImportError as e:
        raise BackendUnavailable(f"back end {ref} could not be imported: {e}") from e


def registry() -> dict[str, str]:
    refs = dict(BUILTIN)
    for ep in entry_points(group="tsl.backends"):
        refs[ep.name] = ep.value
    return refs


def get_backend(name: str) -> Backend:
    refs = registry()
    if name not in refs:
        raise BackendUnavailable(f"no back end named {name!r}; known back ends are "
                                 f"{sorted(refs)}")
    return _load_ref(refs[name])


def resolve_target(target: str | Machine) -> tuple[Backend, Machine]:
    """(back end, machine) for a back-end name, a machine name, a .toml path or a Machine."""
    if isinstance(target, Machine):
        return get_backend(target.backend), target
    if target in registry():
        be = get_backend(target)
        return be, be.default()
    machine = load(target)
    be = get_backend(machine.backend)
    return be, be.for_host(machine)


def targets() -> list[str]:
    """Every built-in machine name (each is a valid `target=`)."""
    return builtin_names()


def _params_of(name: str) -> type[machine_params.Params] | None:
    refs = registry()
    return _load_ref(refs[name]).Params if name in refs else None


# Back ends found by name (None: no such back end) for the capability lookup, which the knob
# search makes for every schedule it prices: the registry reads the installed packages' entry
# points each time (8 ms). The capabilities themselves are read from the back end each time.
_found: dict[str, Backend | None] = {}


def _capabilities_of(name: str) -> codegen_capabilities.Capabilities | None:
    if name not in _found:
        refs = registry()
        _found[name] = _load_ref(refs[name]) if name in refs else None
    be = _found[name]
    return be.capabilities if be is not None else None


# The TAM loader checks a machine file's [params] against its back end's class, and the
# schedule and the cost model read its capabilities; neither names a back end itself, so the
# registry tells them.
machine_params.set_finder(_params_of)
codegen_capabilities.set_finder(_capabilities_of)
