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


# Tiles up to this size live on the stack. TVM moves every CPU allocation above 1 KiB to a
# workspace pool (TVMBackendAllocWorkspace/Free in every parallel task), which costs an
# accumulator tile of 24 registers about 7% of an int8 GEMM's time.
STACK_TILE_BYTES = 32 * 1024
PIPELINE = "tsl_cpu"


@cache
def _register_pipeline() -> None:
    import numpy as np
    import tvm
    import tvm_ffi
    from tvm import tirx
    from tvm.s_tir import pipeline as s_tir_pipeline

    def on_stack(node):
        buf = node.buffer
        if buf.scope() != "global" or not all(isinstance(d, tirx.IntImm) for d in buf.shape):
            return node
        nbytes = int(np.prod([int(d) for d in buf.shape])) * buf.dtype.bits * buf.dtype.lanes // 8
        if nbytes > STACK_TILE_BYTES:
            return node
        return tirx.AllocBuffer(buf, annotations={**dict(node.annotations),
                                                  "disable_lower_builtin": tirx.IntImm("bool", 1)})

    @tvm.transform.module_pass(opt_level=0, name="tsl.StackTiles")
    def stack_tiles(mod, _ctx):
        for gv, f in list(mod.functions.items()):
            if isinstance(f, tirx.PrimFunc):
                mod[gv] = f.with_body(tvm_ffi.structural_map(f.body, [(tirx.AllocBuffer, on_stack)]))
        return mod

    def factory():
        passes, finalize_host, finalize_device = s_tir_pipeline.default_s_tir_pipeline()
        return (passes, lambda: tvm.transform.Sequential([stack_tiles, finalize_host()]),
                finalize_device)

    tirx.register_tir_pipeline(PIPELINE, factory)


def compile_module(mod, machine):
    import tvm

    tgt = target(machine)
    _register_pipeline()
    try:
        return tvm.compile(mod, target=tgt, tir_pipeline=PIPELINE)
    except Exception as e:  # noqa: BLE001 - TVM's error classes vary by pass
        from ...lower import _first_line

        raise LoweringError(f"LLVM code generation for {machine.name} failed: "
                            f"{_first_line(e)}") from e
