"""Back ends: the plug-in interface and the registry.

A back end is found through the `tsl.backends` entry-point group (so a third party can ship
one); the built-in four are also known by module path, so a source checkout works without
installing. `tsl.build` resolves a target name: a back end's name ("cpu", "vta") builds for its
default machine, a machine name ("tpu-v5e") builds for the back end its file names.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from .errors import BackendUnavailable
from .tam import Machine, builtin_names, load

BUILTIN = {"cpu": "tsl.backends.cpu:backend", "vta": "tsl.backends.vta:backend",
           "tpu": "tsl.backends.tpu:backend",
           "cuda_tensorcore": "tsl.backends.cuda_tensorcore:backend"}


class Backend:
    """What a back end provides, and all that `tsl.build`, `tsl.tune` and `tsl.bench` use:

    - `build(schedule)` -> an `Artifact` (whose `estimate()` is a `tsl.model.Estimate`);
    - `unavailable(machine)` -> why it cannot build here, or None;
    - `check(schedule)` -> raises ScheduleError for what it cannot lower beyond the TAM;
    - `measure(artifact)` -> an `Estimate` of one run: measured time (kind "measured"),
      simulated cycles ("simulated"), or, where nothing here can run it, the model ("model");
    - `suite(quick)` -> the operators `python -m tsl.bench` runs on it.

    A back end imports nothing above this layer (no tsl.build, tsl.tune or tsl.bench).
    """

    name: str = ""
    default_machine: str = ""
    # Programs `python -m tsl.bench` searches per operator by default (`--trials` overrides):
    # worth it where `measure` is cheap and exact, as a simulator's cycle count is.
    bench_trials: int = 0

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

    def unavailable(self, machine: Machine, **options) -> str | None:
        """Why this back end cannot build for `machine` here with these build options (None
        when it can)."""
        return None

    def build(self, schedule, **options):
        raise NotImplementedError

    def check(self, schedule) -> None:
        """Raise ScheduleError when this back end cannot lower `schedule` for limits beyond
        the TAM's capacities (the model's knob search skips such settings)."""

    def measure(self, artifact):
        """An `Estimate` of one run of `artifact`; by default its own `estimate()`."""
        return artifact.estimate()

    def suite(self, quick: bool) -> list:
        """The operators of this back end's rows in `python -m tsl.bench` (quick: a few)."""
        return []


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
