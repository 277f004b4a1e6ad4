/*
 * adamw.c — the CPU body of ts_k_adamw: the AdamW optimizer step
 * (Loshchilov & Hutter 2019, Algorithm 2;
 * torch.optim.AdamW's single-tensor path) on fp32 master weights and
 * moments, with an optional rounded copy into the compute parameters.
 *
 * Invariants: the per-element math is ts_adamw_element of
 * kernels/elementwise.h, which the CUDA kernel shares, so CPU and CUDA give
 * the same bits; elements are independent, so results do not depend on the
 * thread count. The AVX2 and AVX-512 bodies (chosen at load time:
 * ts_cpu_adamw_isa, the faster this CPU has) run the same operations in the
 * same order, 8 or 16 elements at once: each is one IEEE-rounded
 * multiply, add, subtract, divide or square root (no fused multiply-add:
 * the intrinsics name each), so they give the scalar body's bits for every
 * input (kernels_adamw_test compares them); bf16 is widened and narrowed
 * with the integer steps of base/floats.h, fp16 through ld()/st().
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/cpu_common.h"

#if TS_CPU_X86
#include <immintrin.h>
#endif

/* Elements [lo, hi): update master/m/v; store param_out (PDT) if non-NULL. */
TS_AI void adamw_range(float *master, void *param_out, float *m, float *v, const void *grad,
                       size_t lo, size_t hi, ts_adamw_coeffs c, ts_dtype gdt, ts_dtype pdt) {
  for (size_t i = lo; i < hi; i++) {
    float p = ts_adamw_element(master[i], ld(grad, i, gdt), &m[i], &v[i], c);
    master[i] = p;
    if (param_out) st(param_out, i, pdt, p);
  }
}

int ts_cpu_adamw_isa = 0, ts_cpu_adamw_isa_max = 0;

#if TS_CPU_X86

/* The eight lanes of ts_adamw_element, in its order. */
TS_TARGET_AVX2 static inline __m256 adamw8(__m256 p, __m256 g, float *m, float *v,
                                           ts_adamw_coeffs c) {
  __m256 one_b1 = _mm256_set1_ps(ts_fsub(1.0f, c.beta1));
  __m256 one_b2 = _mm256_set1_ps(ts_fsub(1.0f, c.beta2));
  __m256 mo = _mm256_loadu_ps(m), vo = _mm256_loadu_ps(v);
  g = _mm256_mul_ps(_mm256_set1_ps(c.grad_scale), g);
  __m256 mi = _mm256_add_ps(mo, _mm256_mul_ps(one_b1, _mm256_sub_ps(g, mo)));
  __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(c.beta2), vo),
                            _mm256_mul_ps(_mm256_mul_ps(one_b2, g), g));
  __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), _mm256_set1_ps(c.bc2_sqrt)),
                               _mm256_set1_ps(c.eps));
  p = _mm256_mul_ps(p, _mm256_set1_ps(c.decay));
  p = _mm256_sub_ps(p, _mm256_mul_ps(_mm256_set1_ps(c.step_size), _mm256_div_ps(mi, denom)));
  _mm256_storeu_ps(m, mi);
  _mm256_storeu_ps(v, vi);
  return p;
}

/* ts_f32_to_bf16 of eight lanes, as 32-bit lanes. */
TS_TARGET_AVX2 static inline __m256i bf16_narrow8(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                   _mm256_set1_epi32(0x7f800000));
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i rne = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
  __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
  return _mm256_blendv_epi8(rne, quiet, nan);
}

TS_TARGET_AVX2 TS_AI void adamw_range_avx2(float *master, void *param_out, float *m, float *v,
                                           const void *grad, size_t lo, size_t hi,
                                           ts_adamw_coeffs c, ts_dtype gdt, ts_dtype pdt) {
  size_t i = lo;
  while (i < hi && ((uintptr_t)(master + i) & 31)) i++; /* the masters' vectors aligned */
  adamw_range(master, param_out, m, v, grad, lo, i, c, gdt, pdt);
  for (; i + 8 <= hi; i += 8) {
    __m256 g;
    if (gdt == TS_FP32) {
      g = _mm256_loadu_ps((const float *)grad + i);
    } else if (gdt == TS_BF16) {
      __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)grad + i));
      g = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      float t[8];
      for (int k = 0; k < 8; k++) t[k] = ld(grad, i + (size_t)k, gdt);
      g = _mm256_loadu_ps(t);
    }
    __m256 p = adamw8(_mm256_loadu_ps(master + i), g, m + i, v + i, c);
    _mm256_storeu_ps(master + i, p);
    if (!param_out) continue;
    if (pdt == TS_FP32) {
      _mm256_storeu_ps((float *)param_out + i, p);
    } else if (pdt == TS_BF16) {
      __m256i n = bf16_narrow8(p);
      __m128i packed =
          _mm_packus_epi32(_mm256_castsi256_si128(n), _mm256_extracti128_si256(n, 1));
      _mm_storeu_si128((__m128i *)((uint16_t *)param_out + i), packed);
    } else {
      float t[8];
      _mm256_storeu_ps(t, p);
      for (int k = 0; k < 8; k++) st(param_out, i + (size_t)k, pdt, t[k]);
    }
  }
  adamw_range(master, param_out, m, v, grad, i, hi, c, gdt, pdt);
}

/* The sixteen lanes of ts_adamw_element, in its order. */
TS_TARGET_AVX512 static inline __m512 adamw16(__m512 p, __m512 g, float *m, float *v,
                                              ts_adamw_coeffs c) {
  __m512 one_b1 = _mm512_set1_ps(ts_fsub(1.0f, c.beta1));
  __m512 one_b2 = _mm512_set1_ps(ts_fsub(1.0f, c.beta2));
  __m512 mo = _mm512_loadu_ps(m), vo = _mm512_loadu_ps(v);
  g = _mm512_mul_ps(_mm512_set1_ps(c.grad_scale), g);
  __m512 mi = _mm512_add_ps(mo, _mm512_mul_ps(one_b1, _mm512_sub_ps(g, mo)));
  __m512 vi = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(c.beta2), vo),
                            _mm512_mul_ps(_mm512_mul_ps(one_b2, g), g));
  __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), _mm512_set1_ps(c.bc2_sqrt)),
                               _mm512_set1_ps(c.eps));
  p = _mm512_mul_ps(p, _mm512_set1_ps(c.decay));
  p = _mm512_sub_ps(p, _mm512_mul_ps(_mm512_set1_ps(c.step_size), _mm512_div_ps(mi, denom)));
  _mm512_storeu_ps(m, mi);
  _mm512_storeu_ps(v, vi);
  return p;
}

TS_TARGET_AVX512 TS_AI void adamw_range_avx512(float *master, void *param_out, float *m,
                                               float *v, const void *grad, size_t lo, size_t hi,
                                               ts_adamw_coeffs c, ts_dtype gdt, ts_dtype pdt) {
  size_t i = lo;
  while (i < hi && ((uintptr_t)(master + i) & 63)) i++; /* the masters' vectors on cache lines */
  adamw_range(master, param_out, m, v, grad, lo, i, c, gdt, pdt);
  for (; i + 16 <= hi; i += 16) {
    __m512 g;
    if (gdt == TS_FP32) {
      g = _mm512_loadu_ps((const float *)grad + i);
    } else if (gdt == TS_BF16) {
      __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)grad + i));
      g = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      float t[16];
      for (int k = 0; k < 16; k++) t[k] = ld(grad, i + (size_t)k, gdt);
      g = _mm512_loadu_ps(t);
    }
    __m512 p = adamw16(_mm512_loadu_ps(master + i), g, m + i, v + i, c);
    _mm512_storeu_ps(master + i, p);
    if (!param_out) continue;
    if (pdt == TS_FP32) {
      _mm512_storeu_ps((float *)param_out + i, p);
    } else if (pdt == TS_BF16) {
      __m512i u = _mm512_castps_si512(p);
      __mmask16 nan = _mm512_cmpgt_epi32_mask(
          _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
      __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
      __m512i rne = _mm512_srli_epi32(
          _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
      __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
      __m512i n = _mm512_mask_blend_epi32(nan, rne, quiet);
      _mm256_storeu_si256((__m256i *)((uint16_t *)param_out + i), _mm512_cvtepi32_epi16(n));
    } else {
      float t[16];
      _mm512_storeu_ps(t, p);
      for (int k = 0; k < 16; k++) st(param_out, i + (size_t)k, pdt, t[k]);
    }
  }
  adamw_range(master, param_out, m, v, grad, i, hi, c, gdt, pdt);
}

/* The AVX2 and AVX-512 bodies with both dtypes compile-time constants. */
TS_TARGET_AVX2 TS_AI void adamw_avx2_g(float *master, void *param_out, float *m, float *v,
                                       const void *grad, size_t lo, size_t hi, ts_adamw_coeffs c,
                                       ts_dtype pdt, ts_dtype gdt) {
  TS_DT_CALL(pdt, adamw_range_avx2, master, param_out, m, v, grad, lo, hi, c, gdt);
}
TS_TARGET_AVX2 static void adamw_avx2(float *master, void *param_out, float *m, float *v,
                                      const void *grad, size_t lo, size_t hi, ts_adamw_coeffs c,
                                      ts_dtype pdt, ts_dtype gdt) {
  TS_DT_CALL(gdt, adamw_avx2_g, master, param_out, m, v, grad, lo, hi, c, pdt);
}
TS_TARGET_AVX512 TS_AI void adamw_avx512_g(float *master, void *param_out, float *m, float *v,
                                           const void *grad, size_t lo, size_t hi,
                                           ts_adamw_coeffs c, ts_dtype pdt, ts_dtype gdt) {
  TS_DT_CALL(pdt, adamw_range_avx512, master, param_out, m, v, grad, lo, hi, c, gdt);
}
TS_TARGET_AVX512 static void adamw_avx512(float *master, void *param_out, float *m, float *v,
                                          const void *grad, size_t lo, size_t hi,
                                          ts_adamw_coeffs c, ts_dtype pdt, ts_dtype gdt) {
  TS_DT_CALL(gdt, adamw_avx512_g, master, param_out, m, v, grad, lo, hi, c, pdt);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The faster of the AVX-512 and AVX2 bodies on this CPU (2 or 1),
 * measured on an fp32 update of 8192 elements (L2-resident: the bodies'
 * arithmetic, not memory), the best of 5 runs each, interleaved. Where
 * 512-bit divides and square roots run as two 256-bit halves (AMD's Zen 4)
 * the AVX2 body measured faster; the bits are the same either way. */
static int faster_body(void) {
  enum { N = 8192 };
  float *a = aligned_alloc(64, 4 * N * sizeof(float));
  if (!a) return 2;
  for (int i = 0; i < 4 * N; i++) a[i] = i < 3 * N ? 0.5f : 1e-3f * (float)(i % 89);
  ts_adamw_coeffs c = ts_adamw_make_coeffs(1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f);
  double best[3] = {1e30, 1e30, 1e30};
  for (int rep = 0; rep < 5; rep++)
    for (int isa = 1; isa <= 2; isa++) {
      double t0 = now_s();
      if (isa == 2) adamw_avx512(a, NULL, a + N, a + 2 * N, a + 3 * N, 0, N, c, TS_FP32, TS_FP32);
      else adamw_avx2(a, NULL, a + N, a + 2 * N, a + 3 * N, 0, N, c, TS_FP32, TS_FP32);
      double t = now_s() - t0;
      if (t < best[isa]) best[isa] = t;
    }
  free(a);
  return best[1] < 0.97 * best[2] ? 1 : 2;
}

/* Sets ts_cpu_adamw_isa_max before main to the widest body within
 * oneDNN's cap (ts_cpu_isa_widest, isa.c), and ts_cpu_adamw_isa to the
 * faster body within it. */
__attribute__((constructor)) static void detect_adamw_isa(void) {
  int isa = ts_cpu_isa_widest();
  ts_cpu_adamw_isa_max = isa;
  ts_cpu_adamw_isa = isa == 2 ? faster_body() : isa;
}
#endif

/* adamw_range with the gradient dtype turned into a compile-time constant,
 * through the widest body ts_cpu_adamw_isa allows. */
TS_AI void adamw_range_g(float *master, void *param_out, float *m, float *v, const void *grad,
                         size_t lo, size_t hi, ts_adamw_coeffs c, ts_dtype pdt, ts_dtype gdt) {
#if TS_CPU_X86
  if (ts_cpu_adamw_isa >= 2) {
    adamw_avx512(master, param_out, m, v, grad, lo, hi, c, pdt, gdt);
    return;
  }
  if (ts_cpu_adamw_isa == 1) {
    adamw_avx2(master, param_out, m, v, grad, lo, hi, c, pdt, gdt);
    return;
  }
#endif
  TS_DT_CALL(pdt, adamw_range, master, param_out, m, v, grad, lo, hi, c, gdt);
}

/* ts_k_adamw's arguments, and one chunk of it. */
typedef struct adamw_args {
  float *master, *m, *v;
  void *param_out;
  const void *grad;
  ts_dtype param_dt, grad_dt;
  ts_adamw_coeffs c;
} adamw_args;

static void adamw_chunk(void *arg, size_t lo, size_t hi) {
  const adamw_args *x = arg;
  TS_DT_CALL(x->grad_dt, adamw_range_g, x->master, x->param_out, x->m, x->v, x->grad, lo, hi, x->c,
             x->param_dt);
}

ts_status ts_cpu_adamw(const ts_kctx *ctx, float *master, void *param_out, ts_dtype param_dt,
                       float *m, float *v, const void *grad, ts_dtype grad_dt, size_t n,
                       const ts_adamw_hparams *hp) {
  adamw_args x = {master,
                  m,
                  v,
                  param_out,
                  grad,
                  param_dt,
                  grad_dt,
                  ts_adamw_make_coeffs(hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay,
                                       hp->step, hp->grad_scale)};
  ts_cpu_for_chunks(n, adamw_chunk, &x);
  return TS_OK;
}
