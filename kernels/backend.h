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
 * Signatures are those of the public ts_k_* functions of the same name;
 * the ops' are written once, in kernels/ops.h, which makes their entries
 * here. Adding a device backend means filling one more table and listing
 * it in kernels_front.h's backend array; adding an op means one more line
 * in ops.h, its checks in the front (kernels.c, or kernels_encoder.c for
 * the BERT-class encoder ops), and a body in every backend.
 */
#ifndef TS_KERNELS_BACKEND_H
#define TS_KERNELS_BACKEND_H

#include "kernels/kernels.h"
#include "kernels/ops.h"

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
  size_t (*linear_bias_workspace_bytes)(size_t M, size_t N, size_t K, ts_dtype dt);
  size_t (*embedding_workspace_bytes)(size_t N, ts_dtype dt);
  size_t (*rmsnorm_workspace_bytes)(size_t N, size_t C, ts_dtype dt);
  size_t (*attention_workspace_bytes)(size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                      ts_dtype dt);
  size_t (*layernorm_workspace_bytes)(size_t N, size_t C, ts_dtype dt);
  size_t (*bias_workspace_bytes)(size_t N, size_t C, ts_dtype dt);
  size_t (*fp8_quantize_workspace_bytes)(size_t R, size_t C);
  size_t (*linear_fp8_workspace_bytes)(size_t M, size_t N, size_t K, ts_fp8_scaling scaling);
  /* NULL: P @ v takes P in fp32 on this device (ts_k_attention_probs_dtype) */
  ts_dtype (*attention_probs_dtype)(const ts_kctx *ctx, ts_dtype dt, int bidirectional);
  /* NULL: the probabilities, B * NH * T * T elements of dt */
  size_t (*attention_state_bytes)(size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                  ts_dtype dt);

  /* the ops of kernels/ops.h: ts_status (*NAME)(parameters), what each
   * receives beyond the front's checks noted there */
#define TS_K_BACKEND_FIELD(name, params) ts_status(*name) params;
  TS_K_OPS(TS_K_BACKEND_FIELD)
#undef TS_K_BACKEND_FIELD
} ts_k_backend;

/* The two backends (kernels/cpu/backend.c, kernels/cuda/backend.c). */
extern const ts_k_backend ts_k_cpu_backend;
extern const ts_k_backend ts_k_cuda_backend;

#ifdef __cplusplus
}
#endif

#endif /* TS_KERNELS_BACKEND_H */
