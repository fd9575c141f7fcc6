"""What an exported kernel directory holds beyond the launch facts, for a runner without TVM
(`benchmarks/tensorcore_cupy.py`): the machine code images and the reference operator.

Images: the PTX (JIT-compiled by the driver, which needs a driver that knows the PTX's ISA
version: `.version 9.0` needs a CUDA 13 driver) and cubins assembled here by ptxas for every
architecture the PTX can be assembled for, so a GPU whose driver is older than this toolkit
still runs the kernel. A PTX for `sm_XY` assembles for any `sm_ZW` >= XY of `SASS_ARCHS`; one
for an architecture-specific target (`sm_90a`: wgmma, setmaxnreg) only for that target.

The reference says which operator the kernel computes, in which dtypes and over how long a
reduction, so the runner can check it against any framework (and derive its tolerance from the
accumulator's precision and the reduction length) without knowing the schedule.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import tempfile
from pathlib import Path

from ...errors import LoweringError
from . import codegen

FORMAT = "tsl-cuda-kernel/3"
SASS_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a")
_TARGET = re.compile(r"^\s*\.target\s+(sm_\d+a?)", re.M)
_VERSION = re.compile(r"^\s*\.version\s+(\d+\.\d+)", re.M)


def ptx_facts(ptx: str) -> tuple[str, str]:
    """(ISA version, target) of a PTX module, e.g. ("9.0", "sm_80")."""
    version, target = _VERSION.search(ptx), _TARGET.search(ptx)
    if not (version and target):
        raise LoweringError("the PTX has no .version / .target directive: not nvcc's output?")
    return version.group(1), target.group(1)


def cubin_archs(target: str) -> list[str]:
    """The architectures a PTX for `target` assembles for (see the module's docstring)."""
    if target.endswith("a"):
        return [target]
    number = int(target[3:])
    return [a for a in SASS_ARCHS if not a.endswith("a") and int(a[3:]) >= number]


def assemble(ptx: str, arch: str) -> bytes:
    """ptxas `ptx` to a cubin for `arch`."""
    ptxas = str(Path(codegen.require_nvcc()).with_name("ptxas"))
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        src.write_text(ptx)
        res = subprocess.run([ptxas, f"-arch={arch}", "-O3", "-o", str(out), str(src)],
                             capture_output=True, text=True)
        if res.returncode:
            raise LoweringError(f"ptxas for {arch} failed:\n{res.stderr[-3000:]}")
        return out.read_bytes()


def write_images(path: Path, ptx: str, cubin: bytes) -> dict:
    """Write the PTX and a cubin per architecture (`cubin` is the PTX target's, already
    assembled); return the manifest's "images" entry."""
    version, target = ptx_facts(ptx)
    (path / f"kernel_{target}.ptx").write_text(ptx)
    cubins = {}
    for arch in cubin_archs(target):
        name = f"kernel_{arch}.cubin"
        (path / name).write_bytes(cubin if arch == target else assemble(ptx, arch))
        cubins[arch] = name
    return {"ptx": {"file": f"kernel_{target}.ptx", "isa": version, "target": target},
            "cubin": cubins}


def write(path: Path, artifact, ptx: str, cubin: bytes, rep: dict, params: list[dict],
          **extra) -> Path:
    """Write an exported kernel directory: kernel.cu, the images, and kernel.json with the
    launch (kernel name, grid, block, dynamic shared memory; "launches": the kernels to launch
    in order, each with its arguments by name; "workspace": global buffers to allocate for
    them, a split reduction's partial sums), `params` in order (name, dtype,
    padded shape, real shape, role, kind "pointer" or "tensormap", tensor), the reference
    operator, ptxas's resource report and `extra` entries (a kernel's own launch facts)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "kernel.cu").write_text(artifact.kernel.source)
    images = write_images(path, ptx, cubin)
    op = artifact.op
    big = artifact.ctx.op if getattr(artifact, "ctx", None) is not None else op
    meta = artifact.kernel.launch() | {
        "format": FORMAT, "arch": images["ptx"]["target"], "machine": artifact.machine.name,
        "operator": str(op), "params": params, "images": images, "reference": reference(op),
        "shapes": {t.name: list(t.shape) for t in list(big.inputs) + [big.output]},
        "flops": 2 * op.macs, "resources": {k: v for k, v in rep.items() if k != "log"},
        **extra}
    if any(p["kind"] == "tensormap" for p in params):
        # The runner launches such a kernel through the driver; it has no tsl to import.
        launcher = Path(__file__).with_name("tma_launch.py")
        (path / launcher.name).write_text(launcher.read_text())
        meta["launcher"] = launcher.name
    (path / "kernel.json").write_text(json.dumps(meta, indent=1))
    return path


def reference(op) -> dict:
    """The operator the kernel computes, for a runner that checks it with a framework:
    "matmul" / "batch_matmul" (A @ B, or A @ B^T with transpose_b: "dense"), "conv2d" (NHWC
    data, RSCK weights, NPQK output); the epilogue in order; the reduction length (K, or C*R*S)
    and the accumulator's dtype, which bound the rounding error."""
    a, b = (t for t in op.inputs[:2])
    if op.name == "conv2d":
        reduction = math.prod(b.shape[:3])  # R * S * C of RSCK weights
    else:
        reduction = a.shape[-1]
    return {"op": op.name, "dtype": op.dtype, "out_dtype": op.output.dtype,
            "acc_dtype": "int32" if op.dtype in ("int8", "uint8") else "float32",
            "reduction": int(reduction), "transpose_b": bool(op.params.get("transpose_b")),
            "epilogue": [{"kind": s.kind, "value": list(s.value)} for s in op.epilogue.steps],
            **({k: op.params[k] for k in ("stride", "padding", "dilation", "layout")}
               if op.name == "conv2d" else {})}
