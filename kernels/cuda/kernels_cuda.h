/*
 * kernels_cuda.h — private: the CUDA implementations behind the device-
 * neutral entry points of kernels/kernels.h. ts_k_cast, ts_k_zero and ts_k_adamw call
 * these when ctx->device == TS_DEVICE_CUDA in a build with -DTS_WITH_CUDA
 * (//kernels:kernels_with_cuda). Arguments have been validated by the
 * caller; contracts are those of the public functions.
 *
 * Every pointer is device memory; kernels are launched on
 * (cudaStream_t)ctx->stream and are asynchronous: a launch failure returns
 * TS_ERR_CUDA with cudaGetErrorString's text, errors during execution show
 * up at the caller's next synchronisation.
 */
#ifndef TS_KERNELS_CUDA_KERNELS_CUDA_H
#define TS_KERNELS_CUDA_KERNELS_CUDA_H

#include <stddef.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* CUDA body of ts_k_cast: out (n, out_dt) = in (n, in_dt), RNE. */
ts_status ts_k_cast_cuda(const ts_kctx *ctx, void *out, ts_dtype out_dt, const void *in,
                         ts_dtype in_dt, size_t n);

/* CUDA body of ts_k_zero: cudaMemsetAsync of nbytes at x. */
ts_status ts_k_zero_cuda(const ts_kctx *ctx, void *x, size_t nbytes);

/* CUDA body of ts_k_adamw: master, m, v (n) fp32 updated; param_out
 * (n, param_dt) written if non-NULL; grad (n, grad_dt). */
ts_status ts_k_adamw_cuda(const ts_kctx *ctx, float *master, void *param_out, ts_dtype param_dt,
                          float *m, float *v, const void *grad, ts_dtype grad_dt, size_t n,
                          const ts_adamw_hparams *hp);

#ifdef __cplusplus
}
#endif

#endif /* TS_KERNELS_CUDA_KERNELS_CUDA_H */
