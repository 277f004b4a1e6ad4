/*
 * kernels_front.h — private to the kernels front (kernels.c and
 * kernels_encoder.c): the backend table of each device and the argument
 * checks every public ts_k_* op goes through before it calls its backend
 * (kernels/backend.h). One definition of each check, so every op reports
 * the same fault with the same status and message form ("ts_k_add: out is
 * NULL"). Not part of the API: callers include kernels/kernels.h.
 */
#ifndef TS_KERNELS_KERNELS_FRONT_H
#define TS_KERNELS_KERNELS_FRONT_H

#include "kernels/backend.h"
#include "kernels/kernels.h"

/* The backends, indexed by ts_device. */
static const ts_k_backend *const BACKENDS[TS_DEVICE_COUNT] = {
    [TS_DEVICE_CPU] = &ts_k_cpu_backend,
    [TS_DEVICE_CUDA] = &ts_k_cuda_backend,
};

/* ---- checks ---------------------------------------------------------------- */

/* *be = the backend of device dev, or TS_ERR_INVALID_ARGUMENT. */
static inline ts_status backend_for(ts_device dev, const char *op, const ts_k_backend **be) {
  *be = &ts_k_cpu_backend; /* never used on error; keeps every path initialised */
  if ((unsigned)dev >= TS_DEVICE_COUNT)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: ctx->device = %d is not a device", op,
                        (int)dev);
  *be = BACKENDS[dev];
  return TS_OK;
}

/* *be = the backend of ctx's device; a NULL ctx is TS_ERR_INVALID_ARGUMENT. */
static inline ts_status backend_of(const ts_kctx *ctx, const char *op, const ts_k_backend **be) {
  *be = &ts_k_cpu_backend; /* never used on error; keeps every path initialised */
  if (ctx == NULL) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", op);
  return backend_for(ctx->device, op, be);
}

/* TS_ERR_UNSUPPORTED: backend be has no body for op. */
static inline ts_status unsupported(const ts_k_backend *be, const char *op) {
  return ts_set_error(TS_ERR_UNSUPPORTED, "%s: op has no %s implementation yet", op,
                      be->device == TS_DEVICE_CUDA ? "CUDA" : be->name);
}

/* Calls op `fn` of backend be with the remaining arguments, or reports that
 * be has none. Needs `op` (the public name) in scope. */
#define CALL(be, fn, ...) ((be)->fn ? (be)->fn(__VA_ARGS__) : unsupported((be), op))

/* TS_ERR_INVALID_ARGUMENT unless dt is fp32, bf16 or fp16. */
static inline ts_status check_dtype(ts_dtype dt, const char *op) {
  if (dt == TS_FP32 || dt == TS_BF16 || dt == TS_FP16) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: dtype %d: expected TS_FP32, TS_BF16 or TS_FP16",
                      op, (int)dt);
}

/* TS_ERR_INVALID_ARGUMENT naming pointer `what` if p is NULL. */
static inline ts_status check_ptr(const void *p, const char *what, const char *op) {
  if (p != NULL) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, what);
}

/* Checks the named pointer arguments of the op calling it. */
#define CHECK_PTR(p) TS_CHECK(check_ptr((p), #p, op))

/* TS_ERR_OUT_OF_MEMORY, naming both sizes, if ctx's workspace holds fewer
 * than `need` bytes (or is NULL while need > 0). */
static inline ts_status check_workspace(const ts_kctx *ctx, size_t need, const char *op) {
  if (need == 0) return TS_OK;
  if (ctx->workspace == NULL || ctx->workspace_bytes < need)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY,
                        "%s: workspace has %zu bytes, needs %zu (see the op's "
                        "*_workspace_bytes query)",
                        op, ctx->workspace == NULL ? (size_t)0 : ctx->workspace_bytes, need);
  return TS_OK;
}

/* The backend of dev for a size query (a programmer error otherwise). */
static inline const ts_k_backend *query_backend(ts_device dev) {
  TS_ASSERT((unsigned)dev < TS_DEVICE_COUNT);
  return BACKENDS[dev];
}

/* The checks both normalisation forwards share (RMSNorm: kernels.c;
 * LayerNorm: kernels_encoder.c), pointers aside: a row needs a channel;
 * *work is 0 when there are no rows. */
static inline ts_status check_norm_forward(const ts_kctx *ctx, size_t N, size_t C, ts_dtype dt,
                                           const char *op, const ts_k_backend **be, int *work) {
  *work = 0;
  TS_CHECK(backend_of(ctx, op, be));
  TS_CHECK(check_dtype(dt, op));
  if (N == 0) return TS_OK;
  if (C == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: C = 0: expected at least 1 channel", op);
  *work = 1;
  return TS_OK;
}

/* The shape checks every attention pass shares (causal: kernels.c;
 * bidirectional, NKV = NH: kernels_encoder.c); *work is 0 when the batch
 * is empty. */
static inline ts_status check_attention(const ts_kctx *ctx, size_t B, size_t T, size_t NH,
                                        size_t NKV, size_t HS, ts_dtype dt, const char *op,
                                        const ts_k_backend **be, int *work) {
  *work = 0;
  TS_CHECK(backend_of(ctx, op, be));
  TS_CHECK(check_dtype(dt, op));
  if (NKV == 0 || NH % NKV != 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: NH = %zu, NKV = %zu: expected NKV >= 1 dividing NH", op, NH, NKV);
  if (B == 0 || T == 0 || NH == 0) return TS_OK;
  if (HS == 0) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: HS = 0: expected >= 1", op);
  *work = 1;
  return TS_OK;
}

/* check_attention, then the pointers and the workspace of an attention
 * forward (causal, or bidirectional with NKV = NH). */
static inline ts_status check_attention_forward(const ts_kctx *ctx, const void *out,
                                                const void *state, const void *q, const void *k,
                                                const void *v, size_t B, size_t T, size_t NH,
                                                size_t NKV, size_t HS, ts_dtype dt,
                                                const char *op, const ts_k_backend **be,
                                                int *work) {
  TS_CHECK(check_attention(ctx, B, T, NH, NKV, HS, dt, op, be, work));
  if (!*work) return TS_OK;
  CHECK_PTR(out);
  CHECK_PTR(state);
  CHECK_PTR(q);
  CHECK_PTR(k);
  CHECK_PTR(v);
  return check_workspace(ctx, ts_k_attention_workspace_bytes(ctx->device, B, T, NH, NKV, HS, dt),
                         op);
}

/* check_attention, then the pointers and the workspace of an attention
 * backward (causal, or bidirectional with NKV = NH). */
static inline ts_status check_attention_backward(const ts_kctx *ctx, const void *dq,
                                                 const void *dk, const void *dv,
                                                 const void *dout, const void *out,
                                                 const void *q, const void *k, const void *v,
                                                 const void *state, size_t B, size_t T,
                                                 size_t NH, size_t NKV, size_t HS, ts_dtype dt,
                                                 const char *op, const ts_k_backend **be,
                                                 int *work) {
  TS_CHECK(check_attention(ctx, B, T, NH, NKV, HS, dt, op, be, work));
  if (!*work) return TS_OK;
  CHECK_PTR(dq);
  CHECK_PTR(dk);
  CHECK_PTR(dv);
  CHECK_PTR(dout);
  CHECK_PTR(out);
  CHECK_PTR(q);
  CHECK_PTR(k);
  CHECK_PTR(v);
  CHECK_PTR(state);
  return check_workspace(ctx, ts_k_attention_workspace_bytes(ctx->device, B, T, NH, NKV, HS, dt),
                         op);
}

#endif /* TS_KERNELS_KERNELS_FRONT_H */
