/*
 * adamw.cu — CUDA body of ts_k_adamw. The per-element math is
 * ts_adamw_element of kernels/elementwise.h (IEEE-rounded operations only,
 * no fused multiply-add), and the per-step constants come from the same
 * host function as on the CPU, so CPU and CUDA agree bit for bit.
 * Grid-stride loop on ctx->stream.
 */
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

template <ts_dtype PDT, ts_dtype GDT>
__global__ void adamw_kernel(float *master, void *param_out, float *m, float *v, const void *grad,
                             size_t n, ts_adamw_coeffs c) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float mi = m[i], vi = v[i];
    float p = ts_adamw_element(master[i], ts_ld<GDT>(grad, i), &mi, &vi, c);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    if (param_out) ts_st<PDT>(param_out, i, p);
  }
}

template <ts_dtype PDT>
static void launch_adamw(float *master, void *param_out, float *m, float *v, const void *grad,
                         ts_dtype grad_dt, size_t n, ts_adamw_coeffs c, cudaStream_t s) {
  unsigned grid = ts_cuda_grid(n);
  switch (grad_dt) {
    case TS_FP32:
      adamw_kernel<PDT, TS_FP32>
          <<<grid, TS_CUDA_BLOCK, 0, s>>>(master, param_out, m, v, grad, n, c);
      break;
    case TS_BF16:
      adamw_kernel<PDT, TS_BF16>
          <<<grid, TS_CUDA_BLOCK, 0, s>>>(master, param_out, m, v, grad, n, c);
      break;
    case TS_FP16:
      adamw_kernel<PDT, TS_FP16>
          <<<grid, TS_CUDA_BLOCK, 0, s>>>(master, param_out, m, v, grad, n, c);
      break;
  }
}

extern "C" ts_status ts_cuda_adamw(const ts_kctx *ctx, float *master, void *param_out,
                                    ts_dtype param_dt, float *m, float *v, const void *grad,
                                    ts_dtype grad_dt, size_t n, const ts_adamw_hparams *hp) {
  if (n == 0) return TS_OK;
  cudaStream_t s = (cudaStream_t)ctx->stream;
  ts_adamw_coeffs c = ts_adamw_make_coeffs(hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay,
                                           hp->step, hp->grad_scale);
  switch (param_dt) {
    case TS_FP32:
      launch_adamw<TS_FP32>(master, param_out, m, v, grad, grad_dt, n, c, s);
      break;
    case TS_BF16:
      launch_adamw<TS_BF16>(master, param_out, m, v, grad, grad_dt, n, c, s);
      break;
    case TS_FP16:
      launch_adamw<TS_FP16>(master, param_out, m, v, grad, grad_dt, n, c, s);
      break;
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return ts_set_error(TS_ERR_CUDA, "ts_k_adamw (cuda): launch, n = %zu: %s", n,
                        cudaGetErrorString(e));
  return TS_OK;
}
