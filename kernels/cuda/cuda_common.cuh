/*
 * cuda_common.cuh — private helpers of the CUDA kernels: typed element
 * load/store for the storage dtypes (bit-exact with the CPU through
 * kernels/elementwise.h) and the grid size of a grid-stride launch.
 */
#ifndef TS_KERNELS_CUDA_CUDA_COMMON_CUH
#define TS_KERNELS_CUDA_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "base/base.h"
#include "kernels/elementwise.h"
#include "kernels/kernels.h"

/* Storage type of a dtype: float for fp32, uint16_t bits for bf16/fp16. */
template <ts_dtype DT>
struct ts_storage {
  typedef uint16_t type;
};
template <>
struct ts_storage<TS_FP32> {
  typedef float type;
};

/* Widens one stored element to fp32 (exact). */
template <ts_dtype DT>
__device__ __forceinline__ float ts_ld(const void *p, size_t i);
template <>
__device__ __forceinline__ float ts_ld<TS_FP32>(const void *p, size_t i) {
  return ((const float *)p)[i];
}
template <>
__device__ __forceinline__ float ts_ld<TS_BF16>(const void *p, size_t i) {
  return ts_bf16_to_f32(((const uint16_t *)p)[i]);
}
template <>
__device__ __forceinline__ float ts_ld<TS_FP16>(const void *p, size_t i) {
  return ts_f16_to_f32(((const uint16_t *)p)[i]);
}

/* Rounds x to nearest even and stores it as element i. */
template <ts_dtype DT>
__device__ __forceinline__ void ts_st(void *p, size_t i, float x);
template <>
__device__ __forceinline__ void ts_st<TS_FP32>(void *p, size_t i, float x) {
  ((float *)p)[i] = x;
}
template <>
__device__ __forceinline__ void ts_st<TS_BF16>(void *p, size_t i, float x) {
  ((uint16_t *)p)[i] = ts_f32_to_bf16(x);
}
template <>
__device__ __forceinline__ void ts_st<TS_FP16>(void *p, size_t i, float x) {
  ((uint16_t *)p)[i] = ts_f32_to_f16(x);
}

enum { TS_CUDA_BLOCK = 256 };

/* Blocks for a grid-stride loop over n elements: enough to fill the device
 * (capped at 65535 * 8; the loop covers the rest). */
static inline unsigned ts_cuda_grid(size_t n) {
  size_t blocks = (n + TS_CUDA_BLOCK - 1) / TS_CUDA_BLOCK;
  const size_t cap = 65535u * 8u;
  if (blocks > cap) blocks = cap;
  return blocks == 0 ? 1u : (unsigned)blocks;
}

/* Calls F<DT>(args...) for the runtime dtype dt (fp32, bf16, fp16; the
 * front has checked it). */
#define TS_CUDA_DT_CALL(dt, F, ...)  \
  do {                               \
    switch (dt) {                    \
      case TS_FP32:                  \
        F<TS_FP32>(__VA_ARGS__);     \
        break;                       \
      case TS_BF16:                  \
        F<TS_BF16>(__VA_ARGS__);     \
        break;                       \
      default:                       \
        F<TS_FP16>(__VA_ARGS__);     \
        break;                       \
    }                                \
  } while (0)

/* TS_ERR_CUDA naming op if the launches since the last check failed, else
 * TS_OK (errors raised while kernels run show up at a later sync). */
static inline ts_status ts_cuda_launched(const char *op) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return TS_OK;
  return ts_set_error(TS_ERR_CUDA, "%s (cuda): launch failed: %s", op, cudaGetErrorString(e));
}

/* Sum over a warp, in a fixed butterfly order (deterministic). */
template <typename T>
__device__ __forceinline__ T ts_warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Max over a warp. */
__device__ __forceinline__ float ts_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024), in a
 * fixed order for a fixed block size; every thread gets the result. sh: 32
 * elements of shared memory, free before and after the call. */
template <typename T>
__device__ T ts_block_sum(T v, T *sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = ts_warp_sum(v);
  __syncthreads(); /* sh may still be read by a previous call */
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : (T)0;
  return ts_warp_sum(v);
}

/* Max of v over the block; same rules as ts_block_sum. */
__device__ inline float ts_block_max(float v, float *sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = ts_warp_max(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : -INFINITY;
  return ts_warp_max(v);
}

/* The CUDA backend's private per-context state (ctx->backend_state):
 * device scratch for two-pass reductions and data checks. Allocated by
 * ts_cuda_context_init, outside the ledger (it is part of the context's
 * overhead that the engine measures with cudaMemGetInfo). */
enum { TS_CUDA_PARTIALS = 1024 }; /* blocks of a two-pass reduction */
typedef struct ts_cuda_state {
  double *partials;   /* (TS_CUDA_PARTIALS) fp64 */
  int32_t *check;     /* (2): first bad position (INT32_MAX if none), its value */
  cudaEvent_t copied; /* recorded after each ts_k_from_host_async */
} ts_cuda_state;

static inline ts_cuda_state *ts_cuda_state_of(const ts_kctx *ctx) {
  return (ts_cuda_state *)ctx->backend_state;
}

/* TS_ERR_INVALID_USAGE unless ctx carries the state ts_k_context_init
 * makes (a context filled by hand has none). */
static inline ts_status ts_cuda_need_state(const ts_kctx *ctx, const char *op) {
  if (ctx->backend_state) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_USAGE,
                      "%s (cuda): the context has no CUDA state: make it with ts_k_context_init",
                      op);
}

/* A data check on the device (vecops.cu): ts_cuda_first_bad sets the
 * state's check[0] to TS_CUDA_NONE_BAD, calls launch(check, arg, stream) to
 * queue kernels that atomicMin the first bad position into it (a minimum:
 * the same answer in any order), and reads it back into *pos (a
 * synchronisation). TS_ERR_INVALID_USAGE without the context's state,
 * TS_ERR_CUDA naming op and `what` if a call fails. */
enum { TS_CUDA_NONE_BAD = 0x7fffffff };
typedef void (*ts_cuda_check_launch)(int32_t *check, const void *arg, cudaStream_t s);
ts_status ts_cuda_first_bad(const ts_kctx *ctx, ts_cuda_check_launch launch, const void *arg,
                            int32_t *pos, const char *op, const char *what);

#endif /* TS_KERNELS_CUDA_CUDA_COMMON_CUH */
