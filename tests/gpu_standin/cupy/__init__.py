"""A stand-in for CuPy, and for the torch.cuda pieces benchmarks/tensorcore_cupy.py uses, that runs
exported kernels on the CPU emulator (tests/wmma_emulator.py): the GPU script's rehearsal
(tests/test_gpu_script.py), with torch on the CPU (`run --torch-device cpu`).

What stands for what:
- the driver (TSL_STANDIN_DRIVER, default 13000 = CUDA 13.0) and the GPU (TSL_STANDIN_ARCH,
  default 90 = sm_90): loading a PTX whose ISA the driver cannot JIT, or a cubin of another
  architecture, fails as it does on a GPU;
- RawModule(path=image): the kernel's CUDA source beside the image (kernel.cu, what the PTX was
  compiled from) is compiled by the emulator; get_function fails on a wrong entry name;
- a launch runs the whole grid on the CPU; pointer arguments are host addresses (of CPU torch
  tensors); an error the emulator finds (a race, shared memory out of bounds) raises, as a
  faulting kernel would surface at the next synchronization;
- events read the host clock; a stream's capture records launches and Graph.launch replays them;
- torch.cuda: Event, synchronize, CUDAGraph / graph (the torch work inside `graph` runs once,
  eagerly, and replay does nothing: the rehearsal's torch graph times measure nothing), and
  torch.mm / bmm / addmm's out_dtype=float32 (no CPU kernel: the product in float32).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the emulator
import wmma_emulator  # noqa: E402

__version__ = "stand-in (tests/gpu_standin: kernels on the CPU emulator)"
DRIVER = int(os.environ.get("TSL_STANDIN_DRIVER", "13000"))
ARCH = os.environ.get("TSL_STANDIN_ARCH", "90")


class CUDADriverError(RuntimeError):
    pass


# -- cupy.cuda --------------------------------------------------------------------------------
class _Runtime:
    @staticmethod
    def driverGetVersion():
        return DRIVER

    @staticmethod
    def runtimeGetVersion():
        return 13000

    @staticmethod
    def getDeviceCount():
        return 1

    @staticmethod
    def getDeviceProperties(i):
        return {"name": b"stand-in GPU (CUDA emulator on the CPU)", "major": int(ARCH[0]),
                "minor": int(ARCH[1:]), "multiProcessorCount": 1, "l2CacheSize": 1 << 16,
                "totalGlobalMem": 1 << 30}


class Device:
    def __init__(self, i=0):
        self.id = i

    @property
    def compute_capability(self):
        return ARCH

    def synchronize(self):
        pass


class Event:
    def __init__(self, *args, **kwargs):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass


def get_elapsed_time(start, end):
    return (end.t - start.t) * 1e3


_current: list = []  # the stream stack of `with stream:`


class Stream:
    def __init__(self, non_blocking=False):
        self.captured = None

    def __enter__(self):
        _current.append(self)
        return self

    def __exit__(self, *exc):
        _current.pop()

    def begin_capture(self, mode=None):
        self.captured = []

    def end_capture(self):
        graph, self.captured = Graph(self.captured), None
        return graph


class Graph:
    def __init__(self, launches):
        self.launches = launches

    def launch(self, stream=None):
        for kernel, args in self.launches:
            kernel._run(*args)


cuda = SimpleNamespace(runtime=_Runtime, Device=Device, Event=Event, Stream=Stream,
                       Graph=Graph, get_elapsed_time=get_elapsed_time)


# -- modules and kernels ----------------------------------------------------------------------
def _jit_driver(isa: str) -> int:
    """The first driver that JITs PTX ISA `isa` (major 7 -> 11.x, 8 -> 12.x, 9 -> 13.x; within
    a major, 12.x knew 8.0-8.5 by 12.5, so this errs towards refusing)."""
    major, minor = map(int, isa.split("."))
    return (major + 4) * 1000 + 10 * min(minor + (2 if major == 8 and minor > 5 else 0), 9)


class RawModule:
    def __init__(self, path: str):
        path = Path(path)
        meta = json.loads((path.parent / "kernel.json").read_text())
        images = meta["images"]
        if path.suffix == ".ptx":
            need = _jit_driver(images["ptx"]["isa"])
            if DRIVER < need:
                raise CUDADriverError(f"CUDA_ERROR_UNSUPPORTED_PTX_VERSION: PTX ISA "
                                      f"{images['ptx']['isa']} needs driver {need}")
        else:
            arch = next(a for a, f in images["cubin"].items() if f == path.name)
            if arch.rstrip("a") != f"sm_{ARCH}":
                raise CUDADriverError(f"CUDA_ERROR_NO_BINARY_FOR_GPU: {arch} cubin on sm_{ARCH}")
        self.meta, self.source = meta, (path.parent / "kernel.cu").read_text()

    def get_function(self, name: str):
        if not re.search(r'extern "C" __global__ void (__launch_bounds__\([^)]*\) )?'
                         + re.escape(name) + r"\(", self.source):
            raise CUDADriverError(f"CUDA_ERROR_NOT_FOUND: no kernel {name!r} in the module")
        # Its arguments' names and dtypes: the operator's tensors and the workspaces.
        dtypes = {p["name"]: p["dtype"] for p in self.meta["params"] + self.meta["workspace"]}
        launch = next(x for x in self.meta["launches"] if x["kernel"] == name)
        kernel = SimpleNamespace(name=name, source=self.source, after=(),
                                 params=[(a, dtypes[a]) for a in launch["args"]])
        return RawKernel(wmma_emulator.compile_kernel(SimpleNamespace(kernel=kernel)))


class RawKernel:
    def __init__(self, lib):
        self.lib = lib
        self.max_dynamic_shared_size_bytes = 48 * 1024

    def __call__(self, grid, block, args, shared_mem=0):
        if shared_mem > max(self.max_dynamic_shared_size_bytes, 48 * 1024):
            raise CUDADriverError("CUDA_ERROR_INVALID_VALUE: dynamic shared memory over the "
                                  "kernel's limit")
        launch = (tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block)),
                  [int(a) for a in args], int(shared_mem))
        stream = _current[-1] if _current else None
        if stream is not None and stream.captured is not None:
            stream.captured.append((self, launch))
        else:
            self._run(*launch)

    def _run(self, grid, block, ptrs, shared_mem):
        arr = (ctypes.c_void_p * len(ptrs))(*ptrs)
        err = ctypes.create_string_buffer(512)
        self.lib.emu_launch.argtypes = ([ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int] * 6
                                        + [ctypes.c_long, ctypes.c_char_p])
        if self.lib.emu_launch(0, arr, *grid, *block, shared_mem, err):
            raise CUDADriverError(f"emulated kernel failed: {err.value.decode()}")


# -- torch.cuda -------------------------------------------------------------------------------
def _install_torch():
    import torch

    class TorchEvent(Event):
        def elapsed_time(self, end):
            return get_elapsed_time(self, end)

    class CUDAGraph:
        def replay(self):
            pass

    torch.cuda.Event = TorchEvent
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.CUDAGraph = CUDAGraph
    torch.cuda.graph = lambda g, **kwargs: contextlib.nullcontext()

    def float32_out(fn):
        @functools.wraps(fn)
        def call(*args, out_dtype=None, **kwargs):
            if out_dtype is None:
                return fn(*args, **kwargs)
            return fn(*[a.to(out_dtype) for a in args], **kwargs)
        return call

    torch.mm, torch.bmm = float32_out(torch.mm), float32_out(torch.bmm)
    torch.addmm = float32_out(torch.addmm)


_install_torch()
