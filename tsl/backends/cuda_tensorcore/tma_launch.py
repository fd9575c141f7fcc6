"""Launch an exported sm_90a kernel (kernel.json with `tensor_maps`) without TVM.

The kernel's first parameters are `const __grid_constant__ CUtensorMap` values, which CuPy's
RawKernel cannot pass: this module encodes them with the CUDA driver's
cuTensorMapEncodeTiled and launches with cuLaunchKernel, both through ctypes (libcuda.so.1,
which every CUDA driver installs). It imports nothing from tsl (nor TVM), so a GPU script can
load it by path:

    spec = importlib.util.spec_from_file_location("tma_launch", ".../tma_launch.py")
    ...
    fn = cupy.RawModule(path=cubin).get_function(meta["kernel"])
    fn.max_dynamic_shared_size_bytes = meta["dynamic_shared_bytes"]
    go = tma_launch.Launch(fn.ptr, meta, {"A": a.data.ptr, "B": b.data.ptr, "bias": ..,
                                          "out": out.data.ptr})
    go(cupy.cuda.get_current_stream().ptr)
"""

from __future__ import annotations

import ctypes

# CUtensorMapDataType (cuda.h)
DATA_TYPES = {"uint8": 0, "float16": 6, "float32": 7, "bfloat16": 9}
TENSOR_MAP_BYTES = 128


class TensorMap:
    """128 bytes of host memory aligned to 64 (CUtensorMap is alignas(64))."""

    def __init__(self):
        self._buf = ctypes.create_string_buffer(TENSOR_MAP_BYTES + 64)
        self.address = (ctypes.addressof(self._buf) + 63) & ~63


def _driver():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise RuntimeError(f"the CUDA driver (libcuda.so.1) is not loadable here: {e}") from e


def _check(lib, res: int, what: str) -> None:
    if res:
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(res, ctypes.byref(msg))
        raise RuntimeError(f"{what} failed: CUresult {res} ({(msg.value or b'').decode()})")


def encode(spec: dict, address: int, lib=None) -> TensorMap:
    """The CUtensorMap of `spec` (one entry of kernel.json's `tensor_maps`) over the device
    buffer at `address`."""
    lib = lib or _driver()
    rank = spec["rank"]
    tmap = TensorMap()
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    res = lib.cuTensorMapEncodeTiled(
        ctypes.c_void_p(tmap.address), ctypes.c_int(DATA_TYPES[spec["dtype"]]), u32(rank),
        ctypes.c_void_p(address), (u64 * rank)(*spec["dims"]),
        (u64 * (rank - 1))(*spec["strides_bytes"]), (u32 * rank)(*spec["box"]),
        (u32 * rank)(*spec["element_strides"]), ctypes.c_int(spec["interleave"]),
        ctypes.c_int(spec["swizzle"]), ctypes.c_int(spec["l2_promotion"]),
        ctypes.c_int(spec["oob_fill"]))
    _check(lib, res, f"cuTensorMapEncodeTiled({spec['tensor']})")
    return tmap


def arguments(meta: dict, pointers: dict[str, int], maps: dict[str, object]) -> list:
    """The kernel's arguments in parameter order: the tensor map of a `tensormap` parameter,
    the device pointer (uint64) of a `pointer` one."""
    out = []
    for p in meta["params"]:
        if p["kind"] == "tensormap":
            out.append(maps[p["tensor"]])
        elif p["tensor"] in pointers:
            out.append(ctypes.c_uint64(pointers[p["tensor"]]))
        else:
            raise KeyError(f"no device pointer for parameter {p['name']} (tensor "
                           f"{p['tensor']!r}); pass pointers={{{p['tensor']!r}: ptr, ...}}")
    return out


class Launch:
    """A kernel launch with its tensor maps encoded once: `Launch(...)(stream)` only calls
    cuLaunchKernel, so back-to-back launches and graph capture time the kernel, not ctypes."""

    def __init__(self, function: int, meta: dict, pointers: dict[str, int]):
        """`function`: a CUfunction handle (e.g. CuPy's Function.ptr); `pointers`: tensor
        name -> device address; `meta`: kernel.json."""
        self.lib, self.meta, self.function = _driver(), meta, function
        # The parameter block holds addresses into these: they live as long as the launch.
        self.maps = {s["tensor"]: encode(s, pointers[s["tensor"]], self.lib)
                     for s in meta["tensor_maps"]}
        self.args = arguments(meta, pointers, self.maps)
        self.params = (ctypes.c_void_p * len(self.args))(*[
            a.address if isinstance(a, TensorMap) else ctypes.addressof(a) for a in self.args])

    def __call__(self, stream: int = 0) -> None:
        m = self.meta
        res = self.lib.cuLaunchKernel(
            ctypes.c_void_p(self.function), *map(ctypes.c_uint, m["grid"]),
            *map(ctypes.c_uint, m["block"]), ctypes.c_uint(m["dynamic_shared_bytes"]),
            ctypes.c_void_p(stream), self.params, None)
        _check(self.lib, res, f"cuLaunchKernel({m['kernel']})")
