/*
 * rope.c — the CPU body of rotary position embedding (Su et al. 2021,
 * eq. 34) in Hugging Face's rotate-half layout: channel i pairs with
 * channel i + HS/2.
 *
 * Angles follow LlamaRotaryEmbedding step by step in fp32:
 *   inv_freq[i] = 1 / theta^((2i) / HS)   (fp32 division, powf, fp32 1/x)
 *   a = (float)t * inv_freq[i];  cos a, sin a in fp32.
 * (HF then casts cos/sin to the activation dtype before multiplying; here
 * the rotation is computed in fp32 and rounded to storage once.)
 *
 * Invariants: positions are pos0 + t, t = 0 .. T-1, in every batch row
 * (pos0 = 0 but for ts_k_rope_forward_at, whose angles are therefore the
 * training op's at the same positions, bit for bit); each (b, t)
 * row is independent, so results do not depend on the thread count; in
 * place is allowed because each pair is read before it is written. The
 * work is split by position: one item computes position t's angles once
 * and rotates the B rows (b, t) with them.
 */
#include <math.h>

#include "kernels/cpu/cpu_common.h"

enum { MAX_HALF = 1024 }; /* HS/2 limit of the per-row angle table */

/* Rotates the H heads of row (b, t): sign = +1 forward (R), -1 backward (R^T). */
TS_AI void rope_row(void *out, const void *x, size_t H, size_t HS, size_t row, const float *cs,
                    const float *sn, float sign, ts_dtype dt) {
  size_t half = HS / 2;
  for (size_t h = 0; h < H; h++) {
    size_t o = (row * H + h) * HS;
#pragma omp simd
    for (size_t i = 0; i < half; i++) {
      float x1 = ld(x, o + i, dt), x2 = ld(x, o + i + half, dt);
      float c = cs[i], s = sign * sn[i];
      st(out, o + i, dt, x1 * c - x2 * s);
      st(out, o + i + half, dt, x2 * c + x1 * s);
    }
  }
}

/* Rotates rows (b, t), b < B, with position t's angles. */
TS_AI void rope_rows_body(void *out, const void *x, size_t B, size_t T, size_t t, size_t H,
                          size_t HS, const float *cs, const float *sn, float sign, ts_dtype dt) {
  for (size_t b = 0; b < B; b++) TS_DT_CALL(dt, rope_row, out, x, H, HS, b * T + t, cs, sn, sign);
}
TS_CPU_CLONES(rope_rows,
              (void *out, const void *x, size_t B, size_t T, size_t t, size_t H, size_t HS,
               const float *cs, const float *sn, float sign, ts_dtype dt),
              (out, x, B, T, t, H, HS, cs, sn, sign, dt))

/* Rotates every row; the front has checked HS even and at most 2 * MAX_HALF. */
static ts_status rope_apply(void *out, const void *x, size_t B, size_t T, size_t pos0, size_t H,
                            size_t HS, float theta, float sign, ts_dtype dt) {
  TS_ASSERT(HS % 2 == 0 && HS / 2 <= MAX_HALF);
  size_t half = HS / 2;
  float inv_freq[MAX_HALF];
  for (size_t i = 0; i < half; i++) inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)HS);
#pragma omp parallel for schedule(static) if (B * T * H * HS > 16384)
  for (ptrdiff_t t = 0; t < (ptrdiff_t)T; t++) {
    float cs[MAX_HALF], sn[MAX_HALF];
    for (size_t i = 0; i < half; i++) {
      float a = (float)(pos0 + (size_t)t) * inv_freq[i];
      cs[i] = cosf(a);
      sn[i] = sinf(a);
    }
    rope_rows(out, x, B, T, (size_t)t, H, HS, cs, sn, sign, dt);
  }
  return TS_OK;
}

ts_status ts_cpu_rope_forward(const ts_kctx *ctx, void *out, const void *x, size_t B, size_t T,
                              size_t H, size_t HS, float theta, ts_dtype dt) {
  return rope_apply(out, x, B, T, 0, H, HS, theta, 1.0f, dt);
}

ts_status ts_cpu_rope_backward(const ts_kctx *ctx, void *dx, const void *dout, size_t B,
                               size_t T, size_t H, size_t HS, float theta, ts_dtype dt) {
  return rope_apply(dx, dout, B, T, 0, H, HS, theta, -1.0f, dt);
}

ts_status ts_cpu_rope_forward_at(const ts_kctx *ctx, void *out, const void *x, size_t T,
                                 size_t pos0, size_t H, size_t HS, float theta, ts_dtype dt) {
  return rope_apply(out, x, 1, T, pos0, H, HS, theta, 1.0f, dt);
}
