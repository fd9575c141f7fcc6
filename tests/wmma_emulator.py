"""Run a Tensor Core artifact's CUDA kernel on the host CPU, to check its numerics without a GPU.

The kernel's C++ (the part of `art.source()` after TVM's CUDA prelude) is compiled with g++
against a small header that gives the CUDA names their meaning on the host:

- each CUDA thread of a block is a std::thread, `__syncthreads()` a std::barrier; blocks run
  one after the other;
- shared memory is the launch's: the dynamic part is exactly `dynamic_shared_bytes` (what the
  host passes at launch), followed by the kernel's static `__shared__` arrays, each region
  followed by a guard that must stay untouched (a write past the dynamic size is an error);
- shared memory is weakly consistent, as on a GPU: every warp works on its own copy, and the
  writes of other warps become visible only at a barrier. There the copies are merged (two
  warps writing different values to one byte between two barriers is a race: an error) and
  every warp gets the merged state;
- cp.async copies are deferred: a thread's copies land (in its warp's copy of shared memory)
  only when a `cp.async.wait_group n` leaves at most n newer committed groups pending; copies
  still pending when the thread ends are an error. So a missing wait, or a missing barrier
  after it, gives wrong results or an error, as it may on a GPU;
- ldmatrix and mma.sync (the inline PTX of sm_80 kernels) and warp shuffles are collective:
  the 32 lanes meet at a warp barrier and exchange registers, each lane's registers laid out
  as the PTX ISA specifies (written here from the ISA, not from the back end), so a wrong
  lane mapping in a kernel gives wrong results; ldmatrix row addresses must be 16-byte
  aligned and in shared memory;
- `nvcuda::wmma`: a fragment is a whole 16x16 matrix, and the warp's collective load / mma /
  store / fill is done by its lane 0 (the warps are threadIdx.y); loads and stores check what
  the CUDA documentation requires (a 256-bit aligned pointer, an ldm that is a multiple of 16
  bytes) and that the pointer is in shared memory, as this back end's kernels need.

What it cannot catch: timing beyond the orders above (a copy lands at its wait, never earlier),
races between lanes of one warp, bank conflicts. It is a test helper, slow (a thread per CUDA
thread), meant for small shapes.
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
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
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
static std::atomic<int> g_errors;
static char g_first_error[512];
static void emu_error(const char* what, long a, long b) {
  if (!g_errors++) snprintf(g_first_error, sizeof g_first_error, "%s (%ld, %ld)", what, a, b);
}

// Shared memory of the running block: the merged state and one copy per warp, each laid out as
// [dynamic | guard | static | guard].
constexpr long EMU_GUARD = 4096;
constexpr unsigned char EMU_CANARY = 0xA5;
struct EmuShared {
  long dyn = 0, stat = 0, size = 0;
  std::vector<unsigned char*> views;
  unsigned char* merged = nullptr;
  std::vector<int> writer;
  long static_base() const { return (dyn + EMU_GUARD + 127) / 128 * 128; }
  bool in_shared(const void* p, long bytes, const unsigned char* view) const {
    long off = (const unsigned char*)p - view;
    return (off >= 0 && off + bytes <= dyn)
        || (off >= static_base() && off + bytes <= static_base() + stat);
  }
  void check_guards(unsigned char* v) {
    for (long i = dyn; i < static_base(); ++i)
      if (v[i] != EMU_CANARY) { emu_error("shared memory written past the launch's dynamic "
                                          "size (offset, dynamic bytes)", i, dyn); return; }
    for (long i = static_base() + stat; i < size; ++i)
      if (v[i] != EMU_CANARY) { emu_error("shared memory written past the static arrays "
                                          "(offset, static bytes)", i, stat); return; }
  }
  // At a barrier: what each warp changed since the last one becomes everyone's.
  void merge() noexcept {
    std::fill(writer.begin(), writer.end(), -1);
    std::vector<unsigned char> next(merged, merged + size);
    for (size_t w = 0; w < views.size(); ++w) {
      unsigned char* v = views[w];
      check_guards(v);
      for (long i = 0; i < size; i += 64) {
        long n = std::min(64L, size - i);
        if (!memcmp(v + i, merged + i, n)) continue;
        for (long j = i; j < i + n; ++j) {
          if (v[j] == merged[j]) continue;
          if (writer[j] >= 0 && next[j] != v[j])
            emu_error("race: two warps wrote one shared byte between barriers (offset, warp)",
                      j, (long)w);
          writer[j] = (int)w;
          next[j] = v[j];
        }
      }
    }
    memcpy(merged, next.data(), size);
    for (auto* v : views) memcpy(v, merged, size);
  }
};
static EmuShared g_shared;
thread_local unsigned char* t_view;  // this thread's warp's copy
struct EmuMerge { void operator()() noexcept { g_shared.merge(); } };
static std::barrier<EmuMerge>* g_barrier;
inline void __syncthreads() { g_barrier->arrive_and_wait(); }
inline unsigned char* emu_dyn_base() { return t_view; }
inline unsigned char* emu_static_base() { return t_view + g_shared.static_base(); }
inline void emu_check_shared(const void* p, long bytes, const char* what) {
  if (!g_shared.in_shared(p, bytes, t_view))
    emu_error(what, (long)((const unsigned char*)p - t_view), bytes);
}

#define VEC4(NAME, T) struct alignas(4 * sizeof(T)) NAME { T x, y, z, w; }; \
  inline NAME make_##NAME(T x, T y, T z, T w) { return NAME{x, y, z, w}; }
#define VEC2(NAME, T) struct alignas(2 * sizeof(T)) NAME { T x, y; }; \
  inline NAME make_##NAME(T x, T y) { return NAME{x, y}; }
VEC4(uint4, unsigned) VEC4(int4, int) VEC4(float4, float) VEC4(char4, signed char)
VEC4(uchar4, unsigned char)
VEC2(uint2, unsigned) VEC2(int2, int) VEC2(float2, float) VEC2(char2, signed char)
VEC2(uchar2, unsigned char)
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
  emu_check_shared(p, 16 * sizeof(P), "wmma pointer outside shared memory (offset, bytes)");
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
// The back end's loads from shared memory (codegen.shared_loads): the same load.
template <class F, class P> inline void tsl_load_shared(F& f, const P* p, unsigned ldm) {
  load_matrix_sync(f, p, ldm);
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
using nvcuda::wmma::tsl_load_shared;

// Warp-collective instructions (ldmatrix, mma.sync, shuffles): the 32 lanes are threads
// that meet at a per-warp barrier, exchange their registers through the warp's slots, meet
// again, and each lane takes its own result, laid out per lane as the PTX ISA specifies
// ("Warp-level matrix load instruction: ldmatrix", "Matrix fragments for mma.m16n8k16",
// "... mma.m16n8k32"). The layouts are written from the ISA here, independently of the
// back end's intrinsics: a wrong lane mapping in a kernel gives wrong numbers.
struct EmuWarp {
  std::barrier<>* bar;
  unsigned addr[32];
  unsigned a[32][4], b[32][2];
  uint32_t c[32][4];
};
static std::vector<EmuWarp> g_warps;
inline int emu_lane() { return threadIdx.x % 32; }
inline EmuWarp& emu_warp() { return g_warps[threadIdx.y]; }
inline unsigned __cvta_generic_to_shared(const void* p) {
  return (unsigned)((const unsigned char*)p - t_view);
}
inline unsigned __activemask() { return 0xffffffffu; }
template <class T> inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  EmuWarp& w = emu_warp();
  memcpy(&w.c[emu_lane()][0], &v, 4);
  w.bar->arrive_and_wait();
  T out;
  memcpy(&out, &w.c[(emu_lane() / width) * width + src % width][0], 4);
  w.bar->arrive_and_wait();
  return out;
}
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8q .. 8q+7 give the addresses of
// the 8 rows (16 bytes each) of matrix q; register q of lane t gets row t/4, elements
// 2(t%4), 2(t%4)+1 of it (with .trans: column t/4, rows 2(t%4), 2(t%4)+1).
inline void emu_ldmatrix(bool trans, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3,
                         unsigned addr) {
  EmuWarp& w = emu_warp();
  int t = emu_lane();
  if (addr % 16) emu_error("ldmatrix row address not 16-byte aligned (offset, lane)", addr, t);
  emu_check_shared(t_view + addr, 16, "ldmatrix row outside shared memory (offset, bytes)");
  w.addr[t] = addr;
  w.bar->arrive_and_wait();
  unsigned* r[4] = {&r0, &r1, &r2, &r3};
  for (int q = 0; q < 4; ++q) {
    uint16_t lo, hi;
    if (!trans) {
      const unsigned char* row = t_view + w.addr[8 * q + t / 4];
      memcpy(&lo, row + 4 * (t % 4), 2);
      memcpy(&hi, row + 4 * (t % 4) + 2, 2);
    } else {
      memcpy(&lo, t_view + w.addr[8 * q + 2 * (t % 4)] + 2 * (t / 4), 2);
      memcpy(&hi, t_view + w.addr[8 * q + 2 * (t % 4) + 1] + 2 * (t / 4), 2);
    }
    *r[q] = unsigned(lo) | unsigned(hi) << 16;
  }
  w.bar->arrive_and_wait();
}
template <class E> inline float emu_f16(unsigned reg, int half) {
  uint16_t v = reg >> (16 * half);
  E e; memcpy(&e, &v, 2); return float(e);
}
// One 32-bit register holds N elements; element n of `reg` as the accumulator's type.
template <class E> struct EmuF16 {
  static constexpr int N = 2;
  static float get(unsigned reg, int n) { return emu_f16<E>(reg, n); }
};
struct EmuS8 {
  static constexpr int N = 4;
  static int get(unsigned reg, int n) { return int(int8_t(reg >> (8 * n))); }
};
// mma.sync.aligned.m16n8k{8N}.row.col: lane t = 4 g + i holds A rows g, g+8, columns
// N i .. N i + N-1 (+4N in a2, a3); B rows (k) N i .. N i + N-1 (+4N in b1), column g; C / D
// rows g, g+8, columns 2i, 2i+1. f16/bf16 -> f32: N = 2 (m16n8k16); s8 -> s32: N = 4 (m16n8k32).
template <class El, class Acc>
inline void emu_mma(Acc& d0, Acc& d1, Acc& d2, Acc& d3, unsigned a0, unsigned a1, unsigned a2,
                    unsigned a3, unsigned b0, unsigned b1, Acc c0, Acc c1, Acc c2, Acc c3) {
  constexpr int N = El::N, K = 8 * N;
  EmuWarp& w = emu_warp();
  int t = emu_lane(), g = t / 4, i = t % 4;
  unsigned a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
  memcpy(w.a[t], a, sizeof a);
  memcpy(w.b[t], b, sizeof b);
  w.bar->arrive_and_wait();
  auto A = [&](int row, int k) {  // a0: (g, N i..), a1: (g+8, ..), a2: (g, N i+4N..), a3
    return El::get(w.a[4 * (row % 8) + (k % (4 * N)) / N][(k / (4 * N)) * 2 + row / 8],
                   k % N); };
  auto B = [&](int k, int n) {
    return El::get(w.b[4 * n + (k % (4 * N)) / N][k / (4 * N)], k % N); };
  Acc c[4] = {c0, c1, c2, c3}, d[4];
  for (int e = 0; e < 4; ++e) {
    int row = g + 8 * (e / 2), col = 2 * i + e % 2;
    Acc acc = c[e];
    for (int k = 0; k < K; ++k) acc += A(row, k) * B(k, col);
    d[e] = acc;
  }
  w.bar->arrive_and_wait();
  d0 = d[0]; d1 = d[1]; d2 = d[2]; d3 = d[3];
}

// cp.async: queued per thread, landing when a wait_group retires its group.
struct EmuCopy { unsigned char* dst; const unsigned char* src; int bytes; bool pred; };
thread_local std::vector<EmuCopy> t_open;                 // issued, not committed
thread_local std::vector<std::vector<EmuCopy>> t_groups;  // committed, oldest first
inline void emu_cp_async(void* dst, int dst_off, int dst_elem, void* src, int src_off,
                         int src_elem, int bytes, int pred) {
  unsigned char* d = (unsigned char*)dst + (long)dst_off * dst_elem;
  unsigned char* s = (unsigned char*)src + (long)src_off * src_elem;
  if ((uintptr_t)d % bytes || (uintptr_t)s % bytes)
    emu_error("cp.async misaligned", (long)dst_off, bytes);
  emu_check_shared(d, bytes, "cp.async destination outside shared memory (offset, bytes)");
  t_open.push_back({d, s, bytes, pred != 0});
}
inline void emu_commit_group() { t_groups.push_back(std::move(t_open)); t_open.clear(); }
inline void emu_wait_group(size_t n) {
  while (t_groups.size() > n) {
    for (const auto& c : t_groups.front())
      if (c.pred) memcpy(c.dst, c.src, c.bytes); else memset(c.dst, 0, c.bytes);
    t_groups.erase(t_groups.begin());
  }
}
inline void emu_thread_end() {
  size_t n = t_open.size();
  for (const auto& g : t_groups) n += g.size();
  if (n) emu_error("cp.async copies never waited for (copies, thread)", (long)n,
                   (long)(threadIdx.y * 32 + threadIdx.x));
}
"""

_PLAIN_HELPER = re.compile(r"^__device__ __forceinline__ void tsl_lds4\(.*?^\}$", re.M | re.S)
_HELPER = re.compile(r"__device__ void (ptx_cp_async_legacy_(pred_)?c[ag]_(\d+)_(\d+)_(\d+))\(")
_ASYNC = re.compile(r"__device__ void (tvm_builtin_ptx_cp_async_\w+)\(\) \{\s*"
                    r"asm volatile\(\"cp\.async\.(commit_group|wait_group (\d+));")
_STATIC = re.compile(r"__shared__ alignas\((\d+)\) ([\w ]+?) (\w+)\[(\d+)\];")
_CTYPE = {"float16": "half", "bfloat16": "nv_bfloat16", "int8": "signed char",
          "uint8": "unsigned char", "float32": "float", "int32": "int"}
_CSIZE = {"half": 2, "nv_bfloat16": 2, "signed char": 1, "unsigned char": 1, "uchar": 1,
          "char": 1, "float": 4, "int": 4}
WAIT = re.compile(r"tvm_builtin_ptx_cp_async_wait_group\w*\(\);")


_ASM = re.compile(r"__asm__ __volatile__\(")
_MMA_CALL = {"f32.f16.f16.f32": "emu_mma<EmuF16<half>, float>",
             "f32.bf16.bf16.f32": "emu_mma<EmuF16<nv_bfloat16>, float>",
             "s32.s8.s8.s32": "emu_mma<EmuS8, int>"}


def _balanced(text: str, start: int) -> int:
    """The index just past the parenthesis that closes the one before `start`."""
    depth, i = 1, start
    while depth:
        c = text[i]
        if c == '"':
            i = text.index('"', i + 1)
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        i += 1
    return i


def _operands(part: str) -> list[str]:
    """The expressions of an asm operand list: '"=r"(x), "r"(y)' -> ['x', 'y']."""
    out, i = [], 0
    while (i := part.find('"(', i)) >= 0:
        end = _balanced(part, i + 2)
        out.append(part[i + 2:end - 1])
        i = end
    return out


def _warp_asm(kernel: str) -> str:
    """Inline PTX of ldmatrix and mma.sync -> calls of the emulator's warp-collective
    functions, with the operands as the asm statement lists them."""
    out, last = [], 0
    for m in _ASM.finditer(kernel):
        end = _balanced(kernel, m.end())
        body = kernel[m.end():end - 1]
        insn = "".join(re.findall(r'^\s*"([^"]*)"', body, re.M))
        parts = body.split(":")
        if insn.startswith("ldmatrix"):
            outs, ins = _operands(parts[1]), _operands(parts[2])
            if ".x4." not in insn or ".b16" not in insn:
                raise ValueError(f"the emulator does not know {insn}")
            call = (f"emu_ldmatrix({'true' if '.trans' in insn else 'false'}, "
                    f"{', '.join(outs)}, {ins[0]})")
        elif insn.startswith("mma.sync"):
            kind = next((v for k, v in _MMA_CALL.items() if k in insn), None)
            if kind is None or not re.search(r"m16n8k(16|32)\.row\.col", insn):
                raise ValueError(f"the emulator does not know {insn}")
            call = f"{kind}({', '.join(_operands(parts[1]) + _operands(parts[2]))})"
        else:
            continue
        out += [kernel[last:m.start()], call]
        last = end
    return "".join(out + [kernel[last:]])


def _program(source: str, kernels) -> str:
    """The emulated module of `source`; `kernels`: (name, params) of each kernel, called by
    `emu_launch(which, ...)`."""
    start = source.index('extern "C" __global__')
    prelude, kernel = source[:start], source[start:]
    lines = [HEADER]
    for fn, pred, nbytes, de, se in _HELPER.findall(prelude):
        extra = ", int predicate" if pred else ""
        lines.append(f"inline void {fn}(void* d, int do_, void* s, int so{extra}) "
                     f"{{ emu_cp_async(d, do_, {de}, s, so, {se}, {nbytes}, "
                     f"{'predicate' if pred else '1'}); }}")
    for fn, what, n in _ASYNC.findall(prelude):
        call = "emu_commit_group()" if what == "commit_group" else f"emu_wait_group({n})"
        lines.append(f"inline void {fn}() {{ {call}; }}")
    # Plain C++ helpers of the back end's prelude (codegen._LDS4) run as they are.
    lines += [m[0] for m in _PLAIN_HELPER.finditer(prelude)]
    kernel = _warp_asm(kernel)
    kernel = re.sub(r"extern __shared__ __align__\(\d+\) uchar (\w+)\[\];",
                    r"uchar* \1 = emu_dyn_base();", kernel)
    offset = 0

    def static(m):  # a static __shared__ array -> its place in the warp's copy
        nonlocal offset
        align, ctype, var, count = int(m[1]), m[2], m[3], int(m[4])
        offset = -(-offset // align) * align
        decl = f"{ctype}* {var} = ({ctype}*)(emu_static_base() + {offset});"
        offset += _CSIZE[ctype] * count
        return decl

    kernel = _STATIC.sub(static, kernel)
    if "__shared__" in kernel:
        raise ValueError("the emulator does not know this shared declaration: "
                         + kernel[kernel.index("__shared__"):][:120])
    lines.append(kernel)
    calls = []
    for n, (name, params) in enumerate(kernels):
        call = ", ".join(f"({_CTYPE[dt]}*)args[{i}]" for i, (_, dt) in enumerate(params))
        lines.append(f"static void emu_call_{n}(void** args) {{ {name}({call}); }}")
        calls.append(f"emu_call_{n}")
    lines.append(f"""
static void (*emu_calls[])(void**) = {{{", ".join(calls)}}};
extern "C" int emu_launch(int which, void** args, int gx, int gy, int gz, int bx, int by,
                          int bz, long dynamic_bytes, char* err) {{
  int threads = bx * by * bz, warps = threads / 32;
  g_errors = 0;
  g_first_error[0] = 0;
  EmuShared& sh = g_shared;
  sh.dyn = dynamic_bytes;
  sh.stat = {offset};
  sh.size = sh.static_base() + sh.stat + EMU_GUARD;
  std::vector<std::vector<unsigned char>> store(warps + 1);
  for (auto& v : store) v.assign(sh.size + 1024, EMU_CANARY);
  auto aligned = [](std::vector<unsigned char>& v) {{
    return (unsigned char*)(((uintptr_t)v.data() + 1023) / 1024 * 1024); }};
  sh.merged = aligned(store[warps]);
  sh.views.clear();
  for (int w = 0; w < warps; ++w) sh.views.push_back(aligned(store[w]));
  sh.writer.assign(sh.size, -1);
  std::barrier<EmuMerge> bar(threads);
  g_barrier = &bar;
  std::vector<std::unique_ptr<std::barrier<>>> warp_bars;
  g_warps.assign(warps, EmuWarp{{}});
  for (int w = 0; w < warps; ++w) {{
    warp_bars.push_back(std::make_unique<std::barrier<>>(32));
    g_warps[w].bar = warp_bars.back().get();
  }}
  for (int z = 0; z < gz; ++z) for (int y = 0; y < gy; ++y) for (int x = 0; x < gx; ++x) {{
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([=] {{
        blockIdx = dim3{{(unsigned)x, (unsigned)y, (unsigned)z}};
        threadIdx = dim3{{(unsigned)(t % bx), (unsigned)(t / bx % by), (unsigned)(t / bx / by)}};
        t_view = sh.views[t / 32];
        emu_calls[which](args);
        emu_thread_end();
      }});
    for (auto& th : pool) th.join();
    for (auto* v : sh.views) sh.check_guards(v);
  }}
  strcpy(err, g_first_error);
  return g_errors;
}}
""")
    return "\n".join(lines)


def available() -> bool:
    return shutil.which("g++") is not None


_LIBS: dict[str, ctypes.CDLL] = {}


def compile_kernel(art, source: str | None = None) -> ctypes.CDLL:
    k = art.kernel
    text = _program(source or k.source, [(x.name, x.params) for x in (k, *k.after)])
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


def execute(art, packed: list[np.ndarray], source: str | None = None) -> np.ndarray:
    """The kernel (or `source`, a variant of its CUDA) on `packed` (the artifact's prepared
    inputs): its output array."""
    from tsl.ops.operator import np_dtype

    lib = compile_kernel(art, source)
    out_t = art.ctx.op.output
    out = _poisoned(out_t.shape, np_dtype(out_t.dtype))
    k = art.kernel
    # The function's arguments by the names its kernels take them, and the workspaces the
    # host would allocate (a split reduction's partial sums), poisoned too.
    names = [f"{p.name}_ptr" for p in art.mod["main"].params]
    arrays = dict(zip(names, [np.ascontiguousarray(x) for x in packed] + [out], strict=True))
    arrays.update((name, _poisoned((size,), np_dtype(dt))) for name, dt, size in k.workspace)
    lib.emu_launch.argtypes = [ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int] * 6 + [
        ctypes.c_long, ctypes.c_char_p]
    for which, kern in enumerate((k, *k.after)):  # in launch order
        assert kern.block[0] == 32, "the emulator wants warps along threadIdx.y"
        ptrs = (ctypes.c_void_p * len(kern.params))(*[arrays[n].ctypes.data
                                                       for n, _ in kern.params])
        err = ctypes.create_string_buffer(512)
        n = lib.emu_launch(which, ptrs, *kern.grid, *kern.block, kern.dynamic_shared_bytes, err)
        if n:
            raise AssertionError(f"{n} error(s) in emulated kernel {kern.name}; first: "
                                 f"{err.value.decode()}")
    return out


def _poisoned(shape, dtype) -> np.ndarray:
    """An array of `shape` whose every element is wrong if left unwritten (NaN for floats)."""
    x = np.full(shape, 0x7F, dtype=dtype)
    if x.dtype.kind == "f":
        x[...] = np.nan
    return x


def verify(art, seed: int = 1, source: str | None = None) -> tuple[bool, float]:
    """Like `art.verify`, with the kernel (or `source`, a variant of its CUDA) run by the
    emulator."""
    xs = art.op.random_inputs(seed)
    got = art.op.crop_output(execute(art, art.prepare(xs), source))
    return art.op.check(got, art.op.reference(*xs))
