/*
 * kernels_fp8.c — the kernels front of the fp8 ops (kernels/kernels.h,
 * "fp8 linear layer"): the cast of a tensor to fp8 and the linear layer
 * with fp8 products. Each public function validates its arguments here,
 * once, with kernels_front.h's checks, then calls the op of the context's
 * backend table; the invariants are kernels.c's (every check before any
 * backend call, empty cases handled here, messages naming the public op).
 */
#include <stdint.h>

#include "kernels/kernels.h"
#include "kernels/kernels_front.h"

const char *ts_fp8_scaling_name(ts_fp8_scaling s) {
  switch (s) {
  case TS_FP8_OFF: return "off";
  case TS_FP8_TENSORWISE: return "tensorwise";
  case TS_FP8_ROWWISE: return "rowwise";
  }
  return NULL;
}

size_t ts_k_fp8_quantize_workspace_bytes(ts_device dev, size_t R, size_t C) {
  const ts_k_backend *be = query_backend(dev);
  return be->fp8_quantize_workspace_bytes ? be->fp8_quantize_workspace_bytes(R, C) : 0;
}

size_t ts_k_linear_fp8_workspace_bytes(ts_device dev, size_t M, size_t N, size_t K,
                                       ts_fp8_scaling scaling) {
  const ts_k_backend *be = query_backend(dev);
  return be->linear_fp8_workspace_bytes ? be->linear_fp8_workspace_bytes(M, N, K, scaling) : 0;
}

/* TS_OK, or TS_ERR_INVALID_ARGUMENT naming op, unless scaling is
 * tensorwise or rowwise. */
static ts_status check_scaling(ts_fp8_scaling scaling, const char *op) {
  if (scaling == TS_FP8_TENSORWISE || scaling == TS_FP8_ROWWISE) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                      "%s: scaling %d: expected TS_FP8_TENSORWISE or TS_FP8_ROWWISE", op,
                      (int)scaling);
}

static const k_op OP_FP8_QUANTIZE = {"ts_k_fp8_quantize", 1, 3, {"out", "scale_inv", "inp"}};

ts_status ts_k_fp8_quantize(const ts_kctx *ctx, uint8_t *out, float *scale_inv, const void *inp,
                            size_t R, size_t C, int transpose, ts_fp8_format fmt,
                            ts_fp8_scaling scaling, ts_dtype dt) {
  const char *op = OP_FP8_QUANTIZE.name;
  ts_status invalid = check_scaling(scaling, op);
  if (invalid == TS_OK && fmt != TS_FP8_E4M3 && fmt != TS_FP8_E5M2)
    invalid = ts_set_error(TS_ERR_INVALID_ARGUMENT,
                           "%s: format %d: expected TS_FP8_E4M3 or TS_FP8_E5M2", op, (int)fmt);
  if (invalid == TS_OK && transpose != 0 && transpose != 1)
    invalid = ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: transpose %d: expected 0 or 1", op,
                           transpose);
  size_t n = R * C, in_bytes = n * ts_dtype_size(dt);
  ts_status conflict = TS_OK;
  if (out && inp && n &&
      (const char *)out < (const char *)inp + in_bytes && (const char *)inp < (const char *)out + n)
    conflict = ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: out and inp overlap", op);
  k_call c = {ctx,
              {dt},
              .invalid = invalid,
              .empty = n == 0,
              .ptrs = {out, scale_inv, inp},
              .conflict = conflict,
              .workspace = K_WORKSPACE(ctx, ts_k_fp8_quantize_workspace_bytes(ctx->device, R, C))};
  K_RUN(OP_FP8_QUANTIZE, c, fp8_quantize, ctx, out, scale_inv, inp, R, C, transpose, fmt,
        scaling, dt);
}

/* The checks both linear passes share: a scaling, bf16, and every
 * dimension a multiple of 16 (cuBLASLt's fp8 operands are K-major with
 * leading dimensions of 16-byte multiples; checked on every device, so the
 * CPU reference refuses what the GPU would). */
static ts_status check_linear(size_t M, size_t N, size_t K, ts_fp8_scaling scaling, ts_dtype dt,
                              const char *op) {
  TS_CHECK(check_scaling(scaling, op));
  if (dt != TS_BF16)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: dtype %s: expected bf16", op,
                        ts_dtype_name(dt));
  if (M % 16 || N % 16 || K % 16)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: M=%zu N=%zu K=%zu: each must be a multiple of 16 (fp8 products)", op,
                        M, N, K);
  return TS_OK;
}

static const k_op OP_LINEAR_FP8_FORWARD = {
    "ts_k_linear_fp8_forward", 1, 3, {"out", "inp", "weight"}};
static const k_op OP_LINEAR_FP8_BACKWARD = {
    "ts_k_linear_fp8_backward", 1, 3, {"dout", "weight", "inp"}, 2, {"dinp", "dweight"}};

ts_status ts_k_linear_fp8_forward(const ts_kctx *ctx, void *out, const void *inp,
                                  const void *weight, size_t M, size_t N, size_t K,
                                  ts_fp8_scaling scaling, ts_dtype dt) {
  k_call c = {ctx,
              {dt},
              .invalid = check_linear(M, N, K, scaling, dt, OP_LINEAR_FP8_FORWARD.name),
              .empty = M == 0 || N == 0,
              .ptrs = {out, K ? inp : K_UNUSED, K ? weight : K_UNUSED},
              .workspace = K ? K_WORKSPACE(ctx, ts_k_linear_fp8_workspace_bytes(ctx->device, M,
                                                                                N, K, scaling))
                             : 0};
  if (K == 0 && c.ctx && !c.empty && out) { /* empty sums: out = 0 */
    const ts_k_backend *be;
    int run;
    TS_CHECK(k_check(&OP_LINEAR_FP8_FORWARD, &c, &be, &run));
    return ts_k_zero(ctx, out, M * N * ts_dtype_size(dt));
  }
  K_RUN(OP_LINEAR_FP8_FORWARD, c, linear_fp8_forward, ctx, out, inp, weight, M, N, K, scaling,
        dt);
}

ts_status ts_k_linear_fp8_backward(const ts_kctx *ctx, void *dinp, void *dweight,
                                   const void *dout, const void *inp, const void *weight,
                                   size_t M, size_t N, size_t K, ts_fp8_scaling scaling,
                                   ts_dtype dt) {
  const char *op = OP_LINEAR_FP8_BACKWARD.name;
  ts_status invalid = check_linear(M, N, K, scaling, dt, op);
  if (invalid == TS_OK && ctx && ctx->wgrad && dweight)
    invalid = ts_set_error(TS_ERR_UNSUPPORTED,
                           "%s: deferred weight gradients (ctx->wgrad, zero-bubble pipeline "
                           "schedules) have no fp8 form",
                           op);
  int zero_dinp = M > 0 && K > 0 && N == 0 && dinp;
  k_call c = {ctx,
              {dt},
              .invalid = invalid,
              .empty = M == 0 || K == 0 || N == 0 || (!dinp && !dweight),
              .ptrs = {dout, dinp ? weight : K_UNUSED, dweight ? inp : K_UNUSED},
              .outs = {dinp, dweight},
              .workspace =
                  K_WORKSPACE(ctx, ts_k_linear_fp8_workspace_bytes(ctx->device, M, N, K, scaling))};
  if (zero_dinp) {
    const ts_k_backend *be;
    int run;
    TS_CHECK(k_check(&OP_LINEAR_FP8_BACKWARD, &c, &be, &run));
    return ts_k_zero(ctx, dinp, M * K * ts_dtype_size(dt));
  }
  K_RUN(OP_LINEAR_FP8_BACKWARD, c, linear_fp8_backward, ctx, dinp, dweight, dout, inp, weight, M,
        N, K, scaling, dt);
}
