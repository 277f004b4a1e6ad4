/*
 * cross_entropy.c — the CPU bodies of softmax cross-entropy over the
 * vocabulary, matching PyTorch F.cross_entropy(reduction="none",
 * ignore_index=-100) per row, and of the masked loss sum (ts_k_loss_sum:
 * the rows' losses added in row order in double).
 *
 *   loss[n] = logsumexp(x[n]) - x[n, y[n]],  logsumexp = max + log sum e^(x - max)
 *   dlogits[n] = dloss * (softmax(x[n]) - onehot(y[n]))
 * Rows whose target is TS_IGNORE_INDEX give loss 0 and zero gradient.
 *
 * Invariants: every target is validated before any output is written; rows
 * are independent and each row's sums run in one fixed order (TS_CPU_LANES
 * partial sums of ts_cpu_exp's exponentials), so results do not depend on
 * the thread count nor on the vector width ts_cpu_isa picks; statistics
 * are fp32; half-precision logits are widened in bulk a piece of
 * TS_CPU_PIECE at a time into a stack buffer (no workspace), each piece's
 * exponentials summed in the partial sums and the pieces' sums added in
 * order (kernels_convert_test spells the order out); backward reads a
 * whole row before writing it, so dlogits may alias logits.
 */
#include <math.h>

#include "kernels/cpu/cpu_common.h"

/* Returns TS_ERR_INVALID_ARGUMENT naming the first bad target. */
static ts_status check_targets(const int32_t *targets, size_t N, size_t V, const char *op) {
  for (size_t n = 0; n < N; n++) {
    int32_t y = targets[n];
    if (y != TS_IGNORE_INDEX && (y < 0 || (size_t)y >= V))
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "%s: targets[%zu] = %d: expected a class in [0, %zu) or %d (ignore)", op,
                          n, (int)y, V, TS_IGNORE_INDEX);
  }
  return TS_OK;
}

/* The largest of x[0, k) and m: lanes of 16, as the sums (the maximum
 * does not depend on the order; NaN never wins a comparison). */
TS_AI float row_max(const float *x, size_t k, float m) {
  float lanes[TS_CPU_LANES];
  for (int l = 0; l < TS_CPU_LANES; l++) lanes[l] = m;
  size_t j0 = 0;
  for (; j0 + TS_CPU_LANES <= k; j0 += TS_CPU_LANES) {
#pragma omp simd
    for (size_t l = 0; l < TS_CPU_LANES; l++)
      lanes[l] = x[j0 + l] > lanes[l] ? x[j0 + l] : lanes[l];
  }
  for (size_t j = j0; j < k; j++) m = x[j] > m ? x[j] : m;
  for (int l = 0; l < TS_CPU_LANES; l++) m = lanes[l] > m ? lanes[l] : m;
  return m;
}

/* Max and sum of exp(x - max) of row n: fp32 rows in place, half ones a
 * widened piece at a time; each piece's exponentials summed in
 * TS_CPU_LANES partial sums (ts_cpu_exp: the same bits at every width),
 * the pieces' sums added in order. */
TS_AI void row_stats(const void *logits, size_t V, size_t n, float *max_out, float *sum_out,
                     ts_dtype dt) {
  size_t o = n * V;
  float m = -INFINITY, s = 0.0f;
  if (dt == TS_FP32) {
    const float *x = (const float *)logits + o;
    m = row_max(x, V, m);
    TS_CPU_LANE_SUM(s, V, j, ts_cpu_exp(x[j] - m));
    *max_out = m;
    *sum_out = s;
    return;
  }
  float x[TS_CPU_PIECE];
  for (size_t j0 = 0; j0 < V; j0 += TS_CPU_PIECE) {
    size_t k = V - j0 < TS_CPU_PIECE ? V - j0 : TS_CPU_PIECE;
    ts_cpu_widen_at(x, logits, o + j0, k, dt);
    m = row_max(x, k, m);
  }
  for (size_t j0 = 0; j0 < V; j0 += TS_CPU_PIECE) {
    size_t k = V - j0 < TS_CPU_PIECE ? V - j0 : TS_CPU_PIECE;
    ts_cpu_widen_at(x, logits, o + j0, k, dt);
    float part;
    TS_CPU_LANE_SUM(part, k, j, ts_cpu_exp(x[j] - m));
    s += part;
  }
  *max_out = m;
  *sum_out = s;
}

TS_AI float ce_fwd_row(const void *logits, int32_t y, size_t V, size_t n, ts_dtype dt) {
  float m, s;
  row_stats(logits, V, n, &m, &s, dt);
  return (logf(s) + m) - ld(logits, n * V + (size_t)y, dt);
}

/* Row n's loss in dt's specialisation, 0 for an ignored row. */
TS_AI void ce_loss_row_body(float *loss, const void *logits, int32_t y, size_t V, size_t n,
                            ts_dtype dt) {
  if (y == TS_IGNORE_INDEX)
    *loss = 0.0f;
  else if (dt == TS_FP32)
    *loss = ce_fwd_row(logits, y, V, n, TS_FP32);
  else if (dt == TS_BF16)
    *loss = ce_fwd_row(logits, y, V, n, TS_BF16);
  else
    *loss = ce_fwd_row(logits, y, V, n, TS_FP16);
}
TS_CPU_CLONES(ce_loss_row,
              (float *loss, const void *logits, int32_t y, size_t V, size_t n, ts_dtype dt),
              (loss, logits, y, V, n, dt))

ts_status ts_cpu_cross_entropy_forward(const ts_kctx *ctx, float *loss_rows, const void *logits,
                                       const int32_t *targets, size_t N, size_t V, ts_dtype dt) {
  TS_CHECK(check_targets(targets, N, V, "ts_k_cross_entropy_forward"));
#pragma omp parallel for schedule(static) if (N * V > 16384)
  for (ptrdiff_t n = 0; n < (ptrdiff_t)N; n++)
    ce_loss_row(&loss_rows[n], logits, targets[n], V, (size_t)n, dt);
  return TS_OK;
}

ts_status ts_cpu_loss_sum(const ts_kctx *ctx, double *out, const float *loss_rows,
                          const int32_t *targets, size_t N) {
  double sum = 0;
  size_t count = 0;
  for (size_t n = 0; n < N; n++) {
    if (targets[n] == TS_IGNORE_INDEX) continue;
    sum += loss_rows[n];
    count++;
  }
  out[0] = sum;
  out[1] = (double)count;
  return TS_OK;
}

TS_AI void ce_bwd_row(void *dlogits, const void *logits, int32_t y, size_t V, size_t n, float dloss,
                      ts_dtype dt) {
  size_t o = n * V;
  if (y == TS_IGNORE_INDEX) {
    for (size_t j = 0; j < V; j++) st(dlogits, o + j, dt, 0.0f);
    return;
  }
  if (dt == TS_FP32) {
    /* One exponential per logit: keep e^(x - max) in the fp32 output row
     * (each x is read before its slot is overwritten, so aliasing is fine). */
    const float *x = (const float *)logits + o;
    float *d = (float *)dlogits + o;
    float m = row_max(x, V, -INFINITY), s;
    TS_CPU_LANE_SUM(s, V, j, (d[j] = ts_cpu_exp(x[j] - m)));
    float inv = 1.0f / s;
    float py = d[y] * inv;
#pragma omp simd
    for (size_t j = 0; j < V; j++) d[j] = dloss * (d[j] * inv);
    d[y] = dloss * (py - 1.0f);
    return;
  }
  /* Half storage would round e^(x - max): recompute it instead, a widened
   * piece at a time (the whole row was read by row_stats already). */
  float m, s;
  row_stats(logits, V, n, &m, &s, dt);
  float inv = 1.0f / s;
  float x[TS_CPU_PIECE];
  for (size_t j0 = 0; j0 < V; j0 += TS_CPU_PIECE) {
    size_t k = V - j0 < TS_CPU_PIECE ? V - j0 : TS_CPU_PIECE;
    ts_cpu_widen_at(x, logits, o + j0, k, dt);
#pragma omp simd
    for (size_t j = 0; j < k; j++) {
      float p = ts_cpu_exp(x[j] - m) * inv;
      x[j] = dloss * (p - (j0 + j == (size_t)y ? 1.0f : 0.0f));
    }
    ts_cpu_narrow_at(dlogits, o + j0, x, k, dt);
  }
}

TS_AI void ce_bwd_row_any_body(void *dlogits, const void *logits, int32_t y, size_t V, size_t n,
                               float dloss, ts_dtype dt) {
  TS_DT_CALL(dt, ce_bwd_row, dlogits, logits, y, V, n, dloss);
}
TS_CPU_CLONES(ce_bwd_row_any,
              (void *dlogits, const void *logits, int32_t y, size_t V, size_t n, float dloss,
               ts_dtype dt),
              (dlogits, logits, y, V, n, dloss, dt))

ts_status ts_cpu_cross_entropy_backward(const ts_kctx *ctx, void *dlogits, const void *logits,
                                        const int32_t *targets, size_t N, size_t V, float dloss,
                                        ts_dtype dt) {
  TS_CHECK(check_targets(targets, N, V, "ts_k_cross_entropy_backward"));
#pragma omp parallel for schedule(static) if (N * V > 16384)
  for (ptrdiff_t n = 0; n < (ptrdiff_t)N; n++)
    ce_bwd_row_any(dlogits, logits, targets[n], V, (size_t)n, dloss, dt);
  return TS_OK;
}

ts_status ts_cpu_cross_entropy_fused(const ts_kctx *ctx, float *loss_rows, void *dlogits,
                                     const void *logits, const int32_t *targets, size_t N,
                                     size_t V, float dloss, ts_dtype dt) {
  TS_CHECK(check_targets(targets, N, V, "ts_k_cross_entropy_fused"));
  /* Per row: the forward's loss, then the backward's gradient from the same
   * row functions (the same bits as the two calls), the row read whole
   * before it is overwritten. */
#pragma omp parallel for schedule(static) if (N * V > 16384)
  for (ptrdiff_t n = 0; n < (ptrdiff_t)N; n++) {
    int32_t y = targets[n];
    ce_loss_row(&loss_rows[n], logits, y, V, (size_t)n, dt);
    ce_bwd_row_any(dlogits, logits, y, V, (size_t)n, dloss, dt);
  }
  return TS_OK;
}
