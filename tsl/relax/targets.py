"""TVM targets <-> tsl machines.

`machine_for` answers "which TAM does this TVM target mean": an `llvm` target is the host CPU
(`tsl.backends.cpu.detect`), a `cuda` target with `arch` sm_80 / sm_90 is the Tensor Core machine of that
generation. tsl's own names ("cpu", "tensorcore-sm90", a Machine) are accepted too.
`tvm_target` is the other direction: the TVM target a model should be compiled for so that tsl's
kernels and TVM's own code both use the machine's instructions.
"""

from __future__ import annotations

from ..backend import get_backend, registry, resolve_target
from ..errors import BackendUnavailable
from ..tam import Machine, builtin_names

# CUDA compute capability -> Tensor Core machine file.
CUDA_ARCH = {"sm_80": "tensorcore-sm80", "sm_86": "tensorcore-sm80", "sm_89": "tensorcore-sm80",
             "sm_90": "tensorcore-sm90", "sm_90a": "tensorcore-sm90"}


def _known() -> str:
    return (f"a TVM target of kind 'llvm' (the host CPU) or 'cuda' with arch in "
            f"{sorted(CUDA_ARCH)}, or a tsl target {sorted(registry())} / {builtin_names()}")


def _tsl_name(target) -> bool:
    return isinstance(target, str) and (target in registry() or target in builtin_names()
                                        or target.endswith(".toml"))


def as_tvm_target(target):
    """`target` (a TVM Target, its JSON dict or a kind string) as a TVM Target."""
    import tvm

    if isinstance(target, tvm.target.Target):
        return target
    try:
        return tvm.target.Target(target)
    except Exception as e:  # noqa: BLE001 - TVM raises ValueError or its own error types
        raise BackendUnavailable(f"{target!r} is not a target tsl knows: expected "
                                 f"{_known()} (TVM said: {str(e).strip().splitlines()[-1]})") from e


def machine_for(target) -> Machine:
    """The tsl machine that kernels for `target` are scheduled for."""
    if isinstance(target, Machine):
        return target
    if _tsl_name(target):
        return resolve_target(target)[1]
    t = as_tvm_target(target)
    kind = t.kind.name
    if kind == "llvm":
        return resolve_target("cpu")[1]
    if kind == "cuda":
        arch = str(t.attrs.get("arch", ""))
        if arch in CUDA_ARCH:
            return resolve_target(CUDA_ARCH[arch])[1]
        raise BackendUnavailable(f"cuda target with arch {arch or '(none)'!r} has no tsl machine; "
                                 f"set arch to one of {sorted(CUDA_ARCH)}")
    raise BackendUnavailable(f"TVM target kind {kind!r} has no tsl machine; known: {_known()}")


def tir_pipeline(target) -> str:
    """The `tir_pipeline` to pass `tvm.compile` with `tvm_target(target)`, as the back end says
    (`Backend.relax_tir_pipeline`: tsl's own CPU pipeline, which its kernels need to run as
    fast as `tsl.build`'s; TVM's default elsewhere and for a TVM Target)."""
    if not (isinstance(target, Machine) or _tsl_name(target)):
        return "default"
    m = machine_for(target)
    return get_backend(m.backend).relax_tir_pipeline(m)


def tvm_target(target):
    """The TVM Target to compile a model with for `target`, as its back end says
    (`Backend.tvm_target`: for a CPU machine the host's LLVM CPU with the machine file's vector
    features; for a Tensor Core machine cuda with its arch and an llvm host). A TVM Target
    passed in is returned as it is."""
    if not (isinstance(target, Machine) or _tsl_name(target)):
        return as_tvm_target(target)
    m = machine_for(target)
    return get_backend(m.backend).tvm_target(m)
