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

static const k_op OP_LAYERNORM_FORWARD = {
    "ts_k_layernorm_forward", 1, 6, {"out", "mean", "rstd", "inp", "weight", "bias"}};
static const k_op OP_LAYERNORM_BACKWARD = {"ts_k_layernorm_backward",
                                           1,
                                           5,
                                           {"dout", "inp", "mean", "rstd", "weight"},
                                           3,
                                           {"dinp", "dweight", "dbias"}};
static const k_op OP_ADD_LAYERNORM_FORWARD = {
    "ts_k_add_layernorm_forward",
    1,
    8,
    {"out", "mean", "rstd", "res", "a", "b", "weight", "bias"}};

ts_status ts_k_layernorm_forward(const ts_kctx *ctx, void *out, float *mean, float *rstd,
                                 const void *inp, const void *weight, const void *bias, size_t N,
                                 size_t C, float eps, ts_dtype dt) {
  const char *op = OP_LAYERNORM_FORWARD.name;
  k_call c = {ctx,
              {dt},
              .invalid = N ? k_norm_channels(C, op) : TS_OK,
              .empty = N == 0,
              .ptrs = {out, mean, rstd, inp, weight, bias},
              .conflict = k_no_alias(out, inp, "out", "inp", op)};
  K_RUN(OP_LAYERNORM_FORWARD, c, layernorm_forward, ctx, out, mean, rstd, inp, weight, bias, N, C,
        eps, dt);
}

ts_status ts_k_add_layernorm_forward(const ts_kctx *ctx, void *out, float *mean, float *rstd,
                                     void *res, const void *a, const void *b, const void *weight,
                                     const void *bias, size_t N, size_t C, float eps, ts_dtype dt) {
  const char *op = OP_ADD_LAYERNORM_FORWARD.name;
  k_call c = {ctx,
              {dt},
              .invalid = N ? k_norm_channels(C, op) : TS_OK,
              .empty = N == 0,
              .ptrs = {out, mean, rstd, res, a, b, weight, bias},
              .conflict = k_add_norm_alias(out, res, a, b, op)};
  K_RUN(OP_ADD_LAYERNORM_FORWARD, c, add_layernorm_forward, ctx, out, mean, rstd, res, a, b,
        weight, bias, N, C, eps, dt);
}

/* dinp, dweight, dbias: NULL skips (all three NULL: nothing to do). */
ts_status ts_k_layernorm_backward(const ts_kctx *ctx, void *dinp, void *dweight, void *dbias,
                                  const void *dout, const void *inp, const void *weight,
                                  const float *mean, const float *rstd, size_t N, size_t C,
                                  ts_dtype dt) {
  const char *op = OP_LAYERNORM_BACKWARD.name;
  if (ctx && ctx->wgrad && (dweight || dbias) && N && C) { /* W: deferred (ts_k_wgrad) */
    TS_CHECK(ts_k_wgrad_record(ctx, 2, dt, dweight, dbias, dout, inp, mean, rstd, N, C, 0));
    dweight = dbias = NULL;
    if (!dinp) return TS_OK;
  }
  int stats = dinp || dweight; /* what needs the forward's input and statistics */
  ts_status alias = k_no_alias(dinp, dout, "dinp", "dout", op);
  if (alias == TS_OK) alias = k_no_alias(dinp, inp, "dinp", "inp", op);
  if (alias == TS_OK) alias = k_no_alias(dweight, dbias, "dweight", "dbias", op);
  k_call c = {ctx,
              {dt},
              .empty = N == 0 || C == 0 || (!dinp && !dweight && !dbias),
              .ptrs = {dout, stats ? inp : K_UNUSED, stats ? (const void *)mean : K_UNUSED,
                       stats ? (const void *)rstd : K_UNUSED, dinp ? weight : K_UNUSED},
              .outs = {dinp, dweight, dbias},
              .conflict = alias,
              .workspace = K_WORKSPACE(ctx, ts_k_layernorm_workspace_bytes(ctx->device, N, C, dt))};
  K_RUN(OP_LAYERNORM_BACKWARD, c, layernorm_backward, ctx, dinp, dweight, dbias, dout, inp, weight,
        mean, rstd, N, C, dt);
}

/* ---- GELU --------------------------------------------------------------------------- */

static const k_op OP_GELU_FORWARD = {"ts_k_gelu_forward", 1, 2, {"out", "inp"}};
static const k_op OP_GELU_BACKWARD = {"ts_k_gelu_backward", 1, 3, {"dinp", "dout", "inp"}};

/* The scalar rule of both GELU directions: a known form. */
static ts_status gelu_rule(ts_gelu_kind kind, const char *op) {
  if (kind != TS_GELU_ERF && kind != TS_GELU_TANH)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: kind = %d: expected TS_GELU_ERF (0) or TS_GELU_TANH (1)", op,
                        (int)kind);
  return TS_OK;
}

ts_status ts_k_gelu_forward(const ts_kctx *ctx, void *out, const void *inp, size_t n,
                            ts_gelu_kind kind, ts_dtype dt) {
  k_call c = {ctx,
              {dt},
              .invalid = gelu_rule(kind, OP_GELU_FORWARD.name),
              .empty = n == 0,
              .ptrs = {out, inp}};
  K_RUN(OP_GELU_FORWARD, c, gelu_forward, ctx, out, inp, n, kind, dt);
}

ts_status ts_k_gelu_backward(const ts_kctx *ctx, void *dinp, const void *dout, const void *inp,
                             size_t n, ts_gelu_kind kind, ts_dtype dt) {
  k_call c = {ctx,
              {dt},
              .invalid = gelu_rule(kind, OP_GELU_BACKWARD.name),
              .empty = n == 0,
              .ptrs = {dinp, dout, inp}};
  K_RUN(OP_GELU_BACKWARD, c, gelu_backward, ctx, dinp, dout, inp, n, kind, dt);
}

/* ---- bias ------------------------------------------------------------------------------ */

static const k_op OP_BIAS_ADD = {"ts_k_bias_add", 1, 2, {"out", "bias"}};
static const k_op OP_BIAS_BACKWARD = {"ts_k_bias_backward", 1, 2, {"dbias", "dout"}};

ts_status ts_k_bias_add(const ts_kctx *ctx, void *out, const void *bias, size_t N, size_t C,
                        ts_dtype dt) {
  k_call c = {ctx,
              {dt},
              .empty = N == 0 || C == 0,
              .ptrs = {out, bias},
              .conflict = k_no_alias(out, bias, "out", "bias", OP_BIAS_ADD.name)};
  K_RUN(OP_BIAS_ADD, c, bias_add, ctx, out, bias, N, C, dt);
}

/* dbias += an empty sum when N or C is 0: nothing to do. */
ts_status ts_k_bias_backward(const ts_kctx *ctx, void *dbias, const void *dout, size_t N,
                             size_t C, ts_dtype dt) {
  if (ctx && ctx->wgrad && dbias && N && C) /* W: deferred (ts_k_wgrad) */
    return ts_k_wgrad_record(ctx, 3, dt, dbias, NULL, dout, NULL, NULL, NULL, N, C, 0);
  k_call c = {ctx,
              {dt},
              .empty = N == 0 || C == 0,
              .ptrs = {dbias, dout},
              .conflict = k_no_alias(dbias, dout, "dbias", "dout", OP_BIAS_BACKWARD.name),
              .workspace = K_WORKSPACE(ctx, ts_k_bias_workspace_bytes(ctx->device, N, C, dt))};
  K_RUN(OP_BIAS_BACKWARD, c, bias_backward, ctx, dbias, dout, N, C, dt);
}

/* ---- token types ----------------------------------------------------------------------- */

static const k_op OP_TOKEN_TYPES = {"ts_k_token_types", 0, 2, {"types", "tokens"}};

ts_status ts_k_token_types(const ts_kctx *ctx, int32_t *types, const int32_t *tokens, size_t B,
                           size_t T, int32_t sep_id, size_t n_types) {
  const char *op = OP_TOKEN_TYPES.name;
  k_call c = {
      ctx,
      .invalid = n_types == 0 || n_types > INT32_MAX
                     ? ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: n_types = %zu: expected 1 .. %d",
                                    op, n_types, INT32_MAX)
                     : TS_OK,
      .empty = B == 0 || T == 0, .ptrs = {types, tokens},
      .conflict = k_no_alias(types, tokens, "types", "tokens", op)};
  K_RUN(OP_TOKEN_TYPES, c, token_types, ctx, types, tokens, B, T, sep_id, n_types);
}

/* ---- bidirectional attention ------------------------------------------------------------ */

static const k_op OP_BIDIR_FORWARD = {"ts_k_attention_bidir_forward", 1, K_ATTENTION_FORWARD_PTRS};
static const k_op OP_BIDIR_BACKWARD = {"ts_k_attention_bidir_backward", 1,
                                       K_ATTENTION_BACKWARD_PTRS};

ts_status ts_k_attention_bidir_forward(const ts_kctx *ctx, void *out, void *state, const void *q,
                                       const void *k, const void *v, const int32_t *ids,
                                       int32_t pad_id, size_t B, size_t T, size_t NH, size_t HS,
                                       ts_dtype dt) {
  const char *op = OP_BIDIR_FORWARD.name;
  int empty = B == 0 || T == 0 || NH == 0;
  /* the key padding mask's ids when a pad id is given; outputs not inputs */
  ts_status rule = empty ? TS_OK : k_attention_hs(HS, op);
  if (rule == TS_OK && pad_id >= 0 && !ids) rule = check_ptr(ids, "ids", op);
  if (rule == TS_OK) rule = k_no_alias(out, q, "out", "q", op);
  if (rule == TS_OK) rule = k_no_alias(out, k, "out", "k", op);
  if (rule == TS_OK) rule = k_no_alias(out, v, "out", "v", op);
  k_call c = {ctx,
              {dt},
              .invalid = k_attention_heads(NH, NH, op),
              .empty = empty,
              .ptrs = {out, state, q, k, v},
              .conflict = rule,
              .workspace = K_WORKSPACE(
                  ctx, ts_k_attention_workspace_bytes(ctx->device, B, T, NH, NH, HS, dt))};
  K_RUN(OP_BIDIR_FORWARD, c, attention_bidir_forward, ctx, out, state, q, k, v,
        pad_id >= 0 ? ids : NULL, pad_id, B, T, NH, HS, dt);
}

ts_status ts_k_attention_bidir_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                        const void *dout, const void *out, const void *q,
                                        const void *k, const void *v, const void *state,
                                        size_t B, size_t T, size_t NH, size_t HS, ts_dtype dt) {
  const char *op = OP_BIDIR_BACKWARD.name;
  int empty = B == 0 || T == 0 || NH == 0;
  /* dq, dk, dv: distinct, and none of them an input */
  ts_status rule = empty ? TS_OK : k_attention_hs(HS, op);
  void *const outs[3] = {dq, dk, dv};
  const void *const ins[9] = {dq, dk, dv, dout, out, q, k, v, state};
  for (int i = 0; i < 3 && rule == TS_OK; i++)
    for (int j = 0; j < 9 && rule == TS_OK; j++)
      if (i != j)
        rule =
            k_no_alias(outs[i], ins[j], OP_BIDIR_BACKWARD.ptrs[i], OP_BIDIR_BACKWARD.ptrs[j], op);
  k_call c = {ctx,
              {dt},
              .invalid = k_attention_heads(NH, NH, op),
              .empty = empty,
              .ptrs = {dq, dk, dv, dout, out, q, k, v, state},
              .conflict = rule,
              .workspace = K_WORKSPACE(
                  ctx, ts_k_attention_workspace_bytes(ctx->device, B, T, NH, NH, HS, dt))};
  K_RUN(OP_BIDIR_BACKWARD, c, attention_bidir_backward, ctx, dq, dk, dv, dout, out, q, k, v, state,
        B, T, NH, HS, dt);
}
