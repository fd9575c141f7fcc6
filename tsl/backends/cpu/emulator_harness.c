/* Calls one TVM-compiled CPU kernel (the object file of a cross-compiled artifact) on tensors
 * read from a file, and writes the last tensor (the output) back: the whole "runtime" that a
 * kernel needs when it runs under QEMU user-mode emulation, where TVM itself cannot run.
 *
 * Input file (little-endian): int32 nargs; per tensor: uint8 type code, uint8 bits, uint16
 * lanes, int32 ndim, int64 shape[ndim]; then every tensor's bytes, in order.
 * The kernel's parallel loops run their tasks one after the other: numerics, not speed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tvm/ffi/c_api.h>

typedef struct { void* sync_handle; int32_t num_task; } TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

/* The kernel calls its runtime through these pointers, which TVM's module loader fills. */
static int parallel_launch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  TVMParallelGroupEnv env = {0, num_task > 0 ? num_task : TSL_EMULATED_CORES};
  for (int i = 0; i < env.num_task; ++i) {
    int rc = flambda(i, &env, cdata);
    if (rc != 0) return rc;
  }
  return 0;
}
static int parallel_barrier(int task_id, TVMParallelGroupEnv* penv) { return 0; }
static void* alloc_workspace(int device_type, int device_id, uint64_t nbytes, int dtype_code,
                             int dtype_bits) {
  void* p = NULL;
  return posix_memalign(&p, 64, nbytes ? nbytes : 1) == 0 ? p : NULL;
}
static int free_workspace(int device_type, int device_id, void* ptr) {
  free(ptr);
  return 0;
}
void* __TVMBackendParallelLaunch = (void*)parallel_launch;
void* __TVMBackendParallelBarrier = (void*)parallel_barrier;
void* __TVMBackendAllocWorkspace = (void*)alloc_workspace;
void* __TVMBackendFreeWorkspace = (void*)free_workspace;

void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* message) {
  fprintf(stderr, "%s: %s\n", kind, message);
}
void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  fprintf(stderr, "%s: ", kind);
  for (int32_t i = 0; i < n; ++i) fputs(parts[i], stderr);
  fputc('\n', stderr);
}
void* __TVMFFIErrorSetRaisedFromCStr = (void*)TVMFFIErrorSetRaisedFromCStr;
void* __TVMFFIErrorSetRaisedFromCStrParts = (void*)TVMFFIErrorSetRaisedFromCStrParts;

int __tvm_ffi_main(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);

static void must_read(void* p, size_t n, FILE* f) {
  if (fread(p, 1, n, f) != n) { fputs("emulator harness: short input file\n", stderr); exit(3); }
}

int main(int argc, char** argv) {
  if (argc != 3) { fputs("usage: harness IN OUT\n", stderr); return 2; }
  FILE* in = fopen(argv[1], "rb");
  if (!in) { perror(argv[1]); return 2; }
  int32_t nargs;
  must_read(&nargs, 4, in);
  DLTensor* t = calloc(nargs, sizeof(DLTensor));
  TVMFFIAny* a = calloc(nargs, sizeof(TVMFFIAny));
  size_t* nbytes = calloc(nargs, sizeof(size_t));
  for (int i = 0; i < nargs; ++i) {
    uint8_t code, bits; uint16_t lanes; int32_t ndim;
    must_read(&code, 1, in); must_read(&bits, 1, in); must_read(&lanes, 2, in);
    must_read(&ndim, 4, in);
    int64_t* shape = calloc(ndim ? ndim : 1, sizeof(int64_t));
    must_read(shape, 8 * (size_t)ndim, in);
    size_t n = (size_t)(bits * lanes + 7) / 8;
    for (int d = 0; d < ndim; ++d) n *= (size_t)shape[d];
    nbytes[i] = n;
    t[i].device.device_type = kDLCPU;
    t[i].ndim = ndim;
    t[i].dtype.code = code; t[i].dtype.bits = bits; t[i].dtype.lanes = lanes;
    t[i].shape = shape;
    a[i].type_index = kTVMFFIDLTensorPtr;
    a[i].v_ptr = &t[i];
  }
  for (int i = 0; i < nargs; ++i) {
    if (posix_memalign(&t[i].data, 64, nbytes[i] ? nbytes[i] : 1) != 0) return 4;
    must_read(t[i].data, nbytes[i], in);
  }
  fclose(in);
  TVMFFIAny result;
  memset(&result, 0, sizeof(result));
  int rc = __tvm_ffi_main(NULL, a, nargs, &result);
  if (rc != 0) { fprintf(stderr, "emulator harness: the kernel returned %d\n", rc); return 5; }
  FILE* out = fopen(argv[2], "wb");
  if (!out || fwrite(t[nargs - 1].data, 1, nbytes[nargs - 1], out) != nbytes[nargs - 1]) {
    perror(argv[2]);
    return 2;
  }
  fclose(out);
  return 0;
}
