/*
 * backend.h — private: the interface a device backend implements behind
 * the kernels front (kernels/kernels.c, kernels/kernels_encoder.c), in the
 * manner of ggml's ggml_backend_i: one table per device kind, filled by the
 * backend's own files (kernels/cpu/backend.c, kernels/cuda/backend.c), read
 * only by the front.
 *
 * Contract of every entry: the front has already validated the arguments
 * exactly as kernels/kernels.h documents (context and device, dtypes,
 * pointers the op needs, aliasing, shapes, workspace size against this
 * backend's own query), and has handled the empty cases the header defines
 * (n == 0 and the like), except where an entry says it receives them. The
 * backend checks only what depends on data it alone can read (tokens and
 * targets on its device) or on its own limits (BLAS's int dimensions), and
 * does so before writing any output. A NULL op means the backend has no
 * body for it: the front answers TS_ERR_UNSUPPORTED.
 *
 * Signatures are those of the public ts_k_* functions of the same name.
 * Adding a device backend means filling one more table and listing it in
 * kernels_front.h's backend array; adding an op means one more entry here,
 * its checks in the front (kernels.c, or kernels_encoder.c for the
 * BERT-class encoder ops), and a body in every backend that has one.
 */
#ifndef TS_KERNELS_BACKEND_H
#define TS_KERNELS_BACKEND_H

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_k_backend {
  const char *name; /* "cpu", "cuda" */
  ts_device device; /* the device kind it runs on */

  /* devices, contexts, memory */
  int (*device_count)(void);
  ts_status (*context_init)(ts_kctx *ctx, int index); /* ctx zeroed, device set */
  void (*context_destroy)(ts_kctx *ctx);
  ts_status (*synchronize)(const ts_kctx *ctx);
  /* NULL: the device reports no memory figures */
  ts_status (*memory_info)(int index, size_t *free_bytes, size_t *total_bytes, char *name,
                           size_t name_len);
  ts_status (*alloc)(size_t nbytes, void **out); /* nbytes > 0 */
  void (*free)(void *p);                         /* p != NULL */
  ts_status (*copy)(const ts_kctx *ctx, void *dst, const void *src, size_t nbytes);
  ts_status (*to_host)(const ts_kctx *ctx, void *h_dst, const void *src, size_t nbytes);
  ts_status (*from_host)(const ts_kctx *ctx, void *dst, const void *h_src, size_t nbytes);
  /* NULL: from_host is already synchronous and host memory needs no pinning */
  ts_status (*host_register)(void *h, size_t nbytes);
  void (*host_unregister)(void *h);
  ts_status (*from_host_async)(const ts_kctx *ctx, void *dst, const void *h_src, size_t nbytes);
  ts_status (*host_wait)(const ts_kctx *ctx);

  /* workspace queries (NULL: the op needs none on this device) */
  size_t (*linear_workspace_bytes)(size_t M, size_t N, size_t K, ts_dtype dt);
  size_t (*embedding_workspace_bytes)(size_t N, ts_dtype dt);
  size_t (*rmsnorm_workspace_bytes)(size_t N, size_t C, ts_dtype dt);
  size_t (*attention_workspace_bytes)(size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                      ts_dtype dt);
  size_t (*layernorm_workspace_bytes)(size_t N, size_t C, ts_dtype dt);
  size_t (*bias_workspace_bytes)(size_t N, size_t C, ts_dtype dt);
  /* NULL: P @ v takes P in fp32 on this device (ts_k_attention_probs_dtype) */
  ts_dtype (*attention_probs_dtype)(const ts_kctx *ctx, ts_dtype dt, int bidirectional);
  /* NULL: the probabilities, B * NH * T * T elements of dt */
  size_t (*attention_state_bytes)(size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                  ts_dtype dt);

  /* casts and vector ops */
  ts_status (*cast)(const ts_kctx *ctx, void *out, ts_dtype out_dt, const void *in,
                    ts_dtype in_dt, size_t n);
  ts_status (*zero)(const ts_kctx *ctx, void *x, size_t nbytes);
  ts_status (*add)(const ts_kctx *ctx, void *out, const void *a, const void *b, size_t n,
                   ts_dtype dt);
  /* receives n == 0 (writes 0) */
  ts_status (*sumsq)(const ts_kctx *ctx, double *out, const void *x, size_t n, ts_dtype dt);
  /* receives n == 0 (writes 0) */
  ts_status (*nonfinite)(const ts_kctx *ctx, int32_t *flag, const void *x, size_t n,
                         ts_dtype dt);

  /* 1 <= n <= TS_K_SUM_RANKS_MAX, count > 0, every part non-NULL */
  ts_status (*sum_ranks)(const ts_kctx *ctx, void *out, const void *const *parts, int n,
                         size_t count, ts_dtype dt, int accumulate);

  /* the model's ops */
  ts_status (*linear_forward)(const ts_kctx *ctx, void *out, const void *inp, const void *weight,
                              size_t M, size_t N, size_t K, ts_dtype dt); /* K > 0 */
  /* M, K > 0; N > 0; dinp or dweight non-NULL */
  ts_status (*linear_backward)(const ts_kctx *ctx, void *dinp, void *dweight, const void *dout,
                               const void *inp, const void *weight, size_t M, size_t N, size_t K,
                               ts_dtype dt);
  /* receives C == 0 (tokens still checked) */
  ts_status (*embedding_forward)(const ts_kctx *ctx, void *out, const int32_t *tokens,
                                 const void *wte, size_t N, size_t C, size_t V, ts_dtype dt);
  /* receives C == 0 (tokens still checked) */
  ts_status (*embedding_backward)(const ts_kctx *ctx, void *dwte, const void *dout,
                                  const int32_t *tokens, size_t N, size_t C, size_t V,
                                  ts_dtype dt);
  ts_status (*rmsnorm_forward)(const ts_kctx *ctx, void *out, float *rstd, const void *inp,
                               const void *weight, size_t N, size_t C, float eps, ts_dtype dt);
  ts_status (*rmsnorm_backward)(const ts_kctx *ctx, void *dinp, void *dweight, const void *dout,
                                const void *inp, const void *weight, const float *rstd, size_t N,
                                size_t C, ts_dtype dt);
  ts_status (*rope_forward)(const ts_kctx *ctx, void *out, const void *x, size_t B, size_t T,
                            size_t H, size_t HS, float theta, ts_dtype dt);
  ts_status (*rope_backward)(const ts_kctx *ctx, void *dx, const void *dout, size_t B, size_t T,
                             size_t H, size_t HS, float theta, ts_dtype dt);
  /* decoding with a key/value cache: one sequence (kernels.h) */
  ts_status (*rope_forward_at)(const ts_kctx *ctx, void *out, const void *x, size_t T,
                               size_t pos0, size_t H, size_t HS, float theta, ts_dtype dt);
  ts_status (*attention_cached)(const ts_kctx *ctx, void *out, const void *q, const void *k,
                                const void *v, size_t T, size_t pos0, size_t NH, size_t NKV,
                                size_t HS, ts_dtype dt);
  ts_status (*attention_forward)(const ts_kctx *ctx, void *out, void *state, const void *q,
                                 const void *k, const void *v, size_t B, size_t T, size_t NH,
                                 size_t NKV, size_t HS, ts_dtype dt);
  ts_status (*attention_backward)(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                  const void *dout, const void *out, const void *q, const void *k,
                                  const void *v, const void *state, size_t B, size_t T, size_t NH,
                                  size_t NKV, size_t HS, ts_dtype dt);
  ts_status (*swiglu_forward)(const ts_kctx *ctx, void *h, const void *gate, const void *up,
                              size_t n, ts_dtype dt);
  ts_status (*swiglu_backward)(const ts_kctx *ctx, void *dgate, void *dup, const void *dh,
                               const void *gate, const void *up, size_t n, ts_dtype dt);
  ts_status (*cross_entropy_forward)(const ts_kctx *ctx, float *loss_rows, const void *logits,
                                     const int32_t *targets, size_t N, size_t V, ts_dtype dt);
  /* receives N == 0 (writes 0, 0) */
  ts_status (*loss_sum)(const ts_kctx *ctx, double *out, const float *loss_rows,
                        const int32_t *targets, size_t N);
  ts_status (*cross_entropy_backward)(const ts_kctx *ctx, void *dlogits, const void *logits,
                                      const int32_t *targets, size_t N, size_t V, float dloss,
                                      ts_dtype dt);
  ts_status (*cross_entropy_fused)(const ts_kctx *ctx, float *loss_rows, void *dlogits,
                                   const void *logits, const int32_t *targets, size_t N, size_t V,
                                   float dloss, ts_dtype dt);

  /* BERT-class encoder ops. attention_bidir_forward receives ids == NULL
   * when pad_id < 0 (nothing masked) and checks that every batch row has a
   * key that is not padding itself (the ids are on its device). */
  ts_status (*layernorm_forward)(const ts_kctx *ctx, void *out, float *mean, float *rstd,
                                 const void *inp, const void *weight, const void *bias, size_t N,
                                 size_t C, float eps, ts_dtype dt);
  /* dinp, dweight, dbias: NULL skips (not all three NULL) */
  ts_status (*layernorm_backward)(const ts_kctx *ctx, void *dinp, void *dweight, void *dbias,
                                  const void *dout, const void *inp, const void *weight,
                                  const float *mean, const float *rstd, size_t N, size_t C,
                                  ts_dtype dt);
  ts_status (*gelu_forward)(const ts_kctx *ctx, void *out, const void *inp, size_t n,
                            ts_gelu_kind kind, ts_dtype dt);
  ts_status (*gelu_backward)(const ts_kctx *ctx, void *dinp, const void *dout, const void *inp,
                             size_t n, ts_gelu_kind kind, ts_dtype dt);
  ts_status (*bias_add)(const ts_kctx *ctx, void *out, const void *bias, size_t N, size_t C,
                        ts_dtype dt);
  ts_status (*bias_backward)(const ts_kctx *ctx, void *dbias, const void *dout, size_t N,
                             size_t C, ts_dtype dt);
  ts_status (*token_types)(const ts_kctx *ctx, int32_t *types, const int32_t *tokens, size_t B,
                           size_t T, int32_t sep_id, size_t n_types);
  ts_status (*attention_bidir_forward)(const ts_kctx *ctx, void *out, void *state, const void *q,
                                       const void *k, const void *v, const int32_t *ids,
                                       int32_t pad_id, size_t B, size_t T, size_t NH, size_t HS,
                                       ts_dtype dt);
  ts_status (*attention_bidir_backward)(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                        const void *dout, const void *out, const void *q,
                                        const void *k, const void *v, const void *state,
                                        size_t B, size_t T, size_t NH, size_t HS, ts_dtype dt);

  ts_status (*adamw)(const ts_kctx *ctx, float *master, void *param_out, ts_dtype param_dt,
                     float *m, float *v, const void *grad, ts_dtype grad_dt, size_t n,
                     const ts_adamw_hparams *hp);
} ts_k_backend;

/* The two backends (kernels/cpu/backend.c, kernels/cuda/backend.c). */
extern const ts_k_backend ts_k_cpu_backend;
extern const ts_k_backend ts_k_cuda_backend;

#ifdef __cplusplus
}
#endif

#endif /* TS_KERNELS_BACKEND_H */
