/*
 * fp8.c — the CPU bodies of the fp8 ops (kernels/kernels.h, "fp8 linear
 * layer"): the reference the GPU's fp8 path is held to.
 *
 * Invariants:
 * - Casts are kernels/fp8.h's, element by element: the codes and scales
 *   are the GPU's bit for bit. An operand's absolute maximum is the largest
 *   of its elements' |x| bit patterns as unsigned integers, exact in any
 *   order, and a NaN (whose pattern is above infinity's) wins, as on the
 *   GPU's integer atomicMax.
 * - A product decodes both cast operands to fp32 (exact) and runs the
 *   fixed-tile fp32 sgemm (ts_cpu_sgemm): every product of two codes is
 *   exact in fp32, so only the summation order separates this from the
 *   GPU's fp32 accumulation, and the bits do not depend on the thread
 *   count. The sum is multiplied by the A row's inverse scale, then the B
 *   row's, (plus the old value for dweight), then rounded once to bf16.
 * - Workspace (ts_cpu_linear_fp8_workspace_bytes): the codes of both
 *   operands, their inverse scales, their fp32 values and the fp32 product,
 *   each 64-byte aligned, sized for the largest of the three products.
 */
#include <string.h>

#include "kernels/cpu/cpu_common.h"

/* The workspace's parts, in fp8_ws's order (bytes, each 64-byte aligned):
 * codes of A and B, their inverse scales, their fp32 values, the product;
 * each sized for the largest of the three products. */
enum { PARTS = 7 };
static void part_sizes(size_t M, size_t N, size_t K, size_t sz[PARTS]) {
  size_t a = M * (K > N ? K : N), b = K * (N > M ? N : M);
  size_t d = M * N > M * K ? M * N : M * K;
  if (N * K > d) d = N * K;
  size_t sa = M > N ? M : N, sb = N > K ? N : K;
  const size_t bytes[PARTS] = {a, b, sa * 4, sb * 4, a * 4, b * 4, d * 4};
  for (int i = 0; i < PARTS; i++) sz[i] = ts_align64(bytes[i]);
}

size_t ts_cpu_linear_fp8_workspace_bytes(size_t M, size_t N, size_t K, ts_fp8_scaling scaling) {
  (void)scaling;
  size_t sz[PARTS], total = 0;
  part_sizes(M, N, K, sz);
  for (int i = 0; i < PARTS; i++) total += sz[i];
  return total;
}

/* The largest |x| of row r of the (rows, cols) view of inp (transposed:
 * column r of inp (cols, rows)), as fp32 bits of the absolute values. */
static uint32_t amax_bits(const void *inp, size_t r, size_t rows, size_t cols, int transpose,
                          ts_dtype dt) {
  (void)rows;
  uint32_t mx = 0;
  for (size_t c = 0; c < cols; c++) {
    size_t i = transpose ? c * rows + r : r * cols + c;
    uint32_t u = ts_f32_bits(ld(inp, i, dt)) & 0x7fffffffu;
    if (u > mx) mx = u;
  }
  return mx;
}

ts_status ts_cpu_fp8_quantize(const ts_kctx *ctx, uint8_t *out, float *scale_inv, const void *inp,
                              size_t R, size_t C, int transpose, ts_fp8_format fmt,
                              ts_fp8_scaling scaling, ts_dtype dt) {
  (void)ctx;
  size_t rows = transpose ? C : R, cols = transpose ? R : C; /* out (rows, cols) */
  int pow2 = scaling == TS_FP8_ROWWISE;
  float tensor_scale = 0.0f;
  if (scaling == TS_FP8_TENSORWISE) {
    uint32_t mx = 0;
#pragma omp parallel for reduction(max : mx) schedule(static)
    for (size_t r = 0; r < R; r++) {
      uint32_t m = amax_bits(inp, r, R, C, 0, dt);
      if (m > mx) mx = m;
    }
    tensor_scale = ts_fp8_scale(ts_bits_f32(mx), fmt, pow2);
    scale_inv[0] = ts_fp8_scale_inv(tensor_scale);
  }
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < rows; r++) {
    float s = tensor_scale;
    if (scaling == TS_FP8_ROWWISE) {
      s = ts_fp8_scale(ts_bits_f32(amax_bits(inp, r, rows, cols, transpose, dt)), fmt, pow2);
      scale_inv[r] = ts_fp8_scale_inv(s);
    }
    for (size_t c = 0; c < cols; c++) {
      size_t i = transpose ? c * rows + r : r * cols + c;
      out[r * cols + c] = ts_fp8_cast(ld(inp, i, dt), s, fmt);
    }
  }
  return TS_OK;
}

/* The workspace's parts: codes a8, b8; inverse scales sa, sb; fp32 a32,
 * b32 and the product d32. */
typedef struct {
  uint8_t *a8, *b8;
  float *sa, *sb, *a32, *b32, *d32;
} fp8_ws;

static fp8_ws carve(const ts_kctx *ctx, size_t M, size_t N, size_t K) {
  size_t sz[PARTS];
  part_sizes(M, N, K, sz);
  fp8_ws w;
  char *p = (char *)ctx->workspace;
  w.a8 = (uint8_t *)p, p += sz[0];
  w.b8 = (uint8_t *)p, p += sz[1];
  w.sa = (float *)p, p += sz[2];
  w.sb = (float *)p, p += sz[3];
  w.a32 = (float *)p, p += sz[4];
  w.b32 = (float *)p, p += sz[5];
  w.d32 = (float *)p;
  return w;
}

static void decode(float *dst, const uint8_t *src, size_t n, ts_fp8_format fmt) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) dst[i] = ts_fp8_to_f32(src[i], fmt);
}

/* out (P, S) (=, or += when accumulate) = (A (P, Q) @ B (S, Q)^T) scaled by
 * sa[p] then sb[s] (one scale each when tensorwise), from w's codes: the
 * one product of all three passes. */
static void product(void *out, int accumulate, const fp8_ws *w, ts_fp8_format fa,
                    ts_fp8_format fb, size_t P, size_t S, size_t Q, ts_fp8_scaling scaling) {
  decode(w->a32, w->a8, P * Q, fa);
  decode(w->b32, w->b8, S * Q, fb);
  ts_cpu_sgemm(0, 1, P, S, Q, w->a32, Q, w->b32, Q, 0.0f, w->d32, S);
  int rowwise = scaling == TS_FP8_ROWWISE;
#pragma omp parallel for schedule(static)
  for (size_t p = 0; p < P; p++)
    for (size_t s = 0; s < S; s++) {
      size_t i = p * S + s;
      float v = ts_fmul(ts_fmul(w->d32[i], w->sa[rowwise ? p : 0]), w->sb[rowwise ? s : 0]);
      if (accumulate) v = ts_fadd(v, ld(out, i, TS_BF16));
      st(out, i, TS_BF16, v);
    }
}

ts_status ts_cpu_linear_fp8_forward(const ts_kctx *ctx, void *out, const void *inp,
                                    const void *weight, size_t M, size_t N, size_t K,
                                    ts_fp8_scaling scaling, ts_dtype dt) {
  fp8_ws w = carve(ctx, M, N, K);
  TS_CHECK(ts_cpu_fp8_quantize(ctx, w.a8, w.sa, inp, M, K, 0, TS_FP8_E4M3, scaling, dt));
  TS_CHECK(ts_cpu_fp8_quantize(ctx, w.b8, w.sb, weight, N, K, 0, TS_FP8_E4M3, scaling, dt));
  product(out, 0, &w, TS_FP8_E4M3, TS_FP8_E4M3, M, N, K, scaling);
  return TS_OK;
}

ts_status ts_cpu_linear_fp8_backward(const ts_kctx *ctx, void *dinp, void *dweight,
                                     const void *dout, const void *inp, const void *weight,
                                     size_t M, size_t N, size_t K, ts_fp8_scaling scaling,
                                     ts_dtype dt) {
  fp8_ws w = carve(ctx, M, N, K);
  if (dinp) { /* (M, K) = dout (M, N) @ (W^T (K, N))^T */
    TS_CHECK(ts_cpu_fp8_quantize(ctx, w.a8, w.sa, dout, M, N, 0, TS_FP8_E5M2, scaling, dt));
    TS_CHECK(ts_cpu_fp8_quantize(ctx, w.b8, w.sb, weight, N, K, 1, TS_FP8_E4M3, scaling, dt));
    product(dinp, 0, &w, TS_FP8_E5M2, TS_FP8_E4M3, M, K, N, scaling);
  }
  if (dweight) { /* (N, K) += dout^T (N, M) @ (inp^T (K, M))^T */
    TS_CHECK(ts_cpu_fp8_quantize(ctx, w.a8, w.sa, dout, M, N, 1, TS_FP8_E5M2, scaling, dt));
    TS_CHECK(ts_cpu_fp8_quantize(ctx, w.b8, w.sb, inp, M, K, 1, TS_FP8_E4M3, scaling, dt));
    product(dweight, 1, &w, TS_FP8_E5M2, TS_FP8_E4M3, N, K, M, scaling);
  }
  return TS_OK;
}
