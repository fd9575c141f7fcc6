// A C copy of tsl's fp32 GEMM micro-kernel on AVX-512 (benchmarks/README.md "gemm39"): the
// register tile of MR rows x NJ zmm vectors, over tsl's packed layouts A [M/MR][K][MR] and
// B [N/NR][K][NR] (NR = 16 NJ), in tsl's nest (blocks of MO row tiles x NO column tiles, column
// blocks outer, the blocks split over the OpenMP threads), to read the kernel's ceiling apart
// from TVM: software prefetch of B (PF k steps ahead) and K blocking (KC) on or off.
//
//   gcc -O3 -march=sapphirerapids -fopenmp -DMR=8 -DNJ=3 benchmarks/gemm_microkernel.c -o mk
//   OMP_NUM_THREADS=2 ./mk M K N MO NO   (defaults 128 3072 768 8 2: BERT-base's FFN2)
//
// Prints the min of 30 calls per variant (GFLOP/s) and checks every variant against the first.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifndef MR
#define MR 8
#endif
#ifndef NJ
#define NJ 3
#endif
#define NR (16 * NJ)

static int M = 128, K = 3072, N = 768, MO = 8, NO = 2;
static float *A, *B, *C;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// One register tile over kc steps; acc: add to C (a later K block); pf: prefetch distance.
static void tile(const float *a, const float *b, float *c, int kc, int acc, int pf) {
  __m512 r[MR][NJ];
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NJ; j++) r[i][j] = acc ? _mm512_loadu_ps(c + i * N + 16 * j) : _mm512_setzero_ps();
  for (int k = 0; k < kc; k++) {
    __m512 bv[NJ];
    for (int j = 0; j < NJ; j++) bv[j] = _mm512_load_ps(b + 16 * j);
    if (pf)
      for (int j = 0; j < NJ; j++) _mm_prefetch((const char *)(b + pf * NR + 16 * j), _MM_HINT_T0);
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
      __m512 x = _mm512_set1_ps(a[i]);
      for (int j = 0; j < NJ; j++) r[i][j] = _mm512_fmadd_ps(x, bv[j], r[i][j]);
    }
    a += MR;
    b += NR;
  }
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NJ; j++) _mm512_storeu_ps(c + i * N + 16 * j, r[i][j]);
}

static void gemm(int kc, int pf) {
  int nib = M / MR / MO, njb = N / NR / NO;
  for (int k0 = 0; k0 < K; k0 += kc) {
    int kk = K - k0 < kc ? K - k0 : kc;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nib * njb; blk++) {
      int jb = blk / nib, ib = blk % nib;
      for (int i1 = 0; i1 < MO; i1++)
        for (int j1 = 0; j1 < NO; j1++) {
          int it = ib * MO + i1, jt = jb * NO + j1;
          tile(A + ((size_t)it * K + k0) * MR, B + ((size_t)jt * K + k0) * NR,
               C + (size_t)it * MR * N + jt * NR, kk, k0 > 0, pf);
        }
    }
  }
}

int main(int argc, char **argv) {
  int *dims[] = {&M, &K, &N, &MO, &NO};
  for (int i = 1; i < argc && i <= 5; i++) *dims[i - 1] = atoi(argv[i]);
  if (M % (MR * MO) || N % (NR * NO)) {
    fprintf(stderr, "M must be a multiple of %d x MO and N of %d x NO\n", MR, NR);
    return 1;
  }
  A = aligned_alloc(64, sizeof(float) * M * K);
  B = aligned_alloc(64, sizeof(float) * K * N);
  C = aligned_alloc(64, sizeof(float) * M * N);
  float *ref = malloc(sizeof(float) * M * N);
  for (long i = 0; i < (long)M * K; i++) A[i] = (float)(rand() % 7 - 3);  // exact sums
  for (long i = 0; i < (long)K * N; i++) B[i] = (float)(rand() % 5 - 2);
  int v[][2] = {{1 << 30, 0}, {1 << 30, 8}, {1 << 30, 16}, {1 << 30, 32}, {256, 0}, {128, 0}};
  const char *name[] = {"whole K, no prefetch", "whole K, prefetch 8 steps", "whole K, prefetch 16 steps",
                        "whole K, prefetch 32 steps", "K blocks of 256", "K blocks of 128"};
  int nv = sizeof v / sizeof v[0];
  gemm(v[0][0], v[0][1]);
  memcpy(ref, C, sizeof(float) * M * N);
  double best[16];
  for (int i = 0; i < nv; i++) best[i] = 1e9;
  for (int rep = 0; rep < 30; rep++)
    for (int i = 0; i < nv; i++) {
      double t0 = now();
      gemm(v[i][0], v[i][1]);
      double t = now() - t0;
      if (t < best[i]) best[i] = t;
      if (rep == 0 && memcmp(ref, C, sizeof(float) * M * N)) printf("MISMATCH: %s\n", name[i]);
    }
  printf("%dx%d tile, %d x %d -> %d, blocks %d x %d tiles\n", MR, NJ, M, K, N, MO, NO);
  for (int i = 0; i < nv; i++)
    printf("  %-28s %.3f ms  %.0f GFLOP/s\n", name[i], best[i] * 1e3, 2.0 * M * N * K / best[i] / 1e9);
  return 0;
}
