/*
 * gpu_info.c — what a GPU run will load: the GPUs, the driver, the CUDA
 * runtime, and the cuDNN, cuBLASLt, NVRTC and NCCL libraries as this
 * process's loader resolves them, each with its version and the file it came
 * from. tools/gpu_bundle.sh carries it, and the bundle's run.sh prints it
 * before the GPU tests, so a failure can be read against the exact stack
 * it ran on.
 *
 *   gpu_info        one line per item on stdout:
 *     gpu: 1 device: 0 NVIDIA H100 80GB HBM3 (sm_90, 79.2 GiB)   | none (why)
 *     driver: CUDA 13.0                                            | none
 *     cuda runtime: 13.0 (linked statically)
 *     cudnn: 9.19.0 (/usr/local/cuda/lib64/libcudnn.so.9; built against 9.19.0)
 *     cublasLt: 13.1.0 (/usr/local/cuda/lib64/libcublasLt.so.13)
 *     nvrtc: 13.0 (/usr/local/cuda/lib64/libnvrtc.so.13)
 *     nccl: 2.28.9 (/usr/local/cuda/lib64/libnccl.so.2)
 *   A library the loader cannot find reads "not found (dlerror's text)".
 *
 * The libraries are opened by name (dlopen), as tessera's binaries find
 * them: LD_LIBRARY_PATH (the bundle's env.sh), then the rpath
 * /usr/local/cuda/lib64 this binary shares with them, then ld.so.cache. The
 * CUDA runtime is static (third_party/cuda.BUILD), so only the driver is
 * the machine's own. NVRTC is listed because cuDNN compiles some attention
 * kernels at run time with it.
 *
 * Exit status: 0 when a GPU and every library are there, 1 otherwise (a
 * machine without a GPU prints the same lines and exits 1).
 */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <cudnn_version.h>
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The file the loader resolved for handle h (dlinfo's link map), its
 * symbolic links followed (the name the loader used depends on how it
 * searched: RUNPATH, LD_LIBRARY_PATH or its cache). */
static const char *path_of(void *h) {
  static char real[PATH_MAX];
  struct link_map *lm = NULL;
  if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_name || !*lm->l_name) return "?";
  return realpath(lm->l_name, real) ? real : lm->l_name;
}

/* dlopen(soname), or NULL after printing "NAME: not found (why)". */
static void *open_lib(const char *name, const char *soname) {
  void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (!h) printf("%s: not found (%s)\n", name, dlerror());
  return h;
}

/* Symbol sym of h, or NULL after printing "NAME: SONAME has no SYM". */
static void *symbol(void *h, const char *name, const char *sym) {
  void *f = dlsym(h, sym);
  if (!f) printf("%s: %s has no %s\n", name, path_of(h), sym);
  return f;
}

/* Prints the devices; 0 when at least one is there. */
static int gpus(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    printf("gpu: none (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
    return 1;
  }
  printf("gpu: %d device%s:", n, n == 1 ? "" : "s");
  for (int i = 0; i < n; i++) {
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      printf(" %d (no properties)", i);
      continue;
    }
    printf("%s %d %s (sm_%d%d, %.1f GiB)", i ? ";" : "", i, p.name, p.major, p.minor,
           (double)p.totalGlobalMem / (1 << 30));
  }
  printf("\n");
  return 0;
}

int main(void) {
  int missing = gpus();
  int v = 0;
  if (cudaDriverGetVersion(&v) == cudaSuccess && v > 0) {
    printf("driver: CUDA %d.%d\n", v / 1000, v % 1000 / 10);
  } else {
    printf("driver: none\n");
    missing = 1;
  }
  cudaRuntimeGetVersion(&v);
  printf("cuda runtime: %d.%d (linked statically)\n", v / 1000, v % 1000 / 10);

  void *h = open_lib("cudnn", "libcudnn.so.9");
  size_t (*cudnn_version)(void) = h ? (size_t (*)(void))symbol(h, "cudnn", "cudnnGetVersion") : NULL;
  if (cudnn_version) {
    size_t c = cudnn_version(); /* major * 10000 + minor * 100 + patch (cuDNN 9) */
    printf("cudnn: %zu.%zu.%zu (%s; built against %d.%d.%d)\n", c / 10000, c % 10000 / 100,
           c % 100, path_of(h), CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
  }
  missing |= !cudnn_version;

  h = open_lib("cublasLt", "libcublasLt.so.13");
  size_t (*lt_version)(void) = h ? (size_t (*)(void))symbol(h, "cublasLt", "cublasLtGetVersion") : NULL;
  if (lt_version) {
    size_t c = lt_version(); /* major * 10000 + minor * 100 + patch */
    printf("cublasLt: %zu.%zu.%zu (%s)\n", c / 10000, c % 10000 / 100, c % 100, path_of(h));
  }
  missing |= !lt_version;

  h = open_lib("nvrtc", "libnvrtc.so.13");
  int (*nvrtc_version)(int *, int *) = h ? (int (*)(int *, int *))symbol(h, "nvrtc", "nvrtcVersion") : NULL;
  int major = 0, minor = 0;
  if (nvrtc_version && nvrtc_version(&major, &minor) == 0)
    printf("nvrtc: %d.%d (%s)\n", major, minor, path_of(h));
  missing |= !nvrtc_version;

  h = open_lib("nccl", "libnccl.so.2");
  int (*nccl_version)(int *) = h ? (int (*)(int *))symbol(h, "nccl", "ncclGetVersion") : NULL;
  int n = 0;
  if (nccl_version && nccl_version(&n) == 0) /* major * 10000 + minor * 100 + patch (2.9+) */
    printf("nccl: %d.%d.%d (%s)\n", n / 10000, n % 10000 / 100, n % 100, path_of(h));
  missing |= !nccl_version;
  return missing ? 1 : 0;
}
