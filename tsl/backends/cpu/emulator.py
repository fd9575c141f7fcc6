"""Running a cross-compiled CPU artifact under QEMU user-mode emulation.

A machine this host cannot execute (an AArch64 file on an x86 host) is compiled with
`tsl.build(..., cross=True)`; its object file is linked with a small C harness
(`emulator_harness.c`: parallel tasks run one after the other, workspace from malloc) by the
arch's cross compiler and run by `qemu-<arch>` on a CPU model that has only the machine file's
`require` features where QEMU has such a model (`[params] qemu_cpu`), so that an instruction the
file does not declare traps instead of passing. What this checks is the emitted instructions'
numerics, executed by an implementation of the ISA this project did not write; the time it
takes means nothing.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
from importlib import resources

import numpy as np

from ...errors import BackendUnavailable, LoweringError

# LLVM arch name -> (cross C compiler, QEMU user-mode emulator); Debian names them so.
TOOLS = {"aarch64": ("aarch64-linux-gnu-gcc", "qemu-aarch64")}
# DLPack type codes.
CODES = {"i": 0, "u": 1, "f": 2}
BFLOAT = 4


def unavailable(machine) -> str | None:
    """Why `machine`'s code cannot be emulated here, or None."""
    arch = machine.params.arch
    if arch not in TOOLS:
        return f"no emulator for arch {arch!r} (emulated: {sorted(TOOLS)})"
    lacks = [t for t in TOOLS[arch] if shutil.which(t) is None]
    if lacks:
        return (f"emulating {machine.name} needs {lacks} on PATH (Debian: apt-get install "
                f"qemu-user gcc-{arch}-linux-gnu)")
    return None


def _header(x: np.ndarray) -> bytes:
    if x.dtype.name == "bfloat16":
        code, bits = BFLOAT, 16
    else:
        code, bits = CODES[x.dtype.kind], 8 * x.dtype.itemsize
    return struct.pack(f"<BBHi{x.ndim}q", code, bits, 1, x.ndim, *x.shape)


def run(mod, machine, args: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    """Call `mod`'s "main" on `args` + `out` under emulation; returns the output tensor."""
    why = unavailable(machine)
    if why:
        raise BackendUnavailable(why)
    cc, qemu = TOOLS[machine.params.arch]
    tensors = [np.ascontiguousarray(x) for x in [*args, out]]
    with tempfile.TemporaryDirectory(prefix="tsl-emu-") as d:
        obj, exe = os.path.join(d, "kernel.o"), os.path.join(d, "kernel")
        mod.write_to_file(obj)
        harness = resources.files(__package__).joinpath("emulator_harness.c")
        import tvm_ffi.libinfo

        include = tvm_ffi.libinfo.find_include_path()
        _check(BackendUnavailable, subprocess.run(
            [cc, "-O1", "-static", f"-I{include}", f"-DTSL_EMULATED_CORES={machine.cores()}",
             str(harness), obj, "-o", exe, "-lm"], capture_output=True, text=True), "linking")
        spec = os.path.join(d, "in.bin")
        with open(spec, "wb") as f:
            f.write(struct.pack("<i", len(tensors)))
            for x in tensors:
                f.write(_header(x))
            for x in tensors:
                f.write(x.tobytes())
        result = os.path.join(d, "out.bin")
        cpu = machine.params.qemu_cpu
        _check(LoweringError, subprocess.run([qemu, "-cpu", cpu, exe, spec, result], capture_output=True,
                              text=True, timeout=600), f"running under {qemu} -cpu {cpu}")
        return np.fromfile(result, dtype=tensors[-1].dtype).reshape(tensors[-1].shape)


def _check(error, proc, what: str) -> None:
    if proc.returncode != 0:
        raise error(f"emulated run failed while {what} (exit {proc.returncode}): "
                                 f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
