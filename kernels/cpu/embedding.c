/*
 * embedding.c — token embedding lookup (forward) and its scatter-add
 * (backward), in the storage dtype of the table.
 *
 * Invariants:
 * - Every token is checked against [0, V) before any output is written.
 * - Backward is deterministic without atomics: threads own disjoint blocks
 *   of channels and walk the positions n = 0 .. N-1 in order, so each
 *   dwte element receives its additions in position order whatever the
 *   thread count. With bf16/fp16 storage each addition is rounded to the
 *   storage dtype (as torch's index_add_ on a half tensor does); there is no
 *   fp32 scratch.
 */
#include <string.h>

#include "kernels/cpu/cpu_common.h"

enum { CBLOCK = 64 }; /* channels per backward work item (4 cache lines in fp32) */

/* Returns TS_ERR_INVALID_ARGUMENT naming the first token outside [0, V). */
static ts_status check_tokens(const int32_t *tokens, size_t N, size_t V, const char *op) {
  for (size_t n = 0; n < N; n++) {
    if (tokens[n] < 0 || (size_t)tokens[n] >= V)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "%s: tokens[%zu] = %d is outside the vocabulary [0, %zu)", op, n,
                          (int)tokens[n], V);
  }
  return TS_OK;
}

ts_status ts_k_embedding_forward(const ts_kctx *ctx, void *out, const int32_t *tokens,
                                 const void *wte, size_t N, size_t C, size_t V, ts_dtype dt) {
  static const char op[] = "ts_k_embedding_forward";
  TS_CPU_ONLY(ctx, op);
  TS_CHECK_DTYPE(dt, op);
  if (N == 0) return TS_OK;
  TS_CHECK_PTR(tokens, op);
  TS_CHECK(check_tokens(tokens, N, V, op));
  if (C == 0) return TS_OK;
  TS_CHECK_PTR(out, op);
  TS_CHECK_PTR(wte, op);
  size_t row = C * ts_dtype_size(dt);
#pragma omp parallel for schedule(static) if (N * C > 65536)
  for (ptrdiff_t n = 0; n < (ptrdiff_t)N; n++)
    memcpy((char *)out + (size_t)n * row, (const char *)wte + (size_t)tokens[n] * row, row);
  return TS_OK;
}

/* dwte[tokens[n], c] += dout[n, c] for all n, for channels [c0, c1). */
TS_AI void embedding_bwd_block(void *dwte, const void *dout, const int32_t *tokens, size_t N,
                               size_t C, size_t c0, size_t c1, ts_dtype dt) {
  for (size_t n = 0; n < N; n++) {
    size_t drow = (size_t)tokens[n] * C, srow = n * C;
    for (size_t c = c0; c < c1; c++)
      st(dwte, drow + c, dt, ld(dwte, drow + c, dt) + ld(dout, srow + c, dt));
  }
}

ts_status ts_k_embedding_backward(const ts_kctx *ctx, void *dwte, const void *dout,
                                  const int32_t *tokens, size_t N, size_t C, size_t V,
                                  ts_dtype dt) {
  static const char op[] = "ts_k_embedding_backward";
  TS_CPU_ONLY(ctx, op);
  TS_CHECK_DTYPE(dt, op);
  if (N == 0) return TS_OK;
  TS_CHECK_PTR(tokens, op);
  TS_CHECK(check_tokens(tokens, N, V, op));
  if (C == 0) return TS_OK;
  TS_CHECK_PTR(dwte, op);
  TS_CHECK_PTR(dout, op);
  ptrdiff_t nblocks = (ptrdiff_t)((C + CBLOCK - 1) / CBLOCK);
#pragma omp parallel for schedule(static) if (nblocks > 1 && N * C > 65536)
  for (ptrdiff_t b = 0; b < nblocks; b++) {
    size_t c0 = (size_t)b * CBLOCK;
    size_t c1 = c0 + CBLOCK < C ? c0 + CBLOCK : C;
    TS_DT_CALL(dt, embedding_bwd_block, dwte, dout, tokens, N, C, c0, c1);
  }
  return TS_OK;
}
