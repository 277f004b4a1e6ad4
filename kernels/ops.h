/*
 * ops.h — private: the list of the device ops, the one place each op's
 * parameters are written (kernels/backend.h). From it come the backend
 * table's entries (backend.h), the CPU and CUDA backends' prototypes
 * (kernels/cpu/cpu_common.h, kernels/cuda/kernels_cuda.h: ts_cpu_NAME,
 * ts_cuda_NAME) and their tables (each backend's backend.c); the front's
 * public ts_k_NAME (kernels/kernels.h), written out there with its
 * documentation, is checked against it by the compiler (kernels.c).
 *
 * TS_K_OPS(X) calls X(name, (parameters)) once per op, in table order.
 * Every op returns a ts_status and takes the device context first.
 * Adding an op: a line here, its checks and documentation in the front,
 * a body in every backend.
 */
#ifndef TS_KERNELS_OPS_H
#define TS_KERNELS_OPS_H

#include "kernels/kernels.h"

#define TS_K_OPS(X)                                                                               \
  /* casts and vector ops */                                                                      \
  X(cast, (const ts_kctx *ctx, void *out, ts_dtype out_dt, const void *in, ts_dtype in_dt,        \
      size_t n))                                                                                  \
  X(zero, (const ts_kctx *ctx, void *x, size_t nbytes))                                           \
  X(add, (const ts_kctx *ctx, void *out, const void *a, const void *b, size_t n, ts_dtype dt))    \
  /* receives n == 0 (writes 0) */                                                                \
  X(sumsq, (const ts_kctx *ctx, double *out, const void *x, size_t n, ts_dtype dt))               \
  /* receives n == 0 (writes 0) */                                                                \
  X(nonfinite, (const ts_kctx *ctx, int32_t *flag, const void *x, size_t n, ts_dtype dt))         \
  /* 1 <= n <= TS_K_SUM_RANKS_MAX, count > 0, every part non-NULL */                              \
  X(sum_ranks, (const ts_kctx *ctx, void *out, const void *const *parts, int n, size_t count,     \
      ts_dtype dt, int accumulate))                                                               \
  /* the model's ops */                                                                           \
  /* K > 0 */                                                                                     \
  X(linear_forward, (const ts_kctx *ctx, void *out, const void *inp, const void *weight,          \
      size_t M, size_t N, size_t K, ts_dtype dt))                                                 \
  /* M, K > 0; N > 0; dinp or dweight non-NULL */                                                 \
  X(linear_backward, (const ts_kctx *ctx, void *dinp, void *dweight, const void *dout,            \
      const void *inp, const void *weight, size_t M, size_t N, size_t K, ts_dtype dt))            \
  /* K > 0 */                                                                                     \
  X(linear_bias_forward, (const ts_kctx *ctx, void *out, const void *inp, const void *weight,     \
      const void *bias, size_t M, size_t N, size_t K, ts_dtype dt))                               \
  /* fp8 (kernels.h "fp8 linear layer"): dt bf16 for the linear ops, ctx->wgrad NULL */       \
  X(fp8_quantize, (const ts_kctx *ctx, uint8_t *out, float *scale_inv, const void *inp,          \
      size_t R, size_t C, int transpose, ts_fp8_format fmt, ts_fp8_scaling scaling,              \
      ts_dtype dt))                                                                               \
  X(linear_fp8_forward, (const ts_kctx *ctx, void *out, const void *inp, const void *weight,      \
      size_t M, size_t N, size_t K, ts_fp8_scaling scaling, ts_dtype dt))                         \
  X(linear_fp8_backward, (const ts_kctx *ctx, void *dinp, void *dweight, const void *dout,        \
      const void *inp, const void *weight, size_t M, size_t N, size_t K, ts_fp8_scaling scaling,  \
      ts_dtype dt))                                                                               \
  /* receives C == 0 (tokens still checked) */                                                    \
  X(embedding_forward, (const ts_kctx *ctx, void *out, const int32_t *tokens, const void *wte,    \
      size_t N, size_t C, size_t V, ts_dtype dt))                                                 \
  /* receives C == 0 (tokens still checked) */                                                    \
  X(embedding_backward, (const ts_kctx *ctx, void *dwte, const void *dout,                        \
      const int32_t *tokens, size_t N, size_t C, size_t V, ts_dtype dt))                          \
  X(rmsnorm_forward, (const ts_kctx *ctx, void *out, float *rstd, const void *inp,                \
      const void *weight, size_t N, size_t C, float eps, ts_dtype dt))                            \
  X(rmsnorm_backward, (const ts_kctx *ctx, void *dinp, void *dweight, const void *dout,           \
      const void *inp, const void *weight, const float *rstd, size_t N, size_t C, ts_dtype dt))   \
  X(add_rmsnorm_forward, (const ts_kctx *ctx, void *out, float *rstd, void *res, const void *a,   \
      const void *b, const void *weight, size_t N, size_t C, float eps, ts_dtype dt))             \
  X(rope_forward, (const ts_kctx *ctx, void *out, const void *x, size_t B, size_t T, size_t H,    \
      size_t HS, float theta, ts_dtype dt))                                                       \
  X(rope_backward, (const ts_kctx *ctx, void *dx, const void *dout, size_t B, size_t T,           \
      size_t H, size_t HS, float theta, ts_dtype dt))                                             \
  /* decoding with a key/value cache: one sequence (kernels.h) */                                 \
  X(rope_forward_at, (const ts_kctx *ctx, void *out, const void *x, size_t T, size_t pos0,        \
      size_t H, size_t HS, float theta, ts_dtype dt))                                             \
  X(attention_cached, (const ts_kctx *ctx, void *out, const void *q, const void *k,               \
      const void *v, size_t T, size_t pos0, size_t NH, size_t NKV, size_t HS, ts_dtype dt))       \
  X(attention_forward, (const ts_kctx *ctx, void *out, void *state, const void *q,                \
      const void *k, const void *v, size_t B, size_t T, size_t NH, size_t NKV, size_t HS,         \
      ts_dtype dt))                                                                               \
  X(attention_backward, (const ts_kctx *ctx, void *dq, void *dk, void *dv, const void *dout,      \
      const void *out, const void *q, const void *k, const void *v, const void *state, size_t B,  \
      size_t T, size_t NH, size_t NKV, size_t HS, ts_dtype dt))                                   \
  X(swiglu_forward, (const ts_kctx *ctx, void *h, const void *gate, const void *up, size_t n,     \
      ts_dtype dt))                                                                               \
  X(swiglu_backward, (const ts_kctx *ctx, void *dgate, void *dup, const void *dh,                 \
      const void *gate, const void *up, size_t n, ts_dtype dt))                                   \
  X(cross_entropy_forward, (const ts_kctx *ctx, float *loss_rows, const void *logits,             \
      const int32_t *targets, size_t N, size_t V, ts_dtype dt))                                   \
  /* receives N == 0 (writes 0, 0) */                                                             \
  X(loss_sum, (const ts_kctx *ctx, double *out, const float *loss_rows, const int32_t *targets,   \
      size_t N))                                                                                  \
  X(cross_entropy_backward, (const ts_kctx *ctx, void *dlogits, const void *logits,               \
      const int32_t *targets, size_t N, size_t V, float dloss, ts_dtype dt))                      \
  X(cross_entropy_fused, (const ts_kctx *ctx, float *loss_rows, void *dlogits,                    \
      const void *logits, const int32_t *targets, size_t N, size_t V, float dloss, ts_dtype dt))  \
  /* BERT-class encoder ops. attention_bidir_forward receives ids == NULL when pad_id < 0 */      \
  /* (nothing masked) and checks that every batch row has a key that is not padding itself (the */\
  /* ids are on its device). */                                                                   \
  X(layernorm_forward, (const ts_kctx *ctx, void *out, float *mean, float *rstd,                  \
      const void *inp, const void *weight, const void *bias, size_t N, size_t C, float eps,       \
      ts_dtype dt))                                                                               \
  /* dinp, dweight, dbias: NULL skips (not all three NULL) */                                     \
  X(layernorm_backward, (const ts_kctx *ctx, void *dinp, void *dweight, void *dbias,              \
      const void *dout, const void *inp, const void *weight, const float *mean,                   \
      const float *rstd, size_t N, size_t C, ts_dtype dt))                                        \
  X(add_layernorm_forward, (const ts_kctx *ctx, void *out, float *mean, float *rstd, void *res,   \
      const void *a, const void *b, const void *weight, const void *bias, size_t N, size_t C,     \
      float eps, ts_dtype dt))                                                                    \
  X(gelu_forward, (const ts_kctx *ctx, void *out, const void *inp, size_t n, ts_gelu_kind kind,   \
      ts_dtype dt))                                                                               \
  X(gelu_backward, (const ts_kctx *ctx, void *dinp, const void *dout, const void *inp, size_t n,  \
      ts_gelu_kind kind, ts_dtype dt))                                                            \
  X(bias_add, (const ts_kctx *ctx, void *out, const void *bias, size_t N, size_t C,               \
      ts_dtype dt))                                                                               \
  X(bias_backward, (const ts_kctx *ctx, void *dbias, const void *dout, size_t N, size_t C,        \
      ts_dtype dt))                                                                               \
  X(token_types, (const ts_kctx *ctx, int32_t *types, const int32_t *tokens, size_t B, size_t T,  \
      int32_t sep_id, size_t n_types))                                                            \
  X(attention_bidir_forward, (const ts_kctx *ctx, void *out, void *state, const void *q,          \
      const void *k, const void *v, const int32_t *ids, int32_t pad_id, size_t B, size_t T,       \
      size_t NH, size_t HS, ts_dtype dt))                                                         \
  X(attention_bidir_backward, (const ts_kctx *ctx, void *dq, void *dk, void *dv,                  \
      const void *dout, const void *out, const void *q, const void *k, const void *v,             \
      const void *state, size_t B, size_t T, size_t NH, size_t HS, ts_dtype dt))                  \
  X(adamw, (const ts_kctx *ctx, float *master, void *param_out, ts_dtype param_dt, float *m,      \
      float *v, const void *grad, ts_dtype grad_dt, size_t n, const ts_adamw_hparams *hp))

#endif /* TS_KERNELS_OPS_H */
