/*
 * cast.c — the CPU bodies of ts_k_cast (storage conversions between fp32,
 * bf16 and fp16) and ts_k_zero, and the widen/narrow helpers the
 * half-precision paths of other ops use.
 *
 * Invariants: conversions are the bit-exact ones of kernels/elementwise.h
 * (RNE narrowing, exact widening), so CPU and CUDA give the same bits.
 * Work is split in fixed 4096-element chunks; each element is converted
 * independently, so the result does not depend on the thread count.
 *
 * fp32 <-> fp16 and fp32 <-> bf16 run 8 elements at a time with F16C/AVX2
 * when ts_cpu_f16c says the CPU has them (functions compiled for those
 * extensions alone, chosen at run time; the rest of the binary stays baseline
 * x86-64). They give the software conversions' bits for every input:
 * - fp16 narrowing: VCVTPS2PH with immediate RNE (not MXCSR's mode) equals
 *   ts_f32_to_f16 on all 2^32 inputs, subnormals, overflow and NaN included.
 * - fp16 widening: VCVTPH2PS is exact but quiets a signalling NaN, which
 *   ts_f16_to_f32 keeps; a group of 8 holding any inf/NaN uses the software
 *   path (inf/NaN are rare, so the test for them costs little).
 * - bf16: the software formulas on 8 lanes of AVX2 integers.
 * kernels_convert_test compares each against the software path bit for bit
 * (and, with TS_TEST_EXHAUSTIVE=1, narrowing on all 2^32 inputs). This
 * assumes the default MXCSR (no denormals-are-zero), as all of the fp32
 * arithmetic here does; nothing in tessera changes it.
 */
#include <string.h>

#include "kernels/cpu/cpu_common.h"

#if TS_CPU_X86
#include <cpuid.h>
#include <immintrin.h>
#endif

int ts_cpu_f16c = 0;

#if TS_CPU_X86
/* Sets ts_cpu_f16c before main. __builtin_cpu_supports("avx2") also checks
 * that the OS saves the YMM registers (XCR0); F16C is CPUID leaf 1's ECX
 * bit 29 (read directly: clang 14's __builtin_cpu_supports has no "f16c"). */
__attribute__((constructor)) static void detect_f16c(void) {
  __builtin_cpu_init();
  unsigned a, b, c, d;
  int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  ts_cpu_f16c = f16c && __builtin_cpu_supports("avx2");
}

#define TS_TARGET_F16C __attribute__((target("avx2,f16c")))

/* dst[i] = ts_f16_to_f32(src[i]) for i in [0, n). */
TS_TARGET_F16C static void f16_to_f32_x86(float *dst, const uint16_t *src, size_t n) {
  const __m128i exp_mask = _mm_set1_epi16(0x7c00);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
    __m128i special = _mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask); /* inf/NaN */
    if (_mm_testz_si128(special, special))
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    else
      for (size_t k = i; k < i + 8; k++) dst[k] = ts_f16_to_f32(src[k]);
  }
  for (; i < n; i++) dst[i] = ts_f16_to_f32(src[i]);
}

/* dst[i] = ts_f32_to_f16(src[i]) for i in [0, n). */
TS_TARGET_F16C static void f32_to_f16_x86(uint16_t *dst, const float *src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) dst[i] = ts_f32_to_f16(src[i]);
}

/* dst[i] = ts_bf16_to_f32(src[i]) for i in [0, n): the bits shifted up 16. */
TS_TARGET_F16C static void bf16_to_f32_x86(float *dst, const uint16_t *src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
    _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(u, 16));
  }
  for (; i < n; i++) dst[i] = ts_bf16_to_f32(src[i]);
}

/* dst[i] = ts_f32_to_bf16(src[i]) for i in [0, n), lane by lane the same
 * integer steps: NaN -> (u >> 16) | 0x40, else (u + 0x7fff + lsb) >> 16. */
TS_TARGET_F16C static void f32_to_bf16_x86(uint16_t *dst, const float *src, size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i u = _mm256_loadu_si256((const __m256i *)(src + i));
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i rne = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(hi, one)), 16);
    /* |u| > inf as signed 32-bit: both sides are below 2^31 */
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    __m256i r = _mm256_blendv_epi8(rne, _mm256_or_si256(hi, quiet), nan);
    /* r < 2^16 in every lane: packus keeps it; it packs within 128-bit
     * halves, so gather the two 64-bit results into the low half. */
    __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)(dst + i), _mm256_castsi256_si128(p));
  }
  for (; i < n; i++) dst[i] = ts_f32_to_bf16(src[i]);
}

/* Converts n elements with the routines above; returns 0 (nothing written)
 * where they do not apply: no F16C/AVX2, or neither side fp32. */
static int convert_x86(void *out, ts_dtype odt, const void *in, ts_dtype idt, size_t n) {
  if (!ts_cpu_f16c) return 0;
  if (odt == TS_FP32 && idt == TS_FP16)
    f16_to_f32_x86((float *)out, (const uint16_t *)in, n);
  else if (odt == TS_FP32 && idt == TS_BF16)
    bf16_to_f32_x86((float *)out, (const uint16_t *)in, n);
  else if (idt == TS_FP32 && odt == TS_FP16)
    f32_to_f16_x86((uint16_t *)out, (const float *)in, n);
  else if (idt == TS_FP32 && odt == TS_BF16)
    f32_to_bf16_x86((uint16_t *)out, (const float *)in, n);
  else
    return 0;
  return 1;
}
#endif

/* Converts elements [lo, hi) from in (IDT) to out (ODT). */
TS_AI void cast_range(void *out, const void *in, size_t lo, size_t hi, ts_dtype idt, ts_dtype odt) {
  for (size_t i = lo; i < hi; i++) st(out, i, odt, ld(in, i, idt));
}

/* Converts n elements from in (idt) to out (odt), one thread; out and in
 * point at the first element of each side. */
static void convert(void *out, ts_dtype odt, const void *in, ts_dtype idt, size_t n) {
  if (odt == idt) {
    if (out != in) memcpy(out, in, n * ts_dtype_size(odt));
    return;
  }
#if TS_CPU_X86
  if (convert_x86(out, odt, in, idt, n)) return;
#endif
  if (idt == TS_FP32)
    TS_DT_CALL(odt, cast_range, out, in, 0, n, TS_FP32);
  else if (idt == TS_BF16)
    TS_DT_CALL(odt, cast_range, out, in, 0, n, TS_BF16);
  else
    TS_DT_CALL(odt, cast_range, out, in, 0, n, TS_FP16);
}

/* A cast's arguments, and one chunk of it. */
typedef struct cast_args {
  void *out;
  const void *in;
  ts_dtype odt, idt;
} cast_args;

static void cast_chunk(void *arg, size_t lo, size_t hi) {
  const cast_args *x = arg;
  convert((char *)x->out + lo * ts_dtype_size(x->odt), x->odt,
          (const char *)x->in + lo * ts_dtype_size(x->idt), x->idt, hi - lo);
}

static void cast_cpu(void *out, ts_dtype odt, const void *in, ts_dtype idt, size_t n) {
  cast_args x = {out, in, odt, idt};
  ts_cpu_for_chunks(n, cast_chunk, &x);
}

void ts_cpu_widen(float *dst, const void *src, size_t n, ts_dtype dt) {
  cast_cpu(dst, TS_FP32, src, dt, n);
}

void ts_cpu_narrow(void *dst, const float *src, size_t n, ts_dtype dt) {
  cast_cpu(dst, dt, src, TS_FP32, n);
}

void ts_cpu_widen_at(float *dst, const void *src, size_t i0, size_t n, ts_dtype dt) {
  convert(dst, TS_FP32, (const char *)src + i0 * ts_dtype_size(dt), dt, n);
}

void ts_cpu_narrow_at(void *dst, size_t i0, const float *src, size_t n, ts_dtype dt) {
  convert((char *)dst + i0 * ts_dtype_size(dt), dt, src, TS_FP32, n);
}

ts_status ts_cpu_cast(const ts_kctx *ctx, void *out, ts_dtype out_dt, const void *in,
                      ts_dtype in_dt, size_t n) {
  cast_cpu(out, out_dt, in, in_dt, n);
  return TS_OK;
}

ts_status ts_cpu_zero(const ts_kctx *ctx, void *x, size_t nbytes) {
  memset(x, 0, nbytes);
  return TS_OK;
}
