/*
 * layernorm.c — the CPU bodies of the encoder's per-channel affine ops:
 * LayerNorm (Ba et al. 2016, eq. 4; torch.nn.LayerNorm with its biased
 * variance) and the bias of a linear layer (nn.Linear's + b), forward and
 * backward, and the residual add fused with LayerNorm's forward
 * (ts_k_add_layernorm_forward: ts_k_add's body, then forward's).
 *
 * LayerNorm, per row with mean m and rstd r = 1 / sqrt(var + eps):
 *   out = (x - m) * r * weight + bias
 * Backward, with xhat = (x - m) r and g = dout * weight:
 *   dinp    += r (g - mean_c(g) - xhat mean_c(g xhat))
 *   dweight += sum_n dout xhat;   dbias += sum_n dout
 *
 * Invariants:
 * - Statistics are fp32 (mean and rstd (N), saved by forward for backward);
 *   half storage is read and written per element (ld/st), computed in fp32
 *   and rounded once.
 * - Rows are independent; a row's sums run in TS_CPU_LANES partial sums
 *   (TS_CPU_LANE_SUM): the same bits at every vector width (TS_CPU_CLONES
 *   compiles the row loops for AVX-512, AVX2 and baseline x86-64).
 * - Column sums over rows (dweight, dbias) run in two passes: rows are cut
 *   into R = row_blocks(N) fixed blocks; each block's fp32 sums, rows in
 *   order, go to its row of ctx->workspace; then the R partial rows are
 *   added in block order and rounded once into the gradient. Both passes'
 *   orders depend on N and C only, so results do not depend on the thread
 *   count.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_common.h"

enum {
  BLOCK_ROWS = 32,  /* rows per partial-sum block, at least */
  MAX_BLOCKS = 128, /* partial-sum blocks, at most */
  CBLOCK = 256,     /* channels per work item of the final column sums */
};

/* Blocks of consecutive rows the column sums cut N rows into: block r is
 * rows [r N / R, (r + 1) N / R). */
static size_t row_blocks(size_t N) {
  size_t r = (N + BLOCK_ROWS - 1) / BLOCK_ROWS;
  return r < 1 ? 1 : r > MAX_BLOCKS ? MAX_BLOCKS : r;
}

size_t ts_cpu_layernorm_workspace_bytes(size_t N, size_t C, ts_dtype dt) {
  return N == 0 || C == 0 ? 0 : row_blocks(N) * 2 * C * sizeof(float);
}

size_t ts_cpu_bias_workspace_bytes(size_t N, size_t C, ts_dtype dt) {
  return N == 0 || C == 0 ? 0 : row_blocks(N) * C * sizeof(float);
}

/* d[c] = round(d[c] + sum_r partial[r * stride + c]), r = 0 .. R-1 in
 * order, for c < C: the second pass of the column sums. */
TS_AI void colsum_range(void *d, const float *partial, size_t R, size_t stride, size_t c0,
                        size_t c1, ts_dtype dt) {
  for (size_t c = c0; c < c1; c++) {
    float s = 0.0f;
    for (size_t r = 0; r < R; r++) s += partial[r * stride + c];
    st(d, c, dt, ld(d, c, dt) + s);
  }
}

static void colsum_finish(void *d, const float *partial, size_t R, size_t stride, size_t C,
                          ts_dtype dt) {
  ptrdiff_t nblocks = (ptrdiff_t)((C + CBLOCK - 1) / CBLOCK);
#pragma omp parallel for schedule(static) if (nblocks > 1 && R * C > 16384)
  for (ptrdiff_t b = 0; b < nblocks; b++) {
    size_t c0 = (size_t)b * CBLOCK, c1 = c0 + CBLOCK < C ? c0 + CBLOCK : C;
    TS_DT_CALL(dt, colsum_range, d, partial, R, stride, c0, c1);
  }
}

/* ---- LayerNorm --------------------------------------------------------------- */

/* One row of forward: writes out's row, mean[row] and rstd[row]. */
TS_AI void ln_fwd_row(void *out, float *mean, float *rstd, const void *inp, const void *weight,
                      const void *bias, size_t C, float eps, size_t row, ts_dtype dt) {
  size_t o = row * C;
  float s, ss;
  TS_CPU_LANE_SUM(s, C, c, ld(inp, o + c, dt));
  float m = s / (float)C;
  TS_CPU_LANE_SUM(ss, C, c, (ld(inp, o + c, dt) - m) * (ld(inp, o + c, dt) - m));
  float r = 1.0f / sqrtf(ss / (float)C + eps);
#pragma omp simd
  for (size_t c = 0; c < C; c++)
    st(out, o + c, dt, (ld(inp, o + c, dt) - m) * r * ld(weight, c, dt) + ld(bias, c, dt));
  mean[row] = m;
  rstd[row] = r;
}

TS_AI void ln_fwd_row_any_body(void *out, float *mean, float *rstd, const void *inp,
                               const void *weight, const void *bias, size_t C, float eps,
                               size_t row, ts_dtype dt) {
  TS_DT_CALL(dt, ln_fwd_row, out, mean, rstd, inp, weight, bias, C, eps, row);
}
TS_CPU_CLONES(ln_fwd_row_any,
              (void *out, float *mean, float *rstd, const void *inp, const void *weight,
               const void *bias, size_t C, float eps, size_t row, ts_dtype dt),
              (out, mean, rstd, inp, weight, bias, C, eps, row, dt))

ts_status ts_cpu_layernorm_forward(const ts_kctx *ctx, void *out, float *mean, float *rstd,
                                   const void *inp, const void *weight, const void *bias,
                                   size_t N, size_t C, float eps, ts_dtype dt) {
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (ptrdiff_t n = 0; n < (ptrdiff_t)N; n++)
    ln_fwd_row_any(out, mean, rstd, inp, weight, bias, C, eps, (size_t)n, dt);
  return TS_OK;
}

/* ts_k_add, then LayerNorm of the sum: the two bodies in turn, so the bits
 * are the unfused ops' by construction. */
ts_status ts_cpu_add_layernorm_forward(const ts_kctx *ctx, void *out, float *mean, float *rstd,
                                       void *res, const void *a, const void *b, const void *weight,
                                       const void *bias, size_t N, size_t C, float eps,
                                       ts_dtype dt) {
  TS_CHECK(ts_cpu_add(ctx, res, a, b, N * C, dt));
  return ts_cpu_layernorm_forward(ctx, out, mean, rstd, res, weight, bias, N, C, eps, dt);
}

/* One row of backward: dinp's row (if dinp), and the row's terms added to
 * the block's partial sums pw (dweight) and pb (dbias), each if not NULL. */
TS_AI void ln_bwd_row(void *dinp, float *pw, float *pb, const void *dout, const void *inp,
                      const void *weight, const float *mean, const float *rstd, size_t C,
                      size_t row, ts_dtype dt) {
  size_t o = row * C;
  if (dinp) {
    float m = mean[row], r = rstd[row];
    float sg, sgx;
    TS_CPU_LANE_SUM(sg, C, c, ld(dout, o + c, dt) * ld(weight, c, dt));
    TS_CPU_LANE_SUM(sgx, C, c,
                    ld(dout, o + c, dt) * ld(weight, c, dt) * ((ld(inp, o + c, dt) - m) * r));
    float mg = sg / (float)C, mgx = sgx / (float)C;
#pragma omp simd
    for (size_t c = 0; c < C; c++) {
      float g = ld(dout, o + c, dt) * ld(weight, c, dt);
      float xhat = (ld(inp, o + c, dt) - m) * r;
      st(dinp, o + c, dt, ld(dinp, o + c, dt) + r * (g - mg - xhat * mgx));
    }
  }
  if (pw) {
    float m = mean[row], r = rstd[row];
#pragma omp simd
    for (size_t c = 0; c < C; c++) pw[c] += ld(dout, o + c, dt) * ((ld(inp, o + c, dt) - m) * r);
  }
  if (pb) {
#pragma omp simd
    for (size_t c = 0; c < C; c++) pb[c] += ld(dout, o + c, dt);
  }
}

/* Rows [n0, n1) of backward (ln_bwd_row), in order. */
TS_AI void ln_bwd_rows_body(void *dinp, float *pw, float *pb, const void *dout, const void *inp,
                            const void *weight, const float *mean, const float *rstd, size_t C,
                            size_t n0, size_t n1, ts_dtype dt) {
  for (size_t n = n0; n < n1; n++)
    TS_DT_CALL(dt, ln_bwd_row, dinp, pw, pb, dout, inp, weight, mean, rstd, C, n);
}
TS_CPU_CLONES(ln_bwd_rows,
              (void *dinp, float *pw, float *pb, const void *dout, const void *inp,
               const void *weight, const float *mean, const float *rstd, size_t C, size_t n0,
               size_t n1, ts_dtype dt),
              (dinp, pw, pb, dout, inp, weight, mean, rstd, C, n0, n1, dt))

ts_status ts_cpu_layernorm_backward(const ts_kctx *ctx, void *dinp, void *dweight, void *dbias,
                                    const void *dout, const void *inp, const void *weight,
                                    const float *mean, const float *rstd, size_t N, size_t C,
                                    ts_dtype dt) {
  size_t R = row_blocks(N);
  float *part = (float *)ctx->workspace; /* (R, 2, C): dweight's, then dbias's sums */
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (ptrdiff_t b = 0; b < (ptrdiff_t)R; b++) {
    float *pw = dweight ? part + (size_t)b * 2 * C : NULL;
    float *pb = dbias ? part + (size_t)b * 2 * C + C : NULL;
    if (pw) memset(pw, 0, C * sizeof(float));
    if (pb) memset(pb, 0, C * sizeof(float));
    ln_bwd_rows(dinp, pw, pb, dout, inp, weight, mean, rstd, C, (size_t)b * N / R,
                ((size_t)b + 1) * N / R, dt);
  }
  if (dweight) colsum_finish(dweight, part, R, 2 * C, C, dt);
  if (dbias) colsum_finish(dbias, part + C, R, 2 * C, C, dt);
  return TS_OK;
}

/* ---- bias ----------------------------------------------------------------------- */

/* out[row] += bias, one rounding per element. */
TS_AI void bias_add_row(void *out, const void *bias, size_t C, size_t row, ts_dtype dt) {
  size_t o = row * C;
#pragma omp simd
  for (size_t c = 0; c < C; c++) st(out, o + c, dt, ld(out, o + c, dt) + ld(bias, c, dt));
}
TS_AI void bias_add_row_any_body(void *out, const void *bias, size_t C, size_t row, ts_dtype dt) {
  TS_DT_CALL(dt, bias_add_row, out, bias, C, row);
}
TS_CPU_CLONES(bias_add_row_any, (void *out, const void *bias, size_t C, size_t row, ts_dtype dt),
              (out, bias, C, row, dt))

ts_status ts_cpu_bias_add(const ts_kctx *ctx, void *out, const void *bias, size_t N, size_t C,
                          ts_dtype dt) {
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (ptrdiff_t n = 0; n < (ptrdiff_t)N; n++) bias_add_row_any(out, bias, C, (size_t)n, dt);
  return TS_OK;
}

/* p[c] = sum of dout[n, c] over rows [n0, n1) in order. */
TS_AI void bias_partial(float *p, const void *dout, size_t C, size_t n0, size_t n1, ts_dtype dt) {
  memset(p, 0, C * sizeof(float));
  for (size_t n = n0; n < n1; n++) {
#pragma omp simd
    for (size_t c = 0; c < C; c++) p[c] += ld(dout, n * C + c, dt);
  }
}
TS_AI void bias_partial_any_body(float *p, const void *dout, size_t C, size_t n0, size_t n1,
                                 ts_dtype dt) {
  TS_DT_CALL(dt, bias_partial, p, dout, C, n0, n1);
}
TS_CPU_CLONES(bias_partial_any,
              (float *p, const void *dout, size_t C, size_t n0, size_t n1, ts_dtype dt),
              (p, dout, C, n0, n1, dt))

ts_status ts_cpu_bias_backward(const ts_kctx *ctx, void *dbias, const void *dout, size_t N,
                               size_t C, ts_dtype dt) {
  size_t R = row_blocks(N);
  float *part = (float *)ctx->workspace; /* (R, C) */
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (ptrdiff_t b = 0; b < (ptrdiff_t)R; b++)
    bias_partial_any(part + (size_t)b * C, dout, C, (size_t)b * N / R, ((size_t)b + 1) * N / R,
                     dt);
  colsum_finish(dbias, part, R, C, C, dt);
  return TS_OK;
}
