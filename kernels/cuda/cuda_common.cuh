/*
 * cuda_common.cuh — private helpers of the CUDA kernels: typed element
 * load/store for the storage dtypes (bit-exact with the CPU through
 * kernels/elementwise.h) and the grid size of a grid-stride launch.
 */
#ifndef TS_KERNELS_CUDA_CUDA_COMMON_CUH
#define TS_KERNELS_CUDA_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "base/base.h"
#include "kernels/elementwise.h"

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

#endif /* TS_KERNELS_CUDA_CUDA_COMMON_CUH */
