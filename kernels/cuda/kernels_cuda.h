/*
 * kernels_cuda.h — private: the CUDA backend's bodies, which
 * kernels/cuda/backend.c lists in its table (kernels/backend.h). Arguments
 * have been validated by the kernels front; contracts are those of the
 * public functions of kernels/kernels.h with the same name after ts_k_.
 *
 * Every pointer is device memory unless named h_; kernels are launched on
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

/* ---- devices, contexts, memory (memory.cu) ----------------------------- */

int ts_cuda_device_count(void);
ts_status ts_cuda_context_init(ts_kctx *ctx, int index);
void ts_cuda_context_destroy(ts_kctx *ctx);
ts_status ts_cuda_synchronize(const ts_kctx *ctx);
ts_status ts_cuda_alloc(size_t nbytes, void **out);
void ts_cuda_free(void *p);
ts_status ts_cuda_copy(const ts_kctx *ctx, void *dst, const void *src, size_t nbytes);
ts_status ts_cuda_to_host(const ts_kctx *ctx, void *h_dst, const void *src, size_t nbytes);
ts_status ts_cuda_from_host(const ts_kctx *ctx, void *dst, const void *h_src, size_t nbytes);

/* ---- ops -------------------------------------------------------------------- */

/* cast.cu: out (n, out_dt) = in (n, in_dt), RNE; zero: cudaMemsetAsync. */
ts_status ts_cuda_cast(const ts_kctx *ctx, void *out, ts_dtype out_dt, const void *in,
                       ts_dtype in_dt, size_t n);
ts_status ts_cuda_zero(const ts_kctx *ctx, void *x, size_t nbytes);

/* adamw.cu: master, m, v (n) fp32 updated; param_out (n, param_dt) written
 * if non-NULL; grad (n, grad_dt); hp host. */
ts_status ts_cuda_adamw(const ts_kctx *ctx, float *master, void *param_out, ts_dtype param_dt,
                        float *m, float *v, const void *grad, ts_dtype grad_dt, size_t n,
                        const ts_adamw_hparams *hp);

#ifdef __cplusplus
}
#endif

#endif /* TS_KERNELS_CUDA_KERNELS_CUDA_H */
