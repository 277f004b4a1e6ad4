/*
 * fp8.h — the fp8 formats of fp8 training, shared by the CPU reference
 * (kernels/cpu/fp8.c) and the CUDA kernels (kernels/cuda/fp8.cu): the
 * conversions, the scale of a tensor or a row from its absolute maximum,
 * and the scaled, saturated cast of one element.
 *
 * Formats (Micikevicius et al. 2022, "FP8 Formats for Deep Learning", §3,
 * table 1; NVIDIA's __NV_E4M3 and __NV_E5M2 in cuda_fp8.h):
 *   E4M3 ("fn"): 4 exponent bits (bias 7), 3 mantissa bits, no infinities,
 *   S.1111.111 the only NaN; largest finite 448, smallest subnormal 2^-9.
 *   E5M2: IEEE-like, 5 exponent bits (bias 15), 2 mantissa bits, infinities
 *   and NaNs; largest finite 57344, smallest subnormal 2^-16.
 * Forward operands (activations, weights) are E4M3, gradients E5M2.
 *
 * Scaling (dynamic, as torchao's float8 training computes it:
 * torchao/float8/float8_utils.py amax_to_scale and
 * float8_scaling_utils): scale = max_finite / max(amax, 1e-12), divided in
 * fp64 and rounded once to fp32; with power-of-two rounding (rowwise)
 * scale = 2^floor(log2 scale). An element is cast as
 * fp8(clamp(x * scale, -max_finite, max_finite)), the product one fp32
 * multiplication, the cast round-to-nearest-even. A product of two cast
 * operands is undone by the inverses of their scales (1 / scale in fp32,
 * exact for powers of two).
 *
 * Every function is TS_HD (base/floats.h), written with integer operations
 * and IEEE-rounded fp32 (ts_fmul, ts_fdiv), so host and device give the same
 * bits; tests compare the conversion with NVIDIA's own (cuda_fp8.h's
 * __nv_cvt_float_to_fp8 with __NV_SATFINITE) on the host.
 */
#ifndef TS_KERNELS_FP8_H
#define TS_KERNELS_FP8_H

#include <stdint.h>

#include "base/floats.h"

/* The two formats. */
typedef enum ts_fp8_format {
  TS_FP8_E4M3 = 0, /* forward operands */
  TS_FP8_E5M2 = 1, /* gradients */
} ts_fp8_format;

/* Largest finite value: 448 (E4M3), 57344 (E5M2). */
TS_HD float ts_fp8_max(ts_fp8_format f) { return f == TS_FP8_E4M3 ? 448.0f : 57344.0f; }

/* x rounded to the nearest value of format f, ties to an even mantissa,
 * saturated to +-max finite (infinities included, NVIDIA's __NV_SATFINITE);
 * a NaN gives 0x7f, as NVIDIA's conversion does. */
TS_HD uint8_t ts_f32_to_fp8(float x, ts_fp8_format f) {
  const uint32_t M = f == TS_FP8_E4M3 ? 3u : 2u;        /* mantissa bits */
  const uint32_t bias = f == TS_FP8_E4M3 ? 7u : 15u;    /* exponent bias */
  const uint32_t maxcode = f == TS_FP8_E4M3 ? 0x7eu : 0x7bu; /* 448, 57344 */
  uint32_t u = ts_f32_bits(x);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fu;                   /* NaN */
  if (a >= 0x7f800000u) return (uint8_t)(sign | maxcode); /* inf saturates */
  /* fp32 exponent field of the format's smallest normal, 2^(1 - bias) */
  uint32_t emin = 127u + 1u - bias;
  uint32_t e = a >> 23, code;
  if (e >= emin) { /* normal result: rebias, round the mantissa to M bits */
    uint32_t drop = 23u - M;
    uint32_t r = a + ((1u << (drop - 1u)) - 1u) + ((a >> drop) & 1u);
    code = (r >> drop) - ((127u - bias) << M);
  } else if (e + M + 1u < emin) { /* below half the smallest subnormal */
    code = 0;
  } else { /* subnormal result, in units of 2^(1 - bias - M) */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t s = 23u + emin - M - e; /* 24 ... 24 + M */
    uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++; /* may carry to the smallest normal */
    code = q;
  }
  if (code > maxcode) code = maxcode;
  return (uint8_t)(sign | code);
}

/* The value of code b of format f, exactly. */
TS_HD float ts_fp8_to_f32(uint8_t b, ts_fp8_format f) {
  const uint32_t M = f == TS_FP8_E4M3 ? 3u : 2u;
  const uint32_t bias = f == TS_FP8_E4M3 ? 7u : 15u;
  uint32_t sign = (uint32_t)(b & 0x80u) << 24;
  uint32_t c = b & 0x7fu;
  if (f == TS_FP8_E4M3 && c == 0x7fu) return ts_bits_f32(sign | 0x7fc00000u);
  if (f == TS_FP8_E5M2 && c >= 0x7cu)
    return ts_bits_f32(sign | (c == 0x7cu ? 0x7f800000u : 0x7fc00000u));
  uint32_t E = c >> M, m = c & ((1u << M) - 1u);
  if (E == 0) { /* m x 2^(1 - bias - M), exact */
    float unit = ts_bits_f32((127u + 1u - bias - M) << 23);
    return ts_bits_f32(sign | ts_f32_bits(ts_fmul((float)m, unit)));
  }
  return ts_bits_f32(sign | ((E - bias + 127u) << 23) | (m << (23u - M)));
}

/* The quiet NaN both devices write for a NaN scale: x86's division keeps
 * a NaN operand's payload, CUDA's returns 0x7fffffff, so a NaN is
 * replaced by this one pattern before it is stored. */
#define TS_FP8_NAN_BITS 0x7fc00000u

/* The scale that maps amax (>= 0, the largest |x| of what it scales) onto
 * the largest finite value of f: max / max(amax, 1e-12) in fp64, rounded to
 * fp32, then rounded down to a power of two when pow2. A NaN amax gives
 * NaN (TS_FP8_NAN_BITS, whatever its payload) and an infinite one 0, so
 * the cast values, and the product, are not finite either (the step's
 * overflow check sees them). */
TS_HD float ts_fp8_scale(float amax, ts_fp8_format f, int pow2) {
  if ((ts_f32_bits(amax) & 0x7fffffffu) > 0x7f800000u) return ts_bits_f32(TS_FP8_NAN_BITS);
  double a = (double)amax;
  if (a < 1e-12) a = 1e-12;
  float s = (float)((double)ts_fp8_max(f) / a);
  uint32_t u = ts_f32_bits(s);
  if (pow2 && u > 0 && u < 0x7f800000u) s = ts_bits_f32(u & 0x7f800000u);
  return s;
}

/* The inverse scale that is stored beside the codes: 1 / scale rounded
 * to fp32, and TS_FP8_NAN_BITS for a NaN scale, so the CPU and the GPU
 * store the same bits (kernels/cuda/kernels_cuda_test.cc compares them). */
TS_HD float ts_fp8_scale_inv(float scale) {
  if ((ts_f32_bits(scale) & 0x7fffffffu) > 0x7f800000u) return ts_bits_f32(TS_FP8_NAN_BITS);
  return ts_fdiv(1.0f, scale);
}

/* fp8(clamp(x * scale, -max, max)) in format f; a NaN stays NaN. */
TS_HD uint8_t ts_fp8_cast(float x, float scale, ts_fp8_format f) {
  float v = ts_fmul(x, scale), mx = ts_fp8_max(f);
  if (v > mx) v = mx;
  else if (v < -mx) v = -mx;
  return ts_f32_to_fp8(v, f);
}

#endif /* TS_KERNELS_FP8_H */
