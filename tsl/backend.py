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
    """What a back end provides. `build` returns an `Artifact`."""

    name: str = ""
    default_machine: str = ""

    def default(self) -> Machine:
        """The machine the back end's name means (a CPU back end: the host's)."""
        return load(self.default_machine)

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
