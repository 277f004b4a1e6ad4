/*
 * embedding.c — the CPU bodies of the token embedding lookup (forward) and
 * its scatter-add
 * (backward), in the storage dtype of the table.
 *
 * Invariants:
 * - Every token is checked against [0, V) before any output is written.
 * - Backward is deterministic without atomics: threads own disjoint blocks
 *   of channels, and each dwte element receives its additions in position
 *   order n = 0 .. N-1 whatever the thread count.
 * - fp32 adds each dout row straight into dwte (no workspace).
 * - bf16/fp16 follow the mixed-precision rule (read half storage, accumulate
 *   in fp32): all of one call's additions into a dwte row are summed in fp32
 *   in position order, then added to the stored value with ONE rounding,
 *   dwte[v, c] = round(dwte[v, c] + sum). To find each row's positions
 *   without a (V, C) fp32 buffer, the positions are stably sorted by token
 *   (a bottom-up merge sort of N int32 in ctx->workspace, two 64-byte-aligned
 *   buffers of N int32; ts_cpu_embedding_workspace_bytes returns exactly that);
 *   the sorted order is unique, so it does not depend on the thread count.
 */
#include <stdint.h>
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

ts_status ts_cpu_embedding_forward(const ts_kctx *ctx, void *out, const int32_t *tokens,
                                   const void *wte, size_t N, size_t C, size_t V, ts_dtype dt) {
  TS_CHECK(check_tokens(tokens, N, V, "ts_k_embedding_forward"));
  if (C == 0) return TS_OK;
  size_t row = C * ts_dtype_size(dt);
#pragma omp parallel for schedule(static) if (N * C > 65536)
  for (ptrdiff_t n = 0; n < (ptrdiff_t)N; n++)
    memcpy((char *)out + (size_t)n * row, (const char *)wte + (size_t)tokens[n] * row, row);
  return TS_OK;
}

size_t ts_cpu_embedding_workspace_bytes(size_t N, ts_dtype dt) {
  if (dt == TS_FP32) return 0;
  return 2 * ts_align64(N * sizeof(int32_t));
}

/* dwte[tokens[n], c] += dout[n, c] for all n in order, for channels [c0, c1),
 * each addition rounded to dt (called with fp32 only). */
TS_AI void embedding_bwd_block(void *dwte, const void *dout, const int32_t *tokens, size_t N,
                               size_t C, size_t c0, size_t c1, ts_dtype dt) {
  for (size_t n = 0; n < N; n++) {
    size_t drow = (size_t)tokens[n] * C, srow = n * C;
    for (size_t c = c0; c < c1; c++)
      st(dwte, drow + c, dt, ld(dwte, drow + c, dt) + ld(dout, srow + c, dt));
  }
}

/* Merges the sorted runs src[lo, mid) and src[mid, hi) into dst[lo, hi) by
 * token; on equal tokens the left run goes first (stable). */
static void merge_runs(int32_t *dst, const int32_t *src, const int32_t *tokens, size_t lo,
                       size_t mid, size_t hi) {
  size_t i = lo, j = mid, k = lo;
  while (i < mid && j < hi) dst[k++] = tokens[src[j]] < tokens[src[i]] ? src[j++] : src[i++];
  while (i < mid) dst[k++] = src[i++];
  while (j < hi) dst[k++] = src[j++];
}

/* Positions 0..N-1 stably sorted by tokens[n] (equal tokens in position
 * order), using buffers a and b of N int32; returns whichever holds them. */
static const int32_t *sort_positions(int32_t *a, int32_t *b, const int32_t *tokens, size_t N) {
  for (size_t n = 0; n < N; n++) a[n] = (int32_t)n;
  int32_t *src = a, *dst = b;
  for (size_t w = 1; w < N; w *= 2) {
    ptrdiff_t npairs = (ptrdiff_t)((N + 2 * w - 1) / (2 * w));
#pragma omp parallel for schedule(static) if (N > 65536 && npairs > 1)
    for (ptrdiff_t p = 0; p < npairs; p++) {
      size_t lo = (size_t)p * 2 * w;
      size_t mid = lo + w < N ? lo + w : N, hi = lo + 2 * w < N ? lo + 2 * w : N;
      merge_runs(dst, src, tokens, lo, mid, hi);
    }
    int32_t *t = src;
    src = dst;
    dst = t;
  }
  return src;
}

/* bf16/fp16, channels [c0, c1): for each group of equal tokens v in `order`
 * (positions sorted by token), sum dout[n, c] over the group in fp32 in
 * position order, then dwte[v, c] = round(dwte[v, c] + sum) once. */
TS_AI void embedding_bwd_block_half(void *dwte, const void *dout, const int32_t *tokens,
                                    const int32_t *order, size_t N, size_t C, size_t c0,
                                    size_t c1, ts_dtype dt) {
  float acc[CBLOCK];
  size_t w = c1 - c0;
  for (size_t i = 0; i < N;) {
    int32_t v = tokens[order[i]];
    size_t srow = (size_t)order[i] * C + c0;
    for (size_t c = 0; c < w; c++) acc[c] = ld(dout, srow + c, dt);
    for (i++; i < N && tokens[order[i]] == v; i++) {
      srow = (size_t)order[i] * C + c0;
      for (size_t c = 0; c < w; c++) acc[c] += ld(dout, srow + c, dt);
    }
    size_t drow = (size_t)v * C + c0;
    for (size_t c = 0; c < w; c++) st(dwte, drow + c, dt, ld(dwte, drow + c, dt) + acc[c]);
  }
}

ts_status ts_cpu_embedding_backward(const ts_kctx *ctx, void *dwte, const void *dout,
                                    const int32_t *tokens, size_t N, size_t C, size_t V,
                                    ts_dtype dt) {
  static const char op[] = "ts_k_embedding_backward";
  TS_CHECK(check_tokens(tokens, N, V, op));
  if (dt != TS_FP32 && N > (size_t)INT32_MAX)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: N = %zu positions: expected at most %d (int32 sort indices)", op, N,
                        (int)INT32_MAX);
  if (C == 0) return TS_OK;
  ptrdiff_t nblocks = (ptrdiff_t)((C + CBLOCK - 1) / CBLOCK);
  if (dt == TS_FP32) {
#pragma omp parallel for schedule(static) if (nblocks > 1 && N * C > 65536)
    for (ptrdiff_t b = 0; b < nblocks; b++) {
      size_t c0 = (size_t)b * CBLOCK;
      size_t c1 = c0 + CBLOCK < C ? c0 + CBLOCK : C;
      embedding_bwd_block(dwte, dout, tokens, N, C, c0, c1, TS_FP32);
    }
    return TS_OK;
  }
  int32_t *a = ctx->workspace;
  int32_t *b = (int32_t *)((char *)ctx->workspace + ts_align64(N * sizeof(int32_t)));
  const int32_t *order = sort_positions(a, b, tokens, N);
#pragma omp parallel for schedule(static) if (nblocks > 1 && N * C > 65536)
  for (ptrdiff_t k = 0; k < nblocks; k++) {
    size_t c0 = (size_t)k * CBLOCK;
    size_t c1 = c0 + CBLOCK < C ? c0 + CBLOCK : C;
    if (dt == TS_BF16)
      embedding_bwd_block_half(dwte, dout, tokens, order, N, C, c0, c1, TS_BF16);
    else
      embedding_bwd_block_half(dwte, dout, tokens, order, N, C, c0, c1, TS_FP16);
  }
  return TS_OK;
}
