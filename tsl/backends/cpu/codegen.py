"""Lowered TIR -> an LLVM module for the host."""

from __future__ import annotations

from functools import cache

from ...errors import BackendUnavailable, LoweringError


@cache
def host_cpu() -> str:
    from tvm.target import codegen

    return codegen.llvm_get_system_cpu()


def missing_features(required) -> list[str]:
    import tvm
    from tvm.target import codegen

    tgt = tvm.target.Target({"kind": "llvm", "mcpu": host_cpu()})
    return [f for f in required if not codegen.llvm_cpu_has_features(f, tgt)]


def target(machine):
    import tvm

    mcpu = machine.params.get("mcpu", "native")
    missing = missing_features(machine.params.get("require", []))
    if missing:
        raise BackendUnavailable(f"machine {machine.name} needs CPU features {missing}, which "
                                 f"this host ({host_cpu()}) lacks; use a machine file without "
                                 f"them in [params] require")
    return tvm.target.Target({"kind": "llvm", "mcpu": host_cpu() if mcpu == "native" else mcpu,
                              "num-cores": machine.cores()})


def compile_module(mod, machine):
    import tvm

    tgt = target(machine)
    try:
        return tvm.compile(mod, target=tgt)
    except Exception as e:  # noqa: BLE001 - TVM's error classes vary by pass
        from ...lower import _first_line

        raise LoweringError(f"LLVM code generation for {machine.name} failed: "
                            f"{_first_line(e)}") from e
