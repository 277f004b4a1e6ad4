/*
 * kernels.c — the kernels front: every public ts_k_* function validates its
 * arguments here, once, for every device, then calls the op of the
 * context's backend table (kernels/backend.h).
 *
 * Invariants: every check below runs before any backend is called, so a
 * rejected call writes nothing on any device; the empty cases kernels.h
 * defines (nothing to do, or zeros to write) are handled here, so backends
 * only see work; messages name the public op ("ts_k_add: out is NULL").
 * The checks themselves are kernels_front.h's, shared with
 * kernels_encoder.c (the BERT-class encoder ops' front).
 */
#include "kernels/kernels.h"

#include "kernels/kernels_front.h"

/* ---- devices, contexts, memory ------------------------------------------------ */

int ts_k_device_count(ts_device dev) {
  const ts_k_backend *be;
  if (backend_for(dev, "ts_k_device_count", &be) != TS_OK) return 0;
  return be->device_count();
}

ts_status ts_k_context_init(ts_kctx *ctx, ts_device dev, int index) {
  static const char op[] = "ts_k_context_init";
  const ts_k_backend *be;
  CHECK_PTR(ctx);
  TS_CHECK(backend_for(dev, op, &be));
  int n = be->device_count();
  if (index < 0 || index >= n)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: %s device %d: this process sees %d", op,
                        be->name, index, n);
  *ctx = (ts_kctx){.device = dev, .device_index = index};
  return be->context_init(ctx, index);
}

void ts_k_context_destroy(ts_kctx *ctx) {
  const ts_k_backend *be;
  if (ctx && backend_for(ctx->device, "ts_k_context_destroy", &be) == TS_OK)
    be->context_destroy(ctx);
}

ts_status ts_k_device_memory(ts_device dev, int index, size_t *free_bytes, size_t *total_bytes,
                             char *name, size_t name_len) {
  static const char op[] = "ts_k_device_memory";
  const ts_k_backend *be;
  CHECK_PTR(free_bytes);
  CHECK_PTR(total_bytes);
  TS_CHECK(backend_for(dev, op, &be));
  if (!be->memory_info)
    return ts_set_error(TS_ERR_UNSUPPORTED, "%s: the %s backend reports no memory figures", op,
                        be->name);
  int n = be->device_count();
  if (index < 0 || index >= n)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: %s device %d: this process sees %d", op,
                        be->name, index, n);
  return be->memory_info(index, free_bytes, total_bytes, name, name_len);
}

ts_status ts_k_synchronize(const ts_kctx *ctx) {
  static const char op[] = "ts_k_synchronize";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  return be->synchronize(ctx);
}

ts_status ts_k_alloc(ts_device dev, size_t nbytes, void **out) {
  static const char op[] = "ts_k_alloc";
  const ts_k_backend *be;
  CHECK_PTR(out);
  *out = NULL;
  TS_CHECK(backend_for(dev, op, &be));
  return nbytes == 0 ? TS_OK : be->alloc(nbytes, out);
}

void ts_k_free(ts_device dev, void *p) {
  const ts_k_backend *be;
  if (p && backend_for(dev, "ts_k_free", &be) == TS_OK) be->free(p);
}

/* The checks of a copy of nbytes between dst and src. */
static ts_status check_copy(const ts_kctx *ctx, void *dst, const void *src, size_t nbytes,
                            const char *op, const ts_k_backend **be) {
  TS_CHECK(backend_of(ctx, op, be));
  if (nbytes == 0) return TS_OK;
  CHECK_PTR(dst);
  CHECK_PTR(src);
  return TS_OK;
}

ts_status ts_k_copy(const ts_kctx *ctx, void *dst, const void *src, size_t nbytes) {
  static const char op[] = "ts_k_copy";
  const ts_k_backend *be;
  TS_CHECK(check_copy(ctx, dst, src, nbytes, op, &be));
  if (nbytes == 0 || dst == src) return TS_OK;
  if ((const char *)dst < (const char *)src + nbytes && (const char *)src < (char *)dst + nbytes)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: dst and src overlap", op);
  return be->copy(ctx, dst, src, nbytes);
}

ts_status ts_k_to_host(const ts_kctx *ctx, void *h_dst, const void *src, size_t nbytes) {
  static const char op[] = "ts_k_to_host";
  const ts_k_backend *be;
  TS_CHECK(check_copy(ctx, h_dst, src, nbytes, op, &be));
  return nbytes == 0 ? TS_OK : be->to_host(ctx, h_dst, src, nbytes);
}

ts_status ts_k_from_host(const ts_kctx *ctx, void *dst, const void *h_src, size_t nbytes) {
  static const char op[] = "ts_k_from_host";
  const ts_k_backend *be;
  TS_CHECK(check_copy(ctx, dst, h_src, nbytes, op, &be));
  return nbytes == 0 ? TS_OK : be->from_host(ctx, dst, h_src, nbytes);
}

ts_status ts_k_host_register(ts_device dev, void *h, size_t nbytes) {
  static const char op[] = "ts_k_host_register";
  const ts_k_backend *be;
  TS_CHECK(backend_for(dev, op, &be));
  if (nbytes == 0 || !be->host_register) return TS_OK;
  CHECK_PTR(h);
  return be->host_register(h, nbytes);
}

void ts_k_host_unregister(ts_device dev, void *h) {
  const ts_k_backend *be;
  if (h && backend_for(dev, "ts_k_host_unregister", &be) == TS_OK && be->host_unregister)
    be->host_unregister(h);
}

ts_status ts_k_from_host_async(const ts_kctx *ctx, void *dst, const void *h_src, size_t nbytes) {
  static const char op[] = "ts_k_from_host_async";
  const ts_k_backend *be;
  TS_CHECK(check_copy(ctx, dst, h_src, nbytes, op, &be));
  if (nbytes == 0) return TS_OK;
  return be->from_host_async ? be->from_host_async(ctx, dst, h_src, nbytes)
                             : be->from_host(ctx, dst, h_src, nbytes);
}

ts_status ts_k_host_wait(const ts_kctx *ctx) {
  static const char op[] = "ts_k_host_wait";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  return be->host_wait ? be->host_wait(ctx) : TS_OK;
}

/* ---- workspace queries ----------------------------------------------------------- */

size_t ts_k_linear_workspace_bytes(ts_device dev, size_t M, size_t N, size_t K, ts_dtype dt) {
  const ts_k_backend *be = query_backend(dev);
  return be->linear_workspace_bytes ? be->linear_workspace_bytes(M, N, K, dt) : 0;
}

size_t ts_k_rmsnorm_workspace_bytes(ts_device dev, size_t N, size_t C, ts_dtype dt) {
  const ts_k_backend *be = query_backend(dev);
  return be->rmsnorm_workspace_bytes ? be->rmsnorm_workspace_bytes(N, C, dt) : 0;
}

size_t ts_k_embedding_workspace_bytes(ts_device dev, size_t N, ts_dtype dt) {
  const ts_k_backend *be = query_backend(dev);
  return be->embedding_workspace_bytes ? be->embedding_workspace_bytes(N, dt) : 0;
}

size_t ts_k_attention_workspace_bytes(ts_device dev, size_t B, size_t T, size_t NH, size_t NKV,
                                      size_t HS, ts_dtype dt) {
  const ts_k_backend *be = query_backend(dev);
  return be->attention_workspace_bytes ? be->attention_workspace_bytes(B, T, NH, NKV, HS, dt) : 0;
}

/* ---- casts and vector ops ---------------------------------------------------------- */

ts_status ts_k_cast(const ts_kctx *ctx, void *out, ts_dtype out_dt, const void *in, ts_dtype in_dt,
                    size_t n) {
  static const char op[] = "ts_k_cast";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(out_dt, op));
  TS_CHECK(check_dtype(in_dt, op));
  if (n == 0) return TS_OK;
  CHECK_PTR(out);
  CHECK_PTR(in);
  if (out == in && ts_dtype_size(out_dt) != ts_dtype_size(in_dt))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: in == out needs dtypes of equal size, got %s -> %s", op,
                        ts_dtype_name(in_dt), ts_dtype_name(out_dt));
  return CALL(be, cast, ctx, out, out_dt, in, in_dt, n);
}

ts_status ts_k_zero(const ts_kctx *ctx, void *x, size_t nbytes) {
  static const char op[] = "ts_k_zero";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  if (nbytes == 0) return TS_OK;
  CHECK_PTR(x);
  return CALL(be, zero, ctx, x, nbytes);
}

ts_status ts_k_add(const ts_kctx *ctx, void *out, const void *a, const void *b, size_t n,
                   ts_dtype dt) {
  static const char op[] = "ts_k_add";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  if (n == 0) return TS_OK;
  CHECK_PTR(out);
  CHECK_PTR(a);
  CHECK_PTR(b);
  return CALL(be, add, ctx, out, a, b, n, dt);
}

ts_status ts_k_sumsq(const ts_kctx *ctx, double *out, const void *x, size_t n, ts_dtype dt) {
  static const char op[] = "ts_k_sumsq";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  CHECK_PTR(out);
  if (n > 0) CHECK_PTR(x);
  return CALL(be, sumsq, ctx, out, x, n, dt);
}

ts_status ts_k_nonfinite(const ts_kctx *ctx, int32_t *flag, const void *x, size_t n, ts_dtype dt) {
  static const char op[] = "ts_k_nonfinite";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  CHECK_PTR(flag);
  if (n > 0) CHECK_PTR(x);
  return CALL(be, nonfinite, ctx, flag, x, n, dt);
}

/* ---- linear ------------------------------------------------------------------------ */

ts_status ts_k_linear_forward(const ts_kctx *ctx, void *out, const void *inp, const void *weight,
                              size_t M, size_t N, size_t K, ts_dtype dt) {
  static const char op[] = "ts_k_linear_forward";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  if (M == 0 || N == 0) return TS_OK;
  CHECK_PTR(out);
  if (K == 0) return ts_k_zero(ctx, out, M * N * ts_dtype_size(dt)); /* empty sums */
  CHECK_PTR(inp);
  CHECK_PTR(weight);
  TS_CHECK(check_workspace(ctx, ts_k_linear_workspace_bytes(ctx->device, M, N, K, dt), op));
  return CALL(be, linear_forward, ctx, out, inp, weight, M, N, K, dt);
}

ts_status ts_k_linear_backward(const ts_kctx *ctx, void *dinp, void *dweight, const void *dout,
                               const void *inp, const void *weight, size_t M, size_t N, size_t K,
                               ts_dtype dt) {
  static const char op[] = "ts_k_linear_backward";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  if (M == 0 || K == 0) return TS_OK; /* dinp and dweight are empty */
  if (N == 0)                         /* dinp = 0; dweight is empty */
    return dinp ? ts_k_zero(ctx, dinp, M * K * ts_dtype_size(dt)) : TS_OK;
  if (dinp == NULL && dweight == NULL) return TS_OK;
  CHECK_PTR(dout);
  if (dinp) CHECK_PTR(weight);
  if (dweight) CHECK_PTR(inp);
  TS_CHECK(check_workspace(ctx, ts_k_linear_workspace_bytes(ctx->device, M, N, K, dt), op));
  return CALL(be, linear_backward, ctx, dinp, dweight, dout, inp, weight, M, N, K, dt);
}

/* ---- embedding ------------------------------------------------------------------------ */

ts_status ts_k_embedding_forward(const ts_kctx *ctx, void *out, const int32_t *tokens,
                                 const void *wte, size_t N, size_t C, size_t V, ts_dtype dt) {
  static const char op[] = "ts_k_embedding_forward";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  if (N == 0) return TS_OK;
  CHECK_PTR(tokens);
  if (C > 0) {
    CHECK_PTR(out);
    CHECK_PTR(wte);
  }
  return CALL(be, embedding_forward, ctx, out, tokens, wte, N, C, V, dt);
}

ts_status ts_k_embedding_backward(const ts_kctx *ctx, void *dwte, const void *dout,
                                  const int32_t *tokens, size_t N, size_t C, size_t V,
                                  ts_dtype dt) {
  static const char op[] = "ts_k_embedding_backward";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  if (N == 0) return TS_OK;
  CHECK_PTR(tokens);
  TS_CHECK(check_workspace(ctx, ts_k_embedding_workspace_bytes(ctx->device, N, dt), op));
  if (C > 0) {
    CHECK_PTR(dwte);
    CHECK_PTR(dout);
  }
  return CALL(be, embedding_backward, ctx, dwte, dout, tokens, N, C, V, dt);
}

/* ---- RMSNorm ------------------------------------------------------------------------------ */

ts_status ts_k_rmsnorm_forward(const ts_kctx *ctx, void *out, float *rstd, const void *inp,
                               const void *weight, size_t N, size_t C, float eps, ts_dtype dt) {
  static const char op[] = "ts_k_rmsnorm_forward";
  const ts_k_backend *be;
  int work;
  TS_CHECK(check_norm_forward(ctx, N, C, dt, op, &be, &work));
  if (!work) return TS_OK;
  CHECK_PTR(out);
  CHECK_PTR(rstd);
  CHECK_PTR(inp);
  CHECK_PTR(weight);
  if (out == inp)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: out aliases inp (not allowed)", op);
  return CALL(be, rmsnorm_forward, ctx, out, rstd, inp, weight, N, C, eps, dt);
}

ts_status ts_k_rmsnorm_backward(const ts_kctx *ctx, void *dinp, void *dweight, const void *dout,
                                const void *inp, const void *weight, const float *rstd, size_t N,
                                size_t C, ts_dtype dt) {
  static const char op[] = "ts_k_rmsnorm_backward";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  if (N == 0 || C == 0) return TS_OK;
  CHECK_PTR(dout);
  CHECK_PTR(inp);
  CHECK_PTR(rstd);
  if (dinp) CHECK_PTR(weight);
  TS_CHECK(check_workspace(ctx, ts_k_rmsnorm_workspace_bytes(ctx->device, N, C, dt), op));
  return CALL(be, rmsnorm_backward, ctx, dinp, dweight, dout, inp, weight, rstd, N, C, dt);
}

/* ---- RoPE --------------------------------------------------------------------------------- */

/* The checks both RoPE directions share; *work is 0 when there is nothing
 * to rotate. */
static ts_status check_rope(const ts_kctx *ctx, void *out, const void *x, size_t B, size_t T,
                            size_t H, size_t HS, float theta, ts_dtype dt, const char *op,
                            const ts_k_backend **be, int *work) {
  *work = 0;
  TS_CHECK(backend_of(ctx, op, be));
  TS_CHECK(check_dtype(dt, op));
  if (HS % 2 != 0 || HS > TS_K_ROPE_MAX_HS)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: HS = %zu: expected even and <= %d", op, HS,
                        TS_K_ROPE_MAX_HS);
  if (!(theta > 0.0f))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: theta = %g: expected > 0", op, (double)theta);
  if (B == 0 || T == 0 || H == 0 || HS == 0) return TS_OK;
  TS_CHECK(check_ptr(out, "out", op));
  TS_CHECK(check_ptr(x, "x", op));
  *work = 1;
  return TS_OK;
}

ts_status ts_k_rope_forward(const ts_kctx *ctx, void *out, const void *x, size_t B, size_t T,
                            size_t H, size_t HS, float theta, ts_dtype dt) {
  static const char op[] = "ts_k_rope_forward";
  const ts_k_backend *be;
  int work;
  TS_CHECK(check_rope(ctx, out, x, B, T, H, HS, theta, dt, op, &be, &work));
  return work ? CALL(be, rope_forward, ctx, out, x, B, T, H, HS, theta, dt) : TS_OK;
}

ts_status ts_k_rope_backward(const ts_kctx *ctx, void *dx, const void *dout, size_t B, size_t T,
                             size_t H, size_t HS, float theta, ts_dtype dt) {
  static const char op[] = "ts_k_rope_backward";
  const ts_k_backend *be;
  int work;
  TS_CHECK(check_rope(ctx, dx, dout, B, T, H, HS, theta, dt, op, &be, &work));
  return work ? CALL(be, rope_backward, ctx, dx, dout, B, T, H, HS, theta, dt) : TS_OK;
}

/* ---- attention ---------------------------------------------------------------------------- */

size_t ts_k_attention_state_bytes(ts_device dev, size_t B, size_t T, size_t NH, size_t NKV,
                                  size_t HS, ts_dtype dt) {
  const ts_k_backend *be = query_backend(dev);
  if (be->attention_state_bytes) return be->attention_state_bytes(B, T, NH, NKV, HS, dt);
  return B * NH * T * T * ts_dtype_size(dt);
}

ts_status ts_k_attention_probs_dtype(const ts_kctx *ctx, ts_dtype dt, int bidirectional,
                                     ts_dtype *out) {
  static const char op[] = "ts_k_attention_probs_dtype";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  CHECK_PTR(out);
  *out = be->attention_probs_dtype ? be->attention_probs_dtype(ctx, dt, bidirectional) : TS_FP32;
  return TS_OK;
}

ts_status ts_k_attention_forward(const ts_kctx *ctx, void *out, void *state, const void *q,
                                 const void *k, const void *v, size_t B, size_t T, size_t NH,
                                 size_t NKV, size_t HS, ts_dtype dt) {
  static const char op[] = "ts_k_attention_forward";
  const ts_k_backend *be;
  int work;
  TS_CHECK(check_attention_forward(ctx, out, state, q, k, v, B, T, NH, NKV, HS, dt, op, &be,
                                   &work));
  return work ? CALL(be, attention_forward, ctx, out, state, q, k, v, B, T, NH, NKV, HS, dt)
              : TS_OK;
}

ts_status ts_k_attention_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                  const void *dout, const void *out, const void *q, const void *k,
                                  const void *v, const void *state, size_t B, size_t T, size_t NH,
                                  size_t NKV, size_t HS, ts_dtype dt) {
  static const char op[] = "ts_k_attention_backward";
  const ts_k_backend *be;
  int work;
  TS_CHECK(check_attention_backward(ctx, dq, dk, dv, dout, out, q, k, v, state, B, T, NH, NKV, HS,
                                    dt, op, &be, &work));
  return work ? CALL(be, attention_backward, ctx, dq, dk, dv, dout, out, q, k, v, state, B, T, NH,
                     NKV, HS, dt)
              : TS_OK;
}

/* ---- SwiGLU --------------------------------------------------------------------------------- */

ts_status ts_k_swiglu_forward(const ts_kctx *ctx, void *h, const void *gate, const void *up,
                              size_t n, ts_dtype dt) {
  static const char op[] = "ts_k_swiglu_forward";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  if (n == 0) return TS_OK;
  CHECK_PTR(h);
  CHECK_PTR(gate);
  CHECK_PTR(up);
  if (h == gate || h == up)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: h aliases gate or up (not allowed)", op);
  return CALL(be, swiglu_forward, ctx, h, gate, up, n, dt);
}

ts_status ts_k_swiglu_backward(const ts_kctx *ctx, void *dgate, void *dup, const void *dh,
                               const void *gate, const void *up, size_t n, ts_dtype dt) {
  static const char op[] = "ts_k_swiglu_backward";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  if (n == 0) return TS_OK;
  CHECK_PTR(dgate);
  CHECK_PTR(dup);
  CHECK_PTR(dh);
  CHECK_PTR(gate);
  CHECK_PTR(up);
  return CALL(be, swiglu_backward, ctx, dgate, dup, dh, gate, up, n, dt);
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

ts_status ts_k_cross_entropy_forward(const ts_kctx *ctx, float *loss_rows, const void *logits,
                                     const int32_t *targets, size_t N, size_t V, ts_dtype dt) {
  static const char op[] = "ts_k_cross_entropy_forward";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  if (N == 0) return TS_OK;
  CHECK_PTR(targets);
  CHECK_PTR(loss_rows);
  CHECK_PTR(logits);
  return CALL(be, cross_entropy_forward, ctx, loss_rows, logits, targets, N, V, dt);
}

ts_status ts_k_loss_sum(const ts_kctx *ctx, double *out, const float *loss_rows,
                        const int32_t *targets, size_t N) {
  static const char op[] = "ts_k_loss_sum";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  CHECK_PTR(out);
  if (N > 0) {
    CHECK_PTR(loss_rows);
    CHECK_PTR(targets);
  }
  return CALL(be, loss_sum, ctx, out, loss_rows, targets, N);
}

ts_status ts_k_cross_entropy_backward(const ts_kctx *ctx, void *dlogits, const void *logits,
                                      const int32_t *targets, size_t N, size_t V, float dloss,
                                      ts_dtype dt) {
  static const char op[] = "ts_k_cross_entropy_backward";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  if (N == 0 || V == 0) return TS_OK;
  CHECK_PTR(targets);
  CHECK_PTR(dlogits);
  CHECK_PTR(logits);
  return CALL(be, cross_entropy_backward, ctx, dlogits, logits, targets, N, V, dloss, dt);
}

ts_status ts_k_cross_entropy_fused(const ts_kctx *ctx, float *loss_rows, void *dlogits,
                                   const void *logits, const int32_t *targets, size_t N, size_t V,
                                   float dloss, ts_dtype dt) {
  static const char op[] = "ts_k_cross_entropy_fused";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  if (N == 0) return TS_OK;
  CHECK_PTR(targets);
  CHECK_PTR(loss_rows);
  CHECK_PTR(dlogits);
  CHECK_PTR(logits);
  return CALL(be, cross_entropy_fused, ctx, loss_rows, dlogits, logits, targets, N, V, dloss, dt);
}

/* ---- AdamW ---------------------------------------------------------------------------------- */

ts_status ts_k_adamw(const ts_kctx *ctx, float *master, void *param_out, ts_dtype param_dt,
                     float *m, float *v, const void *grad, ts_dtype grad_dt, size_t n,
                     const ts_adamw_hparams *hp) {
  static const char op[] = "ts_k_adamw";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  CHECK_PTR(hp);
  TS_CHECK(check_dtype(param_dt, op));
  TS_CHECK(check_dtype(grad_dt, op));
  if (hp->step < 1)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: hp->step = %d: expected >= 1 (1-based)", op,
                        hp->step);
  if (!(hp->beta1 >= 0.0f && hp->beta1 < 1.0f) || !(hp->beta2 >= 0.0f && hp->beta2 < 1.0f))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: hp->beta1 = %g, hp->beta2 = %g: expected each in [0, 1)", op,
                        (double)hp->beta1, (double)hp->beta2);
  if (n == 0) return TS_OK;
  CHECK_PTR(master);
  CHECK_PTR(m);
  CHECK_PTR(v);
  CHECK_PTR(grad);
  if (param_out == (void *)master && param_dt != TS_FP32)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: param_out aliases master but param_dt is %s (needs fp32)", op,
                        ts_dtype_name(param_dt));
  return CALL(be, adamw, ctx, master, param_out, param_dt, m, v, grad, grad_dt, n, hp);
}
