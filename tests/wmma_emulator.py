"""Run a Tensor Core artifact's CUDA kernel on the host CPU, to check its numerics without a GPU.

The kernel's C++ (the part of `art.source()` after TVM's CUDA prelude) is compiled with g++
against a small header that gives the CUDA names their meaning on the host:

- each CUDA thread of a block is a std::thread, `__syncthreads()` a std::barrier; blocks run
  one after the other, so `__shared__` variables are plain statics;
- `nvcuda::wmma`: a fragment is a whole 16x16 matrix, and the warp's collective load / mma /
  store / fill is done by its lane 0 (the warps are threadIdx.y); loads and stores check what
  the CUDA documentation requires: a 256-bit aligned pointer and an ldm that is a multiple of
  16 bytes;
- cp.async: a synchronous copy (zero-fill when the predicate is false); commit / wait: no-ops.

What it cannot catch: timing (a missing wait that a GPU would expose) and warp-level details
beyond the documented alignment rules. It is a test helper, slow (a thread per CUDA thread),
meant for small shapes.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

HEADER = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

typedef _Float16 half;
typedef _Float16 __half;
struct nv_bfloat16 {
  uint16_t b;
  nv_bfloat16() = default;
  nv_bfloat16(float f) {  // round to nearest even
    uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); b = u >> 16;
  }
  operator float() const { uint32_t u = uint32_t(b) << 16; float f; memcpy(&f, &u, 4); return f; }
};
typedef nv_bfloat16 __nv_bfloat16;
inline half __float2half_rn(float f) { return (half)f; }
inline float __half2float(half h) { return (float)h; }
inline nv_bfloat16 __float2bfloat16_rn(float f) { return nv_bfloat16(f); }
inline float __bfloat162float(nv_bfloat16 h) { return (float)h; }
template <class H> inline unsigned emu_pack2(H x, H y) {
  uint16_t a, b; memcpy(&a, &x, 2); memcpy(&b, &y, 2); return (unsigned(b) << 16) | a;
}
inline unsigned __pack_half2(half x, half y) { return emu_pack2(x, y); }
inline unsigned __pack_nv_bfloat162(nv_bfloat16 x, nv_bfloat16 y) { return emu_pack2(x, y); }
#define uchar unsigned char
#define uint unsigned int
#define ushort unsigned short
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local dim3 threadIdx, blockIdx;
static std::barrier<>* g_barrier;
static int g_errors;
static char g_first_error[512];
inline void __syncthreads() { g_barrier->arrive_and_wait(); }
static void emu_error(const char* what, long a, long b) {
  if (!g_errors++) snprintf(g_first_error, sizeof g_first_error, "%s (%ld, %ld)", what, a, b);
}
alignas(1024) unsigned char buf_dyn_shmem_ptr[256 * 1024];

#define VEC4(NAME, T) struct alignas(4 * sizeof(T)) NAME { T x, y, z, w; }; \
  inline NAME make_##NAME(T x, T y, T z, T w) { return NAME{x, y, z, w}; }
#define VEC2(NAME, T) struct alignas(2 * sizeof(T)) NAME { T x, y; }; \
  inline NAME make_##NAME(T x, T y) { return NAME{x, y}; }
VEC4(uint4, unsigned) VEC4(int4, int) VEC4(float4, float) VEC4(char4, signed char)
VEC4(uchar4, unsigned char)
VEC2(uint2, unsigned) VEC2(int2, int) VEC2(float2, float)
template <class T> inline T max(T a, T b) { return a > b ? a : b; }
template <class T> inline T min(T a, T b) { return a < b ? a : b; }

namespace nvcuda { namespace wmma {
struct matrix_a {}; struct matrix_b {}; struct accumulator {};
struct row_major {}; struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class L = void> struct fragment {
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
  T x[rows * cols];
};
// The warp's collective operations are done by its lane 0 alone (blockDim.x is 32: the warps
// are threadIdx.y); the other lanes' fragments are never read.
inline bool idle_lane() { return threadIdx.x % 32 != 0; }
template <class P> inline void check_ptr(const P* p, unsigned ldm, const char* what) {
  if ((uintptr_t)p % 32) emu_error(what, (long)((uintptr_t)p % 32), 32);
  if ((ldm * sizeof(P)) % 16) emu_error("ldm is not a multiple of 16 bytes", ldm, sizeof(P));
}
template <class U, int M, int N, int K, class T, class L, class P>
inline void load_matrix_sync(fragment<U, M, N, K, T, L>& f, const P* p, unsigned ldm) {
  if (idle_lane()) return;
  check_ptr(p, ldm, "load_matrix_sync: pointer not 256-bit aligned");
  using F = fragment<U, M, N, K, T, L>;
  for (int i = 0; i < F::rows; ++i)
    for (int j = 0; j < F::cols; ++j)
      f.x[i * F::cols + j] = std::is_same_v<L, col_major> ? p[j * ldm + i] : p[i * ldm + j];
}
template <int M, int N, int K, class T, class P>
inline void store_matrix_sync(P* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm,
                              layout_t layout) {
  if (idle_lane()) return;
  check_ptr(p, ldm, "store_matrix_sync: pointer not 256-bit aligned");
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      (layout == mem_row_major ? p[i * ldm + j] : p[j * ldm + i]) = f.x[i * N + j];
}
template <int M, int N, int K, class T, class V>
inline void fill_fragment(fragment<accumulator, M, N, K, T>& f, V v) {
  if (idle_lane()) return;
  for (auto& e : f.x) e = T(v);
}
template <int M, int N, int K, class T, class A, class LA, class LB>
inline void mma_sync(fragment<accumulator, M, N, K, T>& d,
                     const fragment<matrix_a, M, N, K, A, LA>& a,
                     const fragment<matrix_b, M, N, K, A, LB>& b,
                     const fragment<accumulator, M, N, K, T>& c) {
  if (idle_lane()) return;
  T out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      T acc = c.x[i * N + j];
      for (int k = 0; k < K; ++k) acc += T(a.x[i * K + k]) * T(b.x[k * N + j]);
      out[i * N + j] = acc;
    }
  memcpy(d.x, out, sizeof out);
}
}}  // namespace nvcuda::wmma

inline void emu_cp_async(void* dst, int dst_off, int dst_elem, void* src, int src_off,
                         int src_elem, int bytes, int pred) {
  unsigned char* d = (unsigned char*)dst + (long)dst_off * dst_elem;
  unsigned char* s = (unsigned char*)src + (long)src_off * src_elem;
  if ((uintptr_t)d % bytes || (uintptr_t)s % bytes)
    emu_error("cp.async misaligned", (long)dst_off, bytes);
  if (pred) memcpy(d, s, bytes); else memset(d, 0, bytes);
}
"""

_HELPER = re.compile(r"__device__ void (ptx_cp_async_legacy_(pred_)?c[ag]_(\d+)_(\d+)_(\d+))\(")
_NOOP = re.compile(r"__device__ void (tvm_builtin_ptx_cp_async_\w+)\(\)")
_CTYPE = {"float16": "half", "bfloat16": "nv_bfloat16", "int8": "signed char",
          "uint8": "unsigned char", "float32": "float", "int32": "int"}


def _program(source: str, name: str, params) -> str:
    start = source.index('extern "C" __global__')
    prelude, kernel = source[:start], source[start:]
    lines = [HEADER]
    for fn, pred, nbytes, de, se in _HELPER.findall(prelude):
        extra = ", int predicate" if pred else ""
        lines.append(f"inline void {fn}(void* d, int do_, void* s, int so{extra}) "
                     f"{{ emu_cp_async(d, do_, {de}, s, so, {se}, {nbytes}, "
                     f"{'predicate' if pred else '1'}); }}")
    for fn in _NOOP.findall(prelude):
        lines.append(f"inline void {fn}() {{}}")
    kernel = kernel.replace("extern __shared__", "extern")
    kernel = re.sub(r"__shared__ (alignas\(\d+\)) ", r"\1 static ", kernel)
    lines.append(kernel)
    call = ", ".join(f"({_CTYPE[dt]}*)args[{i}]" for i, (_, dt) in enumerate(params))
    lines.append(f"""
extern "C" int emu_launch(void** args, int gx, int gy, int gz, int bx, int by, int bz,
                          char* err) {{
  int threads = bx * by * bz;
  g_errors = 0;
  std::barrier<> bar(threads);
  g_barrier = &bar;
  for (int z = 0; z < gz; ++z) for (int y = 0; y < gy; ++y) for (int x = 0; x < gx; ++x) {{
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([=] {{
        blockIdx = dim3{{(unsigned)x, (unsigned)y, (unsigned)z}};
        threadIdx = dim3{{(unsigned)(t % bx), (unsigned)(t / bx % by), (unsigned)(t / bx / by)}};
        {name}({call});
      }});
    for (auto& th : pool) th.join();
  }}
  strcpy(err, g_first_error);
  return g_errors;
}}
""")
    return "\n".join(lines)


def available() -> bool:
    return shutil.which("g++") is not None


_LIBS: dict[str, ctypes.CDLL] = {}


def compile_kernel(art) -> ctypes.CDLL:
    k = art.kernel
    text = _program(k.source, k.name, k.params)
    key = hashlib.sha1(text.encode()).hexdigest()
    if key not in _LIBS:
        with tempfile.TemporaryDirectory(prefix="wmma_emu_") as tmp:
            cpp, lib = Path(tmp, "k.cpp"), Path(tmp, "k.so")
            cpp.write_text(text)
            res = subprocess.run(["g++", "-std=c++20", "-O2", "-shared", "-fPIC", "-pthread",
                                  "-w", "-o", str(lib), str(cpp)], capture_output=True, text=True)
            if res.returncode:
                raise RuntimeError(f"g++ failed on the emulated kernel:\n{res.stderr[-4000:]}")
            _LIBS[key] = ctypes.CDLL(str(lib))  # loaded: the file may go
    return _LIBS[key]


def execute(art, packed: list[np.ndarray]) -> np.ndarray:
    """The kernel on `packed` (the artifact's prepared inputs): its output array."""
    from tsl.ops.operator import np_dtype

    lib = compile_kernel(art)
    out_t = art.ctx.op.output
    out = np.full(out_t.shape, 0x7F, dtype=np_dtype(out_t.dtype))  # poison
    if out.dtype.kind == "f":
        out[...] = np.nan
    arrays = [np.ascontiguousarray(x) for x in packed] + [out]
    ptrs = (ctypes.c_void_p * len(arrays))(*[x.ctypes.data for x in arrays])
    err = ctypes.create_string_buffer(512)
    k = art.kernel
    assert k.block[0] == 32, "the emulator wants warps along threadIdx.y"
    n = lib.emu_launch(ptrs, *k.grid, *k.block, err)
    if n:
        raise AssertionError(f"{n} error(s) in the emulated kernel; first: {err.value.decode()}")
    return out


def verify(art, seed: int = 1) -> tuple[bool, float]:
    """Like `art.verify`, with the kernel run by the emulator."""
    xs = art.op.random_inputs(seed)
    got = art.op.crop_output(execute(art, art.prepare(xs)))
    return art.op.check(got, art.op.reference(*xs))
