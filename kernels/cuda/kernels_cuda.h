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
ts_status ts_cuda_host_register(void *h, size_t nbytes);
void ts_cuda_host_unregister(void *h);
ts_status ts_cuda_from_host_async(const ts_kctx *ctx, void *dst, const void *h_src, size_t nbytes);
ts_status ts_cuda_host_wait(const ts_kctx *ctx);
ts_status ts_cuda_memory_info(int index, size_t *free_bytes, size_t *total_bytes, char *name,
                              size_t name_len);

/* linear.cu: the context's cuBLASLt handle. */
ts_status ts_cuda_blas_create(void **handle);
void ts_cuda_blas_destroy(void *handle);

/* vecops.cu: the synchronous data check of the ops that take indices:
 * TS_ERR_INVALID_ARGUMENT naming op, what[position] and its value if some
 * idx[n] is outside [0, V) (and not -100 when allow_ignore); TS_OK at once
 * when ctx->flags has TS_K_INDICES_CHECKED. */
ts_status ts_cuda_check_indices(const ts_kctx *ctx, const int32_t *idx, size_t N, size_t V,
                                int allow_ignore, const char *op, const char *what);

/* Workspace and state queries (kernels/backend.h). */
size_t ts_cuda_linear_workspace_bytes(size_t M, size_t N, size_t K, ts_dtype dt);
size_t ts_cuda_embedding_workspace_bytes(size_t N, ts_dtype dt);
size_t ts_cuda_rmsnorm_workspace_bytes(size_t N, size_t C, ts_dtype dt);
size_t ts_cuda_attention_workspace_bytes(size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                         ts_dtype dt);
size_t ts_cuda_attention_state_bytes(size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                     ts_dtype dt);
ts_dtype ts_cuda_attention_probs_dtype(const ts_kctx *ctx, ts_dtype dt, int bidirectional);
size_t ts_cuda_layernorm_workspace_bytes(size_t N, size_t C, ts_dtype dt);
size_t ts_cuda_bias_workspace_bytes(size_t N, size_t C, ts_dtype dt);

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

/* The model's ops (vecops.cu, linear.cu, embedding.cu, layers.cu,
 * attention.cu, cross_entropy.cu): contracts of kernels/kernels.h. */
ts_status ts_cuda_add(const ts_kctx *ctx, void *out, const void *a, const void *b, size_t n,
                      ts_dtype dt);
ts_status ts_cuda_sumsq(const ts_kctx *ctx, double *out, const void *x, size_t n, ts_dtype dt);
ts_status ts_cuda_sum_ranks(const ts_kctx *ctx, void *out, const void *const *parts, int n,
                            size_t count, ts_dtype dt, int accumulate);
ts_status ts_cuda_nonfinite(const ts_kctx *ctx, int32_t *flag, const void *x, size_t n,
                            ts_dtype dt);
ts_status ts_cuda_loss_sum(const ts_kctx *ctx, double *out, const float *loss_rows,
                           const int32_t *targets, size_t N);
ts_status ts_cuda_linear_forward(const ts_kctx *ctx, void *out, const void *inp,
                                 const void *weight, size_t M, size_t N, size_t K, ts_dtype dt);
ts_status ts_cuda_linear_backward(const ts_kctx *ctx, void *dinp, void *dweight,
                                  const void *dout, const void *inp, const void *weight, size_t M,
                                  size_t N, size_t K, ts_dtype dt);
ts_status ts_cuda_embedding_forward(const ts_kctx *ctx, void *out, const int32_t *tokens,
                                    const void *wte, size_t N, size_t C, size_t V, ts_dtype dt);
ts_status ts_cuda_embedding_backward(const ts_kctx *ctx, void *dwte, const void *dout,
                                     const int32_t *tokens, size_t N, size_t C, size_t V,
                                     ts_dtype dt);
ts_status ts_cuda_rmsnorm_forward(const ts_kctx *ctx, void *out, float *rstd, const void *inp,
                                  const void *weight, size_t N, size_t C, float eps, ts_dtype dt);
ts_status ts_cuda_rmsnorm_backward(const ts_kctx *ctx, void *dinp, void *dweight,
                                   const void *dout, const void *inp, const void *weight,
                                   const float *rstd, size_t N, size_t C, ts_dtype dt);
ts_status ts_cuda_rope_forward(const ts_kctx *ctx, void *out, const void *x, size_t B, size_t T,
                               size_t H, size_t HS, float theta, ts_dtype dt);
ts_status ts_cuda_rope_backward(const ts_kctx *ctx, void *dx, const void *dout, size_t B,
                                size_t T, size_t H, size_t HS, float theta, ts_dtype dt);
ts_status ts_cuda_rope_forward_at(const ts_kctx *ctx, void *out, const void *x, size_t T,
                                  size_t pos0, size_t H, size_t HS, float theta, ts_dtype dt);
ts_status ts_cuda_attention_cached(const ts_kctx *ctx, void *out, const void *q, const void *k,
                                   const void *v, size_t T, size_t pos0, size_t NH, size_t NKV,
                                   size_t HS, ts_dtype dt);
ts_status ts_cuda_attention_forward(const ts_kctx *ctx, void *out, void *state, const void *q,
                                    const void *k, const void *v, size_t B, size_t T, size_t NH,
                                    size_t NKV, size_t HS, ts_dtype dt);
ts_status ts_cuda_attention_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                     const void *dout, const void *out, const void *q,
                                     const void *k, const void *v, const void *state, size_t B,
                                     size_t T, size_t NH, size_t NKV, size_t HS, ts_dtype dt);
ts_status ts_cuda_swiglu_forward(const ts_kctx *ctx, void *h, const void *gate, const void *up,
                                 size_t n, ts_dtype dt);
ts_status ts_cuda_swiglu_backward(const ts_kctx *ctx, void *dgate, void *dup, const void *dh,
                                  const void *gate, const void *up, size_t n, ts_dtype dt);
ts_status ts_cuda_cross_entropy_forward(const ts_kctx *ctx, float *loss_rows, const void *logits,
                                        const int32_t *targets, size_t N, size_t V, ts_dtype dt);
ts_status ts_cuda_cross_entropy_fused(const ts_kctx *ctx, float *loss_rows, void *dlogits,
                                      const void *logits, const int32_t *targets, size_t N,
                                      size_t V, float dloss, ts_dtype dt);
ts_status ts_cuda_cross_entropy_backward(const ts_kctx *ctx, void *dlogits, const void *logits,
                                         const int32_t *targets, size_t N, size_t V, float dloss,
                                         ts_dtype dt);


/* The BERT-class encoder ops (layers.cu: LayerNorm, bias, GELU, token
 * types; attention.cu: bidirectional attention). */
ts_status ts_cuda_layernorm_forward(const ts_kctx *ctx, void *out, float *mean, float *rstd,
                                    const void *inp, const void *weight, const void *bias,
                                    size_t N, size_t C, float eps, ts_dtype dt);
ts_status ts_cuda_layernorm_backward(const ts_kctx *ctx, void *dinp, void *dweight, void *dbias,
                                     const void *dout, const void *inp, const void *weight,
                                     const float *mean, const float *rstd, size_t N, size_t C,
                                     ts_dtype dt);
ts_status ts_cuda_gelu_forward(const ts_kctx *ctx, void *out, const void *inp, size_t n,
                               ts_gelu_kind kind, ts_dtype dt);
ts_status ts_cuda_gelu_backward(const ts_kctx *ctx, void *dinp, const void *dout,
                                const void *inp, size_t n, ts_gelu_kind kind, ts_dtype dt);
ts_status ts_cuda_bias_add(const ts_kctx *ctx, void *out, const void *bias, size_t N, size_t C,
                           ts_dtype dt);
ts_status ts_cuda_bias_backward(const ts_kctx *ctx, void *dbias, const void *dout, size_t N,
                                size_t C, ts_dtype dt);
ts_status ts_cuda_token_types(const ts_kctx *ctx, int32_t *types, const int32_t *tokens, size_t B,
                              size_t T, int32_t sep_id, size_t n_types);
ts_status ts_cuda_attention_bidir_forward(const ts_kctx *ctx, void *out, void *state,
                                          const void *q, const void *k, const void *v,
                                          const int32_t *ids, int32_t pad_id, size_t B, size_t T,
                                          size_t NH, size_t HS, ts_dtype dt);
ts_status ts_cuda_attention_bidir_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                           const void *dout, const void *out, const void *q,
                                           const void *k, const void *v, const void *state,
                                           size_t B, size_t T, size_t NH, size_t HS, ts_dtype dt);

#ifdef __cplusplus
}
#endif

#endif /* TS_KERNELS_CUDA_KERNELS_CUDA_H */
