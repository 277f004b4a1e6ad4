/*
 * rmsnorm.c — the CPU body of RMSNorm (Zhang & Sennrich 2019, eq. 4; Hugging Face
 * LlamaRMSNorm): out = weight * inp / sqrt(mean(inp^2) + eps), and the
 * residual add fused with its forward (ts_k_add_rmsnorm_forward: ts_k_add's
 * body, then forward's).
 *
 * Invariants:
 * - Statistics are fp32: rstd (N) is saved by forward for backward.
 * - Rows are independent; per-row sums run in TS_CPU_LANES partial sums
 *   (TS_CPU_LANE_SUM), so results do not depend on the thread count or
 *   on the vector width of the body ts_cpu_isa picks (TS_CPU_CLONES). dweight is reduced over rows
 *   by threads that own disjoint channel blocks and walk rows in order.
 * - Half dtypes load/store per element and compute in fp32 (no scratch).
 *
 * Backward, with r = rstd, g = weight * dout (per element of a row):
 *   dinp   += r g - (r^3 / C) inp sum_c(g inp)
 *   dweight += sum_n dout inp r
 */
#include <math.h>

#include "kernels/cpu/cpu_common.h"

enum { CBLOCK = 64 }; /* channels per dweight work item */

/* One row of forward: writes out's row and rstd[row]. */
TS_AI void rmsnorm_fwd_row(void *out, float *rstd, const void *inp, const void *weight, size_t C,
                           float eps, size_t row, ts_dtype dt) {
  size_t o = row * C;
  float ss;
  TS_CPU_LANE_SUM(ss, C, c, ld(inp, o + c, dt) * ld(inp, o + c, dt));
  float r = 1.0f / sqrtf(ss / (float)C + eps);
#pragma omp simd
  for (size_t c = 0; c < C; c++) st(out, o + c, dt, ld(weight, c, dt) * (ld(inp, o + c, dt) * r));
  rstd[row] = r;
}

TS_AI void rmsnorm_fwd_row_any_body(void *out, float *rstd, const void *inp, const void *weight,
                                    size_t C, float eps, size_t row, ts_dtype dt) {
  TS_DT_CALL(dt, rmsnorm_fwd_row, out, rstd, inp, weight, C, eps, row);
}
TS_CPU_CLONES(rmsnorm_fwd_row_any,
              (void *out, float *rstd, const void *inp, const void *weight, size_t C, float eps,
               size_t row, ts_dtype dt),
              (out, rstd, inp, weight, C, eps, row, dt))

ts_status ts_cpu_rmsnorm_forward(const ts_kctx *ctx, void *out, float *rstd, const void *inp,
                                 const void *weight, size_t N, size_t C, float eps, ts_dtype dt) {
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (ptrdiff_t n = 0; n < (ptrdiff_t)N; n++)
    rmsnorm_fwd_row_any(out, rstd, inp, weight, C, eps, (size_t)n, dt);
  return TS_OK;
}

/* ts_k_add, then RMSNorm of the sum: the two bodies in turn, so the bits
 * are the unfused ops' by construction. */
ts_status ts_cpu_add_rmsnorm_forward(const ts_kctx *ctx, void *out, float *rstd, void *res,
                                     const void *a, const void *b, const void *weight, size_t N,
                                     size_t C, float eps, ts_dtype dt) {
  TS_CHECK(ts_cpu_add(ctx, res, a, b, N * C, dt));
  return ts_cpu_rmsnorm_forward(ctx, out, rstd, res, weight, N, C, eps, dt);
}

/* One row of backward: dinp[row] += r g - (r^3/C) inp sum(g inp). */
TS_AI void rmsnorm_bwd_row(void *dinp, const void *dout, const void *inp, const void *weight,
                           const float *rstd, size_t C, size_t row, ts_dtype dt) {
  size_t o = row * C;
  float r = rstd[row];
  float dot;
  TS_CPU_LANE_SUM(dot, C, c, ld(weight, c, dt) * ld(dout, o + c, dt) * ld(inp, o + c, dt));
  float k = r * r * r * dot / (float)C;
#pragma omp simd
  for (size_t c = 0; c < C; c++) {
    float g = ld(weight, c, dt) * ld(dout, o + c, dt);
    st(dinp, o + c, dt, ld(dinp, o + c, dt) + (r * g - k * ld(inp, o + c, dt)));
  }
}

/* dweight[c] += sum_n dout[n,c] inp[n,c] rstd[n] for c in [c0, c1), rows in order. */
TS_AI void rmsnorm_dweight_block(void *dweight, const void *dout, const void *inp,
                                 const float *rstd, size_t N, size_t C, size_t c0, size_t c1,
                                 ts_dtype dt) {
  float acc[CBLOCK];
  for (size_t c = c0; c < c1; c++) acc[c - c0] = 0.0f;
  for (size_t n = 0; n < N; n++) {
    float r = rstd[n];
    size_t o = n * C;
#pragma omp simd
    for (size_t c = c0; c < c1; c++) acc[c - c0] += ld(dout, o + c, dt) * (ld(inp, o + c, dt) * r);
  }
  for (size_t c = c0; c < c1; c++) st(dweight, c, dt, ld(dweight, c, dt) + acc[c - c0]);
}

TS_AI void rmsnorm_bwd_row_any_body(void *dinp, const void *dout, const void *inp,
                                    const void *weight, const float *rstd, size_t C, size_t row,
                                    ts_dtype dt) {
  TS_DT_CALL(dt, rmsnorm_bwd_row, dinp, dout, inp, weight, rstd, C, row);
}
TS_CPU_CLONES(rmsnorm_bwd_row_any,
              (void *dinp, const void *dout, const void *inp, const void *weight,
               const float *rstd, size_t C, size_t row, ts_dtype dt),
              (dinp, dout, inp, weight, rstd, C, row, dt))

TS_AI void rmsnorm_dweight_any_body(void *dweight, const void *dout, const void *inp,
                                    const float *rstd, size_t N, size_t C, size_t c0, size_t c1,
                                    ts_dtype dt) {
  TS_DT_CALL(dt, rmsnorm_dweight_block, dweight, dout, inp, rstd, N, C, c0, c1);
}
TS_CPU_CLONES(rmsnorm_dweight_any,
              (void *dweight, const void *dout, const void *inp, const float *rstd, size_t N,
               size_t C, size_t c0, size_t c1, ts_dtype dt),
              (dweight, dout, inp, rstd, N, C, c0, c1, dt))

ts_status ts_cpu_rmsnorm_backward(const ts_kctx *ctx, void *dinp, void *dweight,
                                  const void *dout, const void *inp, const void *weight,
                                  const float *rstd, size_t N, size_t C, ts_dtype dt) {
  if (dinp) {
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (ptrdiff_t n = 0; n < (ptrdiff_t)N; n++)
      rmsnorm_bwd_row_any(dinp, dout, inp, weight, rstd, C, (size_t)n, dt);
  }
  if (dweight) {
    ptrdiff_t nblocks = (ptrdiff_t)((C + CBLOCK - 1) / CBLOCK);
#pragma omp parallel for schedule(static) if (nblocks > 1 && N * C > 16384)
    for (ptrdiff_t b = 0; b < nblocks; b++) {
      size_t c0 = (size_t)b * CBLOCK;
      size_t c1 = c0 + CBLOCK < C ? c0 + CBLOCK : C;
      rmsnorm_dweight_any(dweight, dout, inp, rstd, N, C, c0, c1, dt);
    }
  }
  return TS_OK;
}
