/*
 * kernels_encoder.c — the kernels front of the BERT-class encoder ops
 * (kernels/kernels.h, "BERT-class encoder ops"): LayerNorm, GELU, bias,
 * token types and bidirectional attention. Each public function validates
 * its arguments here, once, with kernels_front.h's checks (the ones
 * kernels.c's ops use), then calls the op of the context's backend table.
 *
 * Invariants (those of kernels.c): every check runs before any backend is
 * called, so a rejected call writes nothing; the empty cases are handled
 * here; messages name the public op.
 */
#include <stdint.h>

#include "kernels/kernels.h"
#include "kernels/kernels_front.h"

/* TS_ERR_INVALID_ARGUMENT naming both if output `out` is input `in`. */
static ts_status check_no_alias(const void *out, const void *in, const char *out_name,
                                const char *in_name, const char *op) {
  if (out == NULL || out != in) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: %s aliases %s (not allowed)", op, out_name,
                      in_name);
}

/* Checks that output a is not the pointer b, naming both. */
#define CHECK_NO_ALIAS(a, b) TS_CHECK(check_no_alias((a), (b), #a, #b, op))

/* ---- workspace queries ---------------------------------------------------------- */

size_t ts_k_layernorm_workspace_bytes(ts_device dev, size_t N, size_t C, ts_dtype dt) {
  const ts_k_backend *be = query_backend(dev);
  return be->layernorm_workspace_bytes ? be->layernorm_workspace_bytes(N, C, dt) : 0;
}

size_t ts_k_bias_workspace_bytes(ts_device dev, size_t N, size_t C, ts_dtype dt) {
  const ts_k_backend *be = query_backend(dev);
  return be->bias_workspace_bytes ? be->bias_workspace_bytes(N, C, dt) : 0;
}

/* ---- LayerNorm -------------------------------------------------------------------- */

ts_status ts_k_layernorm_forward(const ts_kctx *ctx, void *out, float *mean, float *rstd,
                                 const void *inp, const void *weight, const void *bias, size_t N,
                                 size_t C, float eps, ts_dtype dt) {
  static const char op[] = "ts_k_layernorm_forward";
  const ts_k_backend *be;
  int work;
  TS_CHECK(check_norm_forward(ctx, N, C, dt, op, &be, &work));
  if (!work) return TS_OK;
  CHECK_PTR(out);
  CHECK_PTR(mean);
  CHECK_PTR(rstd);
  CHECK_PTR(inp);
  CHECK_PTR(weight);
  CHECK_PTR(bias);
  CHECK_NO_ALIAS(out, inp);
  return CALL(be, layernorm_forward, ctx, out, mean, rstd, inp, weight, bias, N, C, eps, dt);
}

ts_status ts_k_layernorm_backward(const ts_kctx *ctx, void *dinp, void *dweight, void *dbias,
                                  const void *dout, const void *inp, const void *weight,
                                  const float *mean, const float *rstd, size_t N, size_t C,
                                  ts_dtype dt) {
  static const char op[] = "ts_k_layernorm_backward";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  if (N == 0 || C == 0) return TS_OK;
  if (dinp == NULL && dweight == NULL && dbias == NULL) return TS_OK;
  CHECK_PTR(dout);
  if (dinp || dweight) {
    CHECK_PTR(inp);
    CHECK_PTR(mean);
    CHECK_PTR(rstd);
  }
  if (dinp) CHECK_PTR(weight);
  CHECK_NO_ALIAS(dinp, dout);
  CHECK_NO_ALIAS(dinp, inp);
  CHECK_NO_ALIAS(dweight, dbias);
  TS_CHECK(check_workspace(ctx, ts_k_layernorm_workspace_bytes(ctx->device, N, C, dt), op));
  return CALL(be, layernorm_backward, ctx, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N,
              C, dt);
}

/* ---- GELU --------------------------------------------------------------------------- */

/* The checks both GELU directions share, pointers aside; *work is 0 when
 * n == 0. */
static ts_status check_gelu(const ts_kctx *ctx, size_t n, ts_gelu_kind kind, ts_dtype dt,
                            const char *op, const ts_k_backend **be, int *work) {
  *work = 0;
  TS_CHECK(backend_of(ctx, op, be));
  TS_CHECK(check_dtype(dt, op));
  if (kind != TS_GELU_ERF && kind != TS_GELU_TANH)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: kind = %d: expected TS_GELU_ERF (0) or TS_GELU_TANH (1)", op,
                        (int)kind);
  *work = n > 0;
  return TS_OK;
}

ts_status ts_k_gelu_forward(const ts_kctx *ctx, void *out, const void *inp, size_t n,
                            ts_gelu_kind kind, ts_dtype dt) {
  static const char op[] = "ts_k_gelu_forward";
  const ts_k_backend *be;
  int work;
  TS_CHECK(check_gelu(ctx, n, kind, dt, op, &be, &work));
  if (!work) return TS_OK;
  CHECK_PTR(out);
  CHECK_PTR(inp);
  return CALL(be, gelu_forward, ctx, out, inp, n, kind, dt);
}

ts_status ts_k_gelu_backward(const ts_kctx *ctx, void *dinp, const void *dout, const void *inp,
                             size_t n, ts_gelu_kind kind, ts_dtype dt) {
  static const char op[] = "ts_k_gelu_backward";
  const ts_k_backend *be;
  int work;
  TS_CHECK(check_gelu(ctx, n, kind, dt, op, &be, &work));
  if (!work) return TS_OK;
  CHECK_PTR(dinp);
  CHECK_PTR(dout);
  CHECK_PTR(inp);
  return CALL(be, gelu_backward, ctx, dinp, dout, inp, n, kind, dt);
}

/* ---- bias ------------------------------------------------------------------------------ */

ts_status ts_k_bias_add(const ts_kctx *ctx, void *out, const void *bias, size_t N, size_t C,
                        ts_dtype dt) {
  static const char op[] = "ts_k_bias_add";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  if (N == 0 || C == 0) return TS_OK;
  CHECK_PTR(out);
  CHECK_PTR(bias);
  CHECK_NO_ALIAS(out, bias);
  return CALL(be, bias_add, ctx, out, bias, N, C, dt);
}

ts_status ts_k_bias_backward(const ts_kctx *ctx, void *dbias, const void *dout, size_t N,
                             size_t C, ts_dtype dt) {
  static const char op[] = "ts_k_bias_backward";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  TS_CHECK(check_dtype(dt, op));
  if (N == 0 || C == 0) return TS_OK; /* dbias += an empty sum */
  CHECK_PTR(dbias);
  CHECK_PTR(dout);
  CHECK_NO_ALIAS(dbias, dout);
  TS_CHECK(check_workspace(ctx, ts_k_bias_workspace_bytes(ctx->device, N, C, dt), op));
  return CALL(be, bias_backward, ctx, dbias, dout, N, C, dt);
}

/* ---- token types ----------------------------------------------------------------------- */

ts_status ts_k_token_types(const ts_kctx *ctx, int32_t *types, const int32_t *tokens, size_t B,
                           size_t T, int32_t sep_id, size_t n_types) {
  static const char op[] = "ts_k_token_types";
  const ts_k_backend *be;
  TS_CHECK(backend_of(ctx, op, &be));
  if (n_types == 0 || n_types > INT32_MAX)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: n_types = %zu: expected 1 .. %d", op,
                        n_types, INT32_MAX);
  if (B == 0 || T == 0) return TS_OK;
  CHECK_PTR(types);
  CHECK_PTR(tokens);
  CHECK_NO_ALIAS(types, tokens);
  return CALL(be, token_types, ctx, types, tokens, B, T, sep_id, n_types);
}

/* ---- bidirectional attention ------------------------------------------------------------ */

ts_status ts_k_attention_bidir_forward(const ts_kctx *ctx, void *out, void *state, const void *q,
                                       const void *k, const void *v, const int32_t *ids,
                                       int32_t pad_id, size_t B, size_t T, size_t NH, size_t HS,
                                       ts_dtype dt) {
  static const char op[] = "ts_k_attention_bidir_forward";
  const ts_k_backend *be;
  int work;
  TS_CHECK(check_attention_forward(ctx, out, state, q, k, v, B, T, NH, NH, HS, dt, op, &be,
                                   &work));
  if (!work) return TS_OK;
  if (pad_id >= 0) CHECK_PTR(ids);
  CHECK_NO_ALIAS(out, q);
  CHECK_NO_ALIAS(out, k);
  CHECK_NO_ALIAS(out, v);
  return CALL(be, attention_bidir_forward, ctx, out, state, q, k, v, pad_id >= 0 ? ids : NULL,
              pad_id, B, T, NH, HS, dt);
}

ts_status ts_k_attention_bidir_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                        const void *dout, const void *out, const void *q,
                                        const void *k, const void *v, const void *state,
                                        size_t B, size_t T, size_t NH, size_t HS, ts_dtype dt) {
  static const char op[] = "ts_k_attention_bidir_backward";
  const ts_k_backend *be;
  int work;
  TS_CHECK(check_attention_backward(ctx, dq, dk, dv, dout, out, q, k, v, state, B, T, NH, NH, HS,
                                    dt, op, &be, &work));
  if (!work) return TS_OK;
  /* dq, dk, dv: distinct, and none of them an input */
  void *const outs[3] = {dq, dk, dv};
  const void *const ins[9] = {dq, dk, dv, dout, out, q, k, v, state};
  static const char *const names[9] = {"dq", "dk", "dv", "dout", "out", "q", "k", "v", "state"};
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 9; j++)
      if (i != j) TS_CHECK(check_no_alias(outs[i], ins[j], names[i], names[j], op));
  return CALL(be, attention_bidir_backward, ctx, dq, dk, dv, dout, out, q, k, v, state, B, T, NH,
              HS, dt);
}
