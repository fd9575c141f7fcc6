"""Lowered TIR -> one CUDA kernel (source + launch facts) -> PTX / cubin through nvcc.

TVM generates the CUDA C source without a GPU; what the host side would pass at launch (grid,
block, dynamic shared memory, parameter order) is read from the device function's TIR, so the
kernel can be launched by any CUDA runtime (CuPy's RawModule in `benchmarks/`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from ...errors import BackendUnavailable, LoweringError


@dataclass(frozen=True)
class Kernel:
    name: str
    source: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int
    params: tuple[tuple[str, str], ...]  # (name, dtype) in launch order, inputs then output

    def launch(self) -> dict:
        d = asdict(self)
        d.pop("source")
        return d


def target(arch: str):
    import tvm

    return tvm.target.Target({"kind": "cuda", "arch": arch})


def generate(mod, machine) -> Kernel:
    """CUDA source and launch facts of the scheduled module `mod` for `machine`."""
    import tvm
    import tvm_ffi
    from tvm import tirx
    from tvm.tirx.build import codegen_build, split_host_device_mods

    tgt = target(machine.params["arch"])
    config = {"tirx.use_async_copy": bool(machine.params.get("cp_async", False))}
    try:
        with tvm.transform.PassContext(config=config):
            mod = tirx.transform.BindTarget(tgt.with_host(tvm.target.Target({"kind": "llvm"})))(mod)
            pipeline, _, finalize_device = tirx.get_default_tir_pipeline(tgt)
            _, devices = split_host_device_mods(pipeline(mod))
            dev = finalize_device()(next(iter(devices.values())))
            source = codegen_build(dev, tgt).inspect_source()
    except Exception as e:  # noqa: BLE001 - TVM's error classes vary by pass
        from ...lower import _first_line

        raise LoweringError(f"CUDA code generation for {machine.name} failed: "
                            f"{_first_line(e)}") from e
    funcs = list(dev.functions.items())
    if len(funcs) != 1:
        raise LoweringError(f"expected one CUDA kernel, got {[g.name_hint for g, _ in funcs]}: "
                            f"every stage must be bound to blocks and threads")
    gv, func = funcs[0]
    extents = {"blockIdx.x": 1, "blockIdx.y": 1, "blockIdx.z": 1,
               "threadIdx.x": 1, "threadIdx.y": 1, "threadIdx.z": 1}
    dyn = [0]

    def on_attr(node):
        if node.attr_key == "thread_extent":
            extents[node.node.thread_tag] = int(node.value)

    def on_alloc(node):
        if node.buffer.scope() == "shared.dyn":
            n = 1
            for d in node.buffer.shape:
                n *= int(d)
            dyn[0] = max(dyn[0], n * tvm.DataType(node.buffer.dtype).bits // 8)

    tvm_ffi.structural_walk(func.body, [(tirx.AttrStmt, on_attr), (tirx.AllocBuffer, on_alloc)])
    params = tuple((p.name, _pointee(p)) for p in func.params)
    return Kernel(gv.name_hint, source,
                  tuple(extents[f"blockIdx.{a}"] for a in "xyz"),
                  tuple(extents[f"threadIdx.{a}"] for a in "xyz"), dyn[0], params)


def _pointee(var) -> str:
    return str(var.ty.element_type.dtype) if hasattr(var.ty, "element_type") else str(var.dtype)


# -- nvcc ---------------------------------------------------------------------------------------
@cache
def nvcc() -> str | None:
    return shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")


def require_nvcc() -> str:
    path = nvcc()
    if path is None:
        raise BackendUnavailable("nvcc not found: install the CUDA toolkit (12.x or newer) and "
                                 "put nvcc on PATH to compile PTX/cubin")
    return path


_PTXAS = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def compile_cuda(source: str, arch: str, kind: str = "ptx") -> tuple[bytes, dict]:
    """nvcc `source` to "ptx" or "cubin" for `arch` (e.g. "sm_90"); returns the output and, for
    a cubin, ptxas' resource report {registers, static_shared_bytes, spill_bytes}."""
    exe = require_nvcc()
    with tempfile.TemporaryDirectory() as tmp:
        cu, out = Path(tmp, "k.cu"), Path(tmp, f"k.{kind}")
        cu.write_text(source)
        cmd = [exe, f"-{kind}", f"-arch={arch}", "-O3", "-std=c++17", "-o", str(out), str(cu)]
        if kind == "cubin":
            cmd[3:3] = ["-Xptxas", "-v"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            raise LoweringError(f"nvcc -{kind} for {arch} failed:\n{res.stderr[-3000:]}")
        report = {}
        if kind == "cubin":
            log = res.stderr + res.stdout
            regs, smem, spill = _PTXAS.search(log), _SMEM.search(log), _SPILL.search(log)
            report = {"registers": int(regs.group(1)) if regs else 0,
                      "static_shared_bytes": int(smem.group(1)) if smem else 0,
                      "spill_bytes": sum(map(int, spill.groups())) if spill else 0,
                      "log": log.strip()}
        return out.read_bytes(), report
