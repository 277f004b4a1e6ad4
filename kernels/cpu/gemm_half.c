/*
 * gemm_half.c — bf16 and fp16 matrix products for CPUs on which oneDNN has
 * no native kernel for the dtype (AVX2 or AVX-512 without AVX512-BF16, or
 * fp16 without AVX512-FP16/AMX-FP16): the operands are widened to fp32
 * while they are packed, summed in fp32 by an FMA micro-kernel of the
 * widest tier within the cap (AVX2 or AVX-512), and each output is rounded
 * once to the dtype. Before this, linear.c widened whole operands
 * into fp32 copies for OpenBLAS's sgemm (which packs them again) and
 * rounded its fp32 output in another pass: three memory-bound passes per
 * product that cost bf16 3-6% against fp32 (kernels/bench_matmul).
 *
 * Method: BLIS's loop nest (Van Zee and van de Geijn, "BLIS: A Framework
 * for Rapidly Instantiating BLAS Functionality", ACM TOMS 41(3), 2015,
 * Fig. 2), inside one output tile: the reduction in blocks of KC; per block
 * a KC x tn panel of op(B) packed in NR-column slivers, then row blocks of
 * MC rows of op(A) packed in MR-row slivers, and an MR x NR micro-tile of
 * fp32 sums per pair of slivers. AVX2: 6 x 16 (12 ymm registers), BLIS's
 * Haswell sgemm shape. AVX-512: 8 x 32 (16 zmm registers), twice as wide
 * and 8 rows, which divide the 256-row tile: 12 rows (24 registers) left
 * a 4-row sliver in every tile and ran 201 GFLOP/s on average against 8
 * rows' 211 (kernels/bench_matmul, a Zen 4, 2 threads).
 *
 * Invariants:
 * - The output is cut into TS_CPU_TILE_M x TS_CPU_TILE_N tiles (tiles.h),
 *   each computed whole by one thread: the bits depend on the shape alone,
 *   never on the thread count.
 * - Each output's sum: per KC block of the reduction, fused multiply-adds
 *   in k order from 0; the blocks' sums added in block order onto the first
 *   (fp32). Both micro-kernels compute each output this way, lane by lane,
 *   so the AVX2 and AVX-512 tiers give the same bits. Then the bias (fp32,
 *   widened) or the output's old value (accumulate) is added, and the
 *   result rounded once (RNE, the casts' rounding: ts_cpu_narrow_at).
 * - Widening: bf16 exactly (the bits shifted up 16); fp16 by F16C, exact
 *   except that a signalling NaN comes back quiet (NaN in, NaN out anyway).
 * - Memory: each thread allocates its packing buffers and the tile's fp32
 *   sums once per call (ts_cpu_gemm_half_thread_bytes, about 0.6 MiB), and
 *   frees them before the call returns; the caller's workspace is not used.
 *   Like OpenBLAS's and oneDNN's own buffers, they are outside the ledger.
 * - Block sizes measured with kernels/bench_matmul under the AVX2 cap (all
 *   llama-small products, 2 threads): KC 256 and MC 96 in 256 x 256 tiles
 *   ran 206 GFLOP/s on average, ahead of KC 128 or 384, MC 144 or 192, and
 *   tiles of 256 x 512 or 512 x 256 (199-203). The AVX-512 micro-kernel
 *   keeps them. On a Zen 4, whose 512-bit FMAs run as two 256-bit halves,
 *   it ran the same products at 211 GFLOP/s on average against the AVX2
 *   one's 203-204 (under ONEDNN_MAX_CPU_ISA=AVX512_CORE and AVX2); on
 *   full-width units it can do twice the FMAs a cycle (not measured: no
 *   such CPU at hand).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm_half.h"

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/tiles.h"

#if TS_CPU_X86
#include <immintrin.h>
#endif

enum {
  MR2 = 6,   /* AVX2: rows of a micro-tile (op(A)'s sliver) */
  NR2 = 16,  /* AVX2: columns of a micro-tile (op(B)'s sliver): two ymm */
  MR5 = 8,   /* AVX-512: rows (8 divide a 256-row tile) */
  NR5 = 32,  /* AVX-512: columns, two zmm */
  KC = 256,  /* reduction block */
  MC = 96,   /* rows of op(A) packed at once (16 or 12 slivers) */
  SLACK = 16, /* floats past op(A)'s rows: pack_lines' 8, rounded up to keep
               * the sums after them 64-byte aligned for zmm stores */
  /* a tile's fp32 sums, rows and columns padded to whole micro-tiles of
   * either tier (the larger padding of the two; NR5 a multiple of NR2) */
  CT_ROWS2 = (TS_CPU_TILE_M + MR2 - 1) / MR2 * MR2,
  CT_ROWS5 = (TS_CPU_TILE_M + MR5 - 1) / MR5 * MR5,
  CT_ROWS = CT_ROWS2 > CT_ROWS5 ? CT_ROWS2 : CT_ROWS5,
  CT_COLS = (TS_CPU_TILE_N + NR5 - 1) / NR5 * NR5,
};

/* zmm loads and stores need 64 bytes: the B slivers (NR5 floats a k),
 * op(A)'s rows before the sums, and the sums' rows */
_Static_assert(NR5 * sizeof(float) % 64 == 0, "gemm_half: B slivers lose 64-byte alignment");
_Static_assert(((size_t)KC * CT_COLS + (size_t)KC * MC + SLACK) * sizeof(float) % 64 == 0,
               "gemm_half: the sums lose 64-byte alignment");
_Static_assert(CT_COLS * sizeof(float) % 64 == 0, "gemm_half: sum rows lose 64-byte alignment");

size_t ts_cpu_gemm_half_thread_bytes(void) {
  return ((size_t)KC * CT_COLS + (size_t)KC * MC + SLACK + (size_t)CT_ROWS * CT_COLS) *
         sizeof(float);
}

#if TS_CPU_X86

int ts_cpu_gemm_half_ok(ts_dtype dt) {
  if (dt != TS_BF16 && dt != TS_FP16) return 0;
  __builtin_cpu_init();
  /* ts_cpu_f16c: F16C and AVX2; ts_cpu_isa: AVX2 within oneDNN's cap */
  return ts_cpu_isa >= 1 && ts_cpu_f16c && __builtin_cpu_supports("fma");
}

#define TS_TARGET_GEMM __attribute__((target("avx2,fma,f16c")))
#define TS_TARGET_GEMM512 __attribute__((target("avx512f,avx2,fma,f16c")))

/* 8 consecutive elements of dtype dt (bf16 or fp16) at p, widened; the
 * scalar edges use cpu_common.h's ld(). */
TS_TARGET_GEMM static inline __m256 load8(const uint16_t *p, ts_dtype dt) {
  __m128i h = _mm_loadu_si128((const __m128i *)p);
  return dt == TS_FP16 ? _mm256_cvtph_ps(h)
                       : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* r[q] (q < 8) becomes column q of the 8 x 8 matrix whose rows were r[]. */
TS_TARGET_GEMM static inline void transpose8(__m256 r[8]) {
  __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* Packs `rows` (<= S, S = 6, 8, 16 or 32) lines of a reduction block, line
 * r reading x[r stride + k] for k < kc, as dst[k S + r] (zeros for r >=
 * rows): op(A) not transposed (S = MR) and op(B) transposed (S = NR). dst
 * has 8 floats of slack past k S + S (the 6-row case stores 8 at a time). */
TS_TARGET_GEMM static void pack_lines(float *dst, const uint16_t *x, size_t stride, size_t rows,
                                      size_t kc, size_t S, ts_dtype dt) {
  size_t k = 0;
  if (rows == S) {
    for (; k + 8 <= kc; k += 8)
      for (size_t r0 = 0; r0 < S; r0 += 8) { /* 8 lines (6: two zero lines) at a time */
        __m256 r[8];
        for (size_t q = 0; q < 8; q++)
          r[q] = r0 + q < S ? load8(x + (r0 + q) * stride + k, dt) : _mm256_setzero_ps();
        transpose8(r);
        for (size_t q = 0; q < 8; q++) /* ascending: each store's tail is overwritten next */
          _mm256_storeu_ps(dst + (k + q) * S + r0, r[q]);
      }
  }
  for (; k < kc; k++)
    for (size_t r = 0; r < S; r++) dst[k * S + r] = r < rows ? ld(x, r * stride + k, dt) : 0.0f;
}

/* Packs `cols` (<= S) consecutive elements of each of kc rows, row k at
 * x + k stride, as dst[k S + c] (zeros for c >= cols): op(B) not transposed
 * (S = NR) and op(A) transposed (S = MR). avail: elements from x to the
 * end of its row in memory, so that the 8-wide loads of the 6-row case stay
 * inside the matrix. */
TS_TARGET_GEMM static void pack_rows(float *dst, const uint16_t *x, size_t stride, size_t cols,
                                     size_t kc, size_t S, size_t avail, ts_dtype dt) {
  if (cols == S && avail >= (S + 7) / 8 * 8) {
    for (size_t k = 0; k < kc; k++)
      for (size_t c = 0; c < S; c += 8) /* 6: the next row's store overwrites the tail */
        _mm256_storeu_ps(dst + k * S + c, load8(x + k * stride + c, dt));
    return;
  }
  for (size_t k = 0; k < kc; k++)
    for (size_t c = 0; c < S; c++) dst[k * S + c] = c < cols ? ld(x, k * stride + c, dt) : 0.0f;
}

/* Defines the micro-tile NAME of one tier: c (row stride ldc) = (first ? 0
 * : c) + the sums over k < kc of a[k MR + i] b[k NR + j], by fused
 * multiply-adds in k order, in 2 MR registers of type V (NR / 2 floats);
 * ZERO, LOAD, BCAST, FMA, ADD and STORE the tier's intrinsics. Every loop
 * over i unrolled whole, so the sums stay in registers. */
#define TS_MICRO_TILE(NAME, TARGET, MR, NR, V, ZERO, LOAD, BCAST, FMA, ADD, STORE)         \
  TARGET static void NAME(size_t kc, const float *a, const float *b, float *c, size_t ldc,   \
                          int first) {                                                       \
    V s[MR][2];                                                                              \
    _Pragma("GCC unroll 12") for (int i = 0; i < MR; i++) s[i][0] = s[i][1] = ZERO();       \
    _Pragma("GCC unroll 4") for (size_t k = 0; k < kc; k++) {                               \
      V b0 = LOAD(b + k * NR), b1 = LOAD(b + k * NR + NR / 2);                               \
      _Pragma("GCC unroll 12") for (int i = 0; i < MR; i++) {                               \
        V x = BCAST(a + k * MR + i);                                                         \
        s[i][0] = FMA(x, b0, s[i][0]);                                                       \
        s[i][1] = FMA(x, b1, s[i][1]);                                                       \
      }                                                                                      \
    }                                                                                        \
    _Pragma("GCC unroll 12") for (int i = 0; i < MR; i++) {                                 \
      float *p = c + i * ldc;                                                                \
      STORE(p, first ? s[i][0] : ADD(LOAD(p), s[i][0]));                                     \
      STORE(p + NR / 2, first ? s[i][1] : ADD(LOAD(p + NR / 2), s[i][1]));                   \
    }                                                                                        \
  }

/* AVX2: 6 x 16 in 12 ymm registers. */
TS_MICRO_TILE(micro_tile2, TS_TARGET_GEMM, MR2, NR2, __m256, _mm256_setzero_ps, _mm256_load_ps,
              _mm256_broadcast_ss, _mm256_fmadd_ps, _mm256_add_ps, _mm256_store_ps)

/* AVX-512: 8 x 32 in 16 zmm registers; the same sums, in the same order
 * per output, 16 lanes at a time. */
static inline __attribute__((always_inline, target("avx512f"))) __m512 bcast16(const float *x) {
  return _mm512_set1_ps(*x);
}
TS_MICRO_TILE(micro_tile5, TS_TARGET_GEMM512, MR5, NR5, __m512, _mm512_setzero_ps, _mm512_load_ps,
              bcast16, _mm512_fmadd_ps, _mm512_add_ps, _mm512_store_ps)

/* A tier's micro-tile: its shape, its kernel and its name. */
typedef struct {
  size_t mr, nr;
  void (*micro)(size_t kc, const float *a, const float *b, float *c, size_t ldc, int first);
  const char *name;
} tier;

/* The widest tier within the cap now (ts_cpu_isa, which tests lower). */
static tier tier_here(void) {
  return ts_cpu_isa >= 2 ? (tier){MR5, NR5, micro_tile5, "tessera avx512 gemm"}
                         : (tier){MR2, NR2, micro_tile2, "tessera avx2 gemm"};
}

const char *ts_cpu_gemm_half_name(void) { return tier_here().name; }

/* One thread's buffers: op(B)'s block, op(A)'s rows, the tile's sums. */
typedef struct {
  float *b, *a, *sums;
} bufs;

/* The operands of one product (see ts_cpu_gemm_half). */
typedef struct {
  int ta, tb;
  size_t M, N, K, lda, ldb, ldc;
  const uint16_t *A, *B;
  const void *bias;
  int accumulate;
  void *C;
  ts_dtype dt;
  tier t;
} gemm_args;

/* Tile x of the product into the fp32 sums w->sums (CT_COLS per row), then
 * (bias or old value added) rounded into C. */
TS_TARGET_GEMM static void tile(const gemm_args *g, const ts_cpu_tile *x, const bufs *w) {
  size_t m = x->m, n = x->n, MR = g->t.mr, NR = g->t.nr;
  const uint16_t *A = g->A + x->a, *B = g->B + x->b;
  for (size_t k0 = 0; k0 < g->K; k0 += KC) {
    size_t kc = g->K - k0 < KC ? g->K - k0 : KC;
    for (size_t j = 0; j < n; j += NR) { /* op(B)'s block: kc x n in slivers of NR */
      size_t cols = n - j < NR ? n - j : NR;
      float *dst = w->b + j * kc;
      if (g->tb)
        pack_lines(dst, B + j * g->ldb + k0, g->ldb, cols, kc, NR, g->dt);
      else
        pack_rows(dst, B + k0 * g->ldb + j, g->ldb, cols, kc, NR, g->ldb - (x->j0 + j), g->dt);
    }
    for (size_t i0 = 0; i0 < m; i0 += MC) {
      size_t mc = m - i0 < MC ? m - i0 : MC;
      for (size_t i = 0; i < mc; i += MR) { /* op(A)'s rows: mc x kc in slivers of MR */
        size_t rows = mc - i < MR ? mc - i : MR;
        float *dst = w->a + i * kc;
        if (g->ta)
          pack_rows(dst, A + k0 * g->lda + i0 + i, g->lda, rows, kc, MR,
                    g->lda - (x->i0 + i0 + i), g->dt);
        else
          pack_lines(dst, A + (i0 + i) * g->lda + k0, g->lda, rows, kc, MR, g->dt);
      }
      for (size_t j = 0; j < n; j += NR)
        for (size_t i = 0; i < mc; i += MR)
          g->t.micro(kc, w->a + i * kc, w->b + j * kc, w->sums + (i0 + i) * CT_COLS + j, CT_COLS,
                     k0 == 0);
    }
  }
  if (g->K == 0)
    for (size_t i = 0; i < m; i++) memset(w->sums + i * CT_COLS, 0, n * sizeof(float));
  float add[TS_CPU_TILE_N];
  if (g->bias) ts_cpu_widen_at(add, g->bias, x->j0, n, g->dt);
  for (size_t i = 0; i < m; i++) {
    float *s = w->sums + i * CT_COLS;
    size_t at = x->c + i * g->ldc;
    if (g->accumulate) ts_cpu_widen_at(add, g->C, at, n, g->dt);
    if (g->bias || g->accumulate)
      for (size_t j = 0; j < n; j++) s[j] += add[j];
    ts_cpu_narrow_at(g->C, at, s, n, g->dt);
  }
}

ts_status ts_cpu_gemm_half(int trans_a, int trans_b, size_t M, size_t N, size_t K, const void *A,
                           size_t lda, const void *B, size_t ldb, const void *bias, int accumulate,
                           void *C, size_t ldc, ts_dtype dt) {
  if (!ts_cpu_gemm_half_ok(dt))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "ts_cpu_gemm_half: %s products need bf16 or fp16 and a CPU with AVX2, FMA "
                        "and F16C within the instruction-set cap",
                        ts_dtype_name(dt));
  if (M == 0 || N == 0) return TS_OK;
  gemm_args g = {trans_a, trans_b, M, N, K, lda, ldb, ldc, A, B, bias, accumulate, C, dt,
                 tier_here()};
  ts_cpu_tiling t = ts_cpu_tiling_of(M, N, TS_CPU_TILE_M, TS_CPU_TILE_N);
  ptrdiff_t tiles = (ptrdiff_t)(t.rows * t.cols);
  int failed = 0;
#pragma omp parallel
  {
    float *mem = aligned_alloc(64, ts_align64(ts_cpu_gemm_half_thread_bytes()));
    if (!mem) {
#pragma omp atomic write
      failed = 1;
    }
    float *a = mem ? mem + (size_t)KC * CT_COLS : NULL;
    bufs w = {mem, a, a ? a + (size_t)KC * MC + SLACK : NULL};
#pragma omp barrier /* every thread's buffers, or no output written at all */
    int bad;
#pragma omp atomic read
    bad = failed;
    if (!bad) {
#pragma omp for schedule(static)
      for (ptrdiff_t i = 0; i < tiles; i++) {
        ts_cpu_tile x = ts_cpu_tile_at(&t, (size_t)i, trans_a, trans_b, lda, ldb, ldc);
        tile(&g, &x, &w);
      }
    }
    free(mem);
  }
  if (failed)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY,
                        "ts_cpu_gemm_half: %zu bytes of packing buffers per thread: out of "
                        "memory (C untouched)",
                        ts_cpu_gemm_half_thread_bytes());
  return TS_OK;
}

#else /* not x86: the fp32 copies in linear.c */

int ts_cpu_gemm_half_ok(ts_dtype dt) {
  (void)dt;
  return 0;
}

ts_status ts_cpu_gemm_half(int trans_a, int trans_b, size_t M, size_t N, size_t K, const void *A,
                           size_t lda, const void *B, size_t ldb, const void *bias, int accumulate,
                           void *C, size_t ldc, ts_dtype dt) {
  (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb;
  (void)bias, (void)accumulate, (void)C, (void)ldc;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "ts_cpu_gemm_half: %s: not on this CPU",
                      ts_dtype_name(dt));
}

const char *ts_cpu_gemm_half_name(void) { return "tessera avx2 gemm"; }

#endif
