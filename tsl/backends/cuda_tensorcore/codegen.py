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
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path

from ...errors import BackendUnavailable, LoweringError, ScheduleError


@dataclass(frozen=True)
class Kernel:
    name: str
    source: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int  # pass at launch (opt in above 48 KiB)
    static_shared_bytes: int
    fragment_bytes: int  # wmma fragments / mma.sync registers of one warp
    params: tuple[tuple[str, str], ...]  # (name, dtype) in launch order, inputs then output
    # A split reduction is two kernels: the GEMM's partial sums go to a workspace in global
    # memory (name, dtype, elements: allocated by whoever launches), then `after` (launched
    # next, in order) sums them and applies the epilogue. The source holds all of them.
    workspace: tuple[tuple[str, str, int], ...] = ()
    after: tuple["Kernel", ...] = ()

    @property
    def shared_bytes(self) -> int:
        return self.dynamic_shared_bytes + self.static_shared_bytes

    def launch(self) -> dict:
        """kernel.json's launch facts: this kernel's at the top level; in "launches" every
        kernel of the sequence in order (name, grid, block, dynamic shared memory, its
        arguments by name: the operator's tensors and the workspaces), in "workspace" the
        buffers to allocate."""
        d = asdict(self)
        for key in ("source", "after", "workspace"):
            d.pop(key)
        d["kernel"] = d.pop("name")
        d["launches"] = [{"kernel": k.name, "grid": list(k.grid), "block": list(k.block),
                          "dynamic_shared_bytes": k.dynamic_shared_bytes,
                          "args": [n for n, _ in k.params]} for k in (self, *self.after)]
        d["workspace"] = [{"name": n, "dtype": dt, "elements": e} for n, dt, e in self.workspace]
        return d


def target(arch: str):
    import tvm

    return tvm.target.Target({"kind": "cuda", "arch": arch})


def generate(mod, machine) -> Kernel:
    """CUDA source and launch facts of the scheduled module `mod` for `machine`."""
    import tvm
    from tvm import tirx
    from tvm.tirx.build import codegen_build, split_host_device_mods

    tgt = target(machine.params.arch)
    config = {"tirx.use_async_copy": bool(machine.params.cp_async)}
    try:
        with tvm.transform.PassContext(config=config):
            mod = tirx.transform.BindTarget(tgt.with_host(tvm.target.Target({"kind": "llvm"})))(mod)
            pipeline, _, finalize_device = tirx.get_default_tir_pipeline(tgt)
            host, devices = split_host_device_mods(pipeline(mod))
            dev = finalize_device()(next(iter(devices.values())))
            # The host launches the kernels in program order.
            order = re.findall(r'call_ffi_kernel\("(\w+)"', host.script())
            kernels = sorted(_kernels(dev), key=lambda k: order.index(k.name))
            for k in kernels:
                check_fits(k, machine)
            source = shared_loads(codegen_build(dev, tgt).inspect_source())
    except (ScheduleError, LoweringError):
        raise
    except Exception as e:  # noqa: BLE001 - TVM's error classes vary by pass
        from ...lower import _first_line

        raise LoweringError(f"CUDA code generation for {machine.name} failed: "
                            f"{_first_line(e)}") from e
    first, *after = (replace(k, source=source) for k in kernels)
    args = {f"{p.name}_ptr" for p in mod["main"].params}
    work = _workspaces(mod)
    workspace = tuple((n, dt, work[_plain(n.removesuffix("_ptr"))])
                      for k in kernels for n, dt in k.params if n not in args)
    return replace(first, workspace=tuple(dict.fromkeys(workspace)), after=tuple(after))


def _workspaces(mod) -> dict[str, int]:
    """Elements of each global buffer the function allocates (a split reduction's partial
    sums), by name."""
    import math

    root = mod["main"].body.block
    return {_plain(b.name): math.prod(int(d) for d in b.shape) for b in root.alloc_buffers
            if b.scope() == "global"}


def _plain(name: str) -> str:
    return name.replace(".", "_")


# nvcc compiles nvcuda::wmma::load_matrix_sync of bf16 fragments to a generic-address
# wmma.load (LD + MOVM in SASS, not LDSM) even when the pointer is into shared memory. Every
# fragment load of this back end reads shared memory, so it goes through tsl_load_shared,
# which names the state space for bf16 (fp16 / int8 loads already get it from nvcc).
_BF16_LOAD = r"""
#define TSL_BF16_LOAD(USE, LAYOUT, OP, LAY)                                                     \
__device__ __forceinline__ void tsl_load_shared(                                                \
    nvcuda::wmma::fragment<nvcuda::wmma::USE, 16, 16, 16, nv_bfloat16, nvcuda::wmma::LAYOUT>& f, \
    const nv_bfloat16* p, unsigned ldm) {                                                      \
  unsigned* r = reinterpret_cast<unsigned*>(f.x);                                               \
  asm volatile("wmma.load." OP ".sync.aligned." LAY ".m16n16k16.shared.bf16 "                 \
               "{%0, %1, %2, %3}, [%4], %5;"                                                   \
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                                 \
               : "r"((unsigned)__cvta_generic_to_shared(p)), "r"(ldm));                         \
}
TSL_BF16_LOAD(matrix_a, row_major, "a", "row")
TSL_BF16_LOAD(matrix_a, col_major, "a", "col")
TSL_BF16_LOAD(matrix_b, row_major, "b", "row")
TSL_BF16_LOAD(matrix_b, col_major, "b", "col")
template <class F, class T>
__device__ __forceinline__ void tsl_load_shared(F& f, const T* p, unsigned ldm) {
  nvcuda::wmma::load_matrix_sync(f, p, ldm);
}
"""


# One 32-bit register of an 8-bit mma.sync B fragment from four bytes of a [K, N] shared
# tile, k to k + 3 of one column (intrinsics._lds_b): one store of the register, so that the
# fragment array stays in registers (byte stores would put it in local memory).
_LDS4 = r"""
__device__ __forceinline__ void tsl_lds4(signed char* warp, int offset, const signed char* p,
                                         int stride) {
  *reinterpret_cast<unsigned*>(warp + offset) =
      (unsigned)(unsigned char)p[0] | (unsigned)(unsigned char)p[stride] << 8 |
      (unsigned)(unsigned char)p[2 * stride] << 16 | (unsigned)(unsigned char)p[3 * stride] << 24;
}
"""


def shared_loads(source: str) -> str:
    """`source` with its fragment loads through tsl_load_shared (see _BF16_LOAD), and the
    helpers it calls (_LDS4)."""
    start = source.index('extern "C" __global__')
    helpers = _BF16_LOAD + (_LDS4 if "tsl_lds4(" in source else "")
    return (source[:start] + helpers + source[start:].replace(
        "nvcuda::wmma::load_matrix_sync(", "tsl_load_shared("))


def _kernels(dev) -> list["Kernel"]:
    """Launch facts and on-chip footprint of each device function in `dev`."""
    return [_kernel(gv, func) for gv, func in dev.functions.items()]


def _kernel(gv, func) -> "Kernel":
    import tvm
    import tvm_ffi
    from tvm import tirx

    extents = {f"{k}.{a}": 1 for k in ("blockIdx", "threadIdx") for a in "xyz"}
    scopes: dict[str, int] = {}

    def on_attr(node):
        if node.attr_key == "thread_extent":
            extents[node.node.thread_tag] = int(node.value)

    def on_alloc(node):
        n = tvm.DataType(node.buffer.dtype).bits // 8
        for d in node.buffer.shape:
            n *= int(d)
        scope = node.buffer.scope()
        scopes[scope] = scopes.get(scope, 0) + n

    tvm_ffi.structural_walk(func.body, [(tirx.AttrStmt, on_attr), (tirx.AllocBuffer, on_alloc)])
    # wmma fragments and mma.sync's operand arrays ("warp") are the whole warp's; TVM lowers
    # the accumulators to "local" arrays, each thread's own
    fragments = (sum(v for k, v in scopes.items() if k.startswith("wmma.") or k == "warp")
                 + 32 * scopes.get("local", 0))
    return Kernel(gv.name_hint, "", tuple(extents[f"blockIdx.{a}"] for a in "xyz"),
                  tuple(extents[f"threadIdx.{a}"] for a in "xyz"),
                  scopes.get("shared.dyn", 0), scopes.get("shared", 0), fragments,
                  tuple((p.name, _pointee(p)) for p in func.params))


def check_fits(k: "Kernel", machine) -> None:
    """ScheduleError when the kernel's shared memory, fragment registers or threads exceed the
    machine (checked on the lowered TIR, before CUDA is generated)."""
    smem = machine.levels("scratchpad")[0]
    threads = k.block[0] * k.block[1] * k.block[2]
    regs = k.fragment_bytes // 4 // 32  # 32-bit registers per thread
    max_regs = int(machine.params.max_registers_per_thread)
    problems = []
    if k.shared_bytes > smem.capacity:
        problems.append(f"shared memory {k.shared_bytes} B ({k.dynamic_shared_bytes} B staged "
                        f"tiles x pipeline stages + {k.static_shared_bytes} B epilogue tiles) "
                        f"exceeds level {smem.name!r} ({smem.capacity} B) by "
                        f"{k.shared_bytes - smem.capacity} B")
    if regs > max_regs:
        problems.append(f"fragments need {regs} registers per thread, over the "
                        f"{max_regs} a thread can have")
    if threads > int(machine.params.max_threads_per_block):
        problems.append(f"{threads} threads per block")
    if problems:
        raise ScheduleError(f"the schedule does not fit {machine.name}: " + "; ".join(problems)
                            + ". Use smaller tiles (m_inner/n_inner/k_inner knobs; for conv2d "
                            "w_inner/co_inner/ci_inner) or fewer pipeline stages")


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


_REGS = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK = re.compile(r"(\d+) bytes stack frame")  # local memory: arrays indexed at run time
# ptxas -v: one section per entry function, from its "Compiling entry function" line on.
_FUNCTION = re.compile(r"Compiling entry function '(\w+)'(.*?)(?=Compiling entry function|\Z)",
                       re.S)


def compile_cuda(source: str, arch: str, first: str | None = None) -> tuple[str, bytes, dict]:
    """nvcc `source` to PTX for `arch` (e.g. "sm_90"), then ptxas to a cubin. Returns (ptx,
    cubin, ptxas' report {registers, static_shared_bytes, spill_bytes, stack_bytes, functions,
    log}): registers and static shared bytes of kernel `first` (default: the one ptxas
    reports first), spills and stack frames (local memory) of all, and per kernel in
    `functions`."""
    exe = require_nvcc()
    ptxas = str(Path(exe).with_name("ptxas"))
    with tempfile.TemporaryDirectory() as tmp:
        cu, ptx, cubin = (Path(tmp, f"kernel.{x}") for x in ("cu", "ptx", "cubin"))
        cu.write_text(source)
        for cmd in ([exe, "-ptx", f"-arch={arch}", "-O3", "-std=c++17", "-o", str(ptx), str(cu)],
                    [ptxas, "-v", f"-arch={arch}", "-O3", "-o", str(cubin), str(ptx)]):
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode:
                raise LoweringError(f"{Path(cmd[0]).name} for {arch} failed:\n"
                                    f"{res.stderr[-3000:]}")
        log = (res.stderr + res.stdout).strip()
        functions = {}
        for name, part in _FUNCTION.findall(log):
            regs, smem, spill = _REGS.search(part), _SMEM.search(part), _SPILL.search(part)
            stack = _STACK.search(part)
            functions[name] = {"registers": int(regs.group(1)) if regs else 0,
                               "static_shared_bytes": int(smem.group(1)) if smem else 0,
                               "spill_bytes": sum(map(int, spill.groups())) if spill else 0,
                               "stack_bytes": int(stack.group(1)) if stack else 0}
        if not functions:
            raise LoweringError(f"ptxas -v for {arch} reported no entry function:\n{log}")
        report = {**functions.get(first, next(iter(functions.values()))),
                  "spill_bytes": sum(f["spill_bytes"] for f in functions.values()),
                  "stack_bytes": sum(f["stack_bytes"] for f in functions.values()),
                  "functions": functions, "log": log}
        return ptx.read_text(), cubin.read_bytes(), report
