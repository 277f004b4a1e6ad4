/*
 * tiles.h — the output tile of the CPU backend's matrix products
 * (sgemm.c, dnnl_matmul.cc): each product's output is cut into tiles of
 * TS_CPU_TILE_M rows by TS_CPU_TILE_N columns (edges smaller), each
 * computed whole (the full reduction) by one thread, so the bits depend on
 * the shape alone, never on the thread count. Private to the CPU backend.
 */
#ifndef TS_KERNELS_CPU_TILES_H
#define TS_KERNELS_CPU_TILES_H

#include <stddef.h>

enum { TS_CPU_TILE_M = 256, TS_CPU_TILE_N = 256 };

/* An (M, N) output cut into tiles of tm rows by tn columns (edges smaller):
 * rows x cols tiles, numbered row by row. */
typedef struct ts_cpu_tiling {
  size_t M, N, tm, tn, rows, cols;
} ts_cpu_tiling;

static inline ts_cpu_tiling ts_cpu_tiling_of(size_t M, size_t N, size_t tm, size_t tn) {
  ts_cpu_tiling g = {M, N, tm, tn, (M + tm - 1) / tm, (N + tn - 1) / tn};
  return g;
}

/* Tile t of g (t < rows cols): origin (i0, j0), size (m, n), and the element
 * offsets of its operands in C (M, N) = op(A) op(B), every matrix
 * row-major: A is (M, K) with leading dimension lda, or (K, M) when
 * trans_a; B is (K, N) with ldb, or (N, K) when trans_b; C has ldc. */
typedef struct ts_cpu_tile {
  size_t i0, j0, m, n, a, b, c;
} ts_cpu_tile;

static inline ts_cpu_tile ts_cpu_tile_at(const ts_cpu_tiling *g, size_t t, int trans_a, int trans_b,
                                         size_t lda, size_t ldb, size_t ldc) {
  ts_cpu_tile x;
  x.i0 = t / g->cols * g->tm;
  x.j0 = t % g->cols * g->tn;
  x.m = g->M - x.i0 < g->tm ? g->M - x.i0 : g->tm;
  x.n = g->N - x.j0 < g->tn ? g->N - x.j0 : g->tn;
  x.a = trans_a ? x.i0 : x.i0 * lda;
  x.b = trans_b ? x.j0 * ldb : x.j0;
  x.c = x.i0 * ldc + x.j0;
  return x;
}

#endif /* TS_KERNELS_CPU_TILES_H */
