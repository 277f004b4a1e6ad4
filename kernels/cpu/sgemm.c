/*
 * sgemm.c — fp32 matrix products whose bits do not depend on the thread
 * count: the output is cut into tiles of a fixed size (tiles.h), and each tile is one
 * single-threaded OpenBLAS sgemm over the whole reduction. OpenMP hands
 * the tiles to threads; which thread computes a tile changes no bit, since
 * the tile's shape and position (and so OpenBLAS's blocking, kernel and
 * each dot product's order inside the tile) are fixed by M, N and K alone.
 *
 * Invariants:
 * - Every sgemm call here runs inside an OpenMP parallel region (the OpenMP
 *   build of OpenBLAS then computes it on the calling thread alone) or, with
 *   one OpenMP thread, runs where OpenBLAS's own thread count is that one
 *   thread: either way one thread per tile.
 * - No K split: each output element's sum is computed whole, in one call.
 */
#include <cblas.h>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/tiles.h"

void ts_cpu_sgemm(int trans_a, int trans_b, size_t M, size_t N, size_t K, const float *A,
                  size_t lda, const float *B, size_t ldb, float beta, float *C, size_t ldc) {
  ts_cpu_tiling g = ts_cpu_tiling_of(M, N, TS_CPU_TILE_M, TS_CPU_TILE_N);
  ptrdiff_t tiles = (ptrdiff_t)(g.rows * g.cols);
#pragma omp parallel for schedule(static)
  for (ptrdiff_t t = 0; t < tiles; t++) {
    ts_cpu_tile x = ts_cpu_tile_at(&g, (size_t)t, trans_a, trans_b, lda, ldb, ldc);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)x.m, (int)x.n, (int)K, 1.0f, A + x.a,
                (int)lda, B + x.b, (int)ldb, beta, C + x.c, (int)ldc);
  }
}
