/*
 * cast.cu — CUDA bodies of ts_k_cast and ts_k_zero: storage conversions between fp32, bf16
 * and fp16 with the bit-exact conversions of kernels/elementwise.h, so the
 * result equals the CPU's bit for bit. Grid-stride loop on ctx->stream.
 */
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

template <ts_dtype ODT, ts_dtype IDT>
__global__ void cast_kernel(void *out, const void *in, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    ts_st<ODT>(out, i, ts_ld<IDT>(in, i));
}

template <ts_dtype ODT>
static void launch_cast(void *out, const void *in, ts_dtype in_dt, size_t n, cudaStream_t s) {
  unsigned grid = ts_cuda_grid(n);
  switch (in_dt) {
    case TS_FP32:
      cast_kernel<ODT, TS_FP32><<<grid, TS_CUDA_BLOCK, 0, s>>>(out, in, n);
      break;
    case TS_BF16:
      cast_kernel<ODT, TS_BF16><<<grid, TS_CUDA_BLOCK, 0, s>>>(out, in, n);
      break;
    case TS_FP16:
      cast_kernel<ODT, TS_FP16><<<grid, TS_CUDA_BLOCK, 0, s>>>(out, in, n);
      break;
  }
}

extern "C" ts_status ts_cuda_cast(const ts_kctx *ctx, void *out, ts_dtype out_dt, const void *in,
                                   ts_dtype in_dt, size_t n) {
  cudaStream_t s = (cudaStream_t)ctx->stream;
  if (n == 0) return TS_OK;
  if (out_dt == in_dt) {
    if (out == in) return TS_OK;
    cudaError_t e =
        cudaMemcpyAsync(out, in, n * ts_dtype_size(out_dt), cudaMemcpyDeviceToDevice, s);
    if (e != cudaSuccess)
      return ts_set_error(TS_ERR_CUDA, "ts_k_cast (cuda): cudaMemcpyAsync of %zu elements: %s", n,
                          cudaGetErrorString(e));
    return TS_OK;
  }
  switch (out_dt) {
    case TS_FP32:
      launch_cast<TS_FP32>(out, in, in_dt, n, s);
      break;
    case TS_BF16:
      launch_cast<TS_BF16>(out, in, in_dt, n, s);
      break;
    case TS_FP16:
      launch_cast<TS_FP16>(out, in, in_dt, n, s);
      break;
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return ts_set_error(TS_ERR_CUDA, "ts_k_cast (cuda): launch %s -> %s, n = %zu: %s",
                        ts_dtype_name(in_dt), ts_dtype_name(out_dt), n, cudaGetErrorString(e));
  return TS_OK;
}

extern "C" ts_status ts_cuda_zero(const ts_kctx *ctx, void *x, size_t nbytes) {
  cudaError_t e = cudaMemsetAsync(x, 0, nbytes, (cudaStream_t)ctx->stream);
  if (e != cudaSuccess)
    return ts_set_error(TS_ERR_CUDA, "ts_k_zero (cuda): cudaMemsetAsync of %zu bytes: %s", nbytes,
                        cudaGetErrorString(e));
  return TS_OK;
}
