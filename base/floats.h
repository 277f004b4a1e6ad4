/*
 * floats.h — the storage formats of tessera's dtypes and the IEEE-rounded
 * fp32 arithmetic that host and device share bit for bit: bit casts, bf16
 * and fp16 conversions (round to nearest even), and one-rounding add,
 * subtract, multiply, divide and square root.
 *
 * Every function is TS_HD: `__host__ __device__ __forceinline__` under nvcc,
 * `static inline` elsewhere, so gcc and nvcc compile the same source. The
 * kernels (kernels/elementwise.h builds on this) and comm/'s rank-order sums
 * use these, so a value is converted and summed the same way everywhere.
 *
 * Invariants:
 * - Conversions are pure bit manipulation (no compiler _Float16/__bf16, no
 *   hardware conversion instructions), so every compiler and device gives the
 *   same bits. Narrowing rounds to nearest, ties to even (IEEE 754 default).
 *   (The CPU kernels may convert with x86 F16C/AVX2 instead, chosen at run
 *   time; kernels/cpu/cast.c says why the bits are the same, and
 *   kernels_convert_test checks them against these functions.)
 * - NaN stays NaN: narrowing keeps the sign and the top payload bits and sets
 *   the quiet bit; widening is exact (payload kept as is).
 * - Arithmetic that CPU and CUDA must agree on goes through ts_fmul/ts_fadd/
 *   ts_fsub/ts_fdiv/ts_fsqrt, which are single IEEE-rounded operations on
 *   both sides (on the device, __fmul_rn etc. forbid nvcc's fused
 *   multiply-add). The host side relies on the compiler not contracting
 *   a*b+c into an FMA, which holds for the project's x86-64 flags
 *   (-ffp-contract=off, no -march=native, no -ffast-math).
 * - uint16_t is the storage type of bf16 and fp16 values.
 */
#ifndef TS_BASE_FLOATS_H
#define TS_BASE_FLOATS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define TS_HD __host__ __device__ __forceinline__
#else
#define TS_HD static inline
#endif

/* ---- bit casts ----------------------------------------------------------- */

/* The IEEE binary32 bits of f. */
TS_HD uint32_t ts_f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

/* The float whose IEEE binary32 bits are u. */
TS_HD float ts_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/* ---- bfloat16 (1 sign, 8 exponent, 7 mantissa bits; top half of fp32) ---- */

/* Exact widening: the bf16 bits become the top 16 bits of the fp32. */
TS_HD float ts_bf16_to_f32(uint16_t h) { return ts_bits_f32((uint32_t)h << 16); }

/* Round-to-nearest-even narrowing. Overflow rounds to inf (as IEEE RNE does
 * above the largest finite bf16), NaN becomes a quiet NaN with its sign and
 * top payload bits. */
TS_HD uint16_t ts_f32_to_bf16(float f) {
  uint32_t u = ts_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u); /* RNE on the 16 dropped bits */
  return (uint16_t)(u >> 16);
}

/* ---- IEEE binary16 (1 sign, 5 exponent, 10 mantissa bits) ---------------- */

/* Exact widening, subnormals included. A subnormal h is mant * 2^-24; that
 * product is exact in fp32 (mant < 2^10, a power-of-two scale, a normal
 * result), so it is computed by one multiplication instead of a loop. */
TS_HD float ts_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu; /* exponent and mantissa */
  if (em >= 0x7c00u) return ts_bits_f32(sign | 0x7f800000u | ((em & 0x3ffu) << 13)); /* inf, NaN */
  if (em >= 0x0400u) return ts_bits_f32(sign | ((em << 13) + 0x38000000u));   /* rebias 15 -> 127 */
  return ts_bits_f32(sign | ts_f32_bits((float)em * 5.9604644775390625e-8f)); /* em * 2^-24 */
}

/* Round-to-nearest-even narrowing. |f| >= 65520 (65504 plus half an ulp)
 * becomes inf; results below 2^-14 are subnormals, rounded correctly; NaN
 * becomes a quiet NaN with its sign and top payload bits. */
TS_HD uint16_t ts_f32_to_f16(float f) {
  uint32_t u = ts_f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 and inf */
  if (a >= 0x38800000u) { /* normal result: rebias 127 -> 15, RNE on 13 bits */
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
  }
  if (a < 0x33000000u) return (uint16_t)sign; /* below 2^-25: rounds to zero */
  /* subnormal result, in units of 2^-24: (1.m * 2^(e-127)) / 2^-24 */
  uint32_t e = a >> 23; /* 102 ... 112 */
  uint32_t m = (a & 0x7fffffu) | 0x800000u;
  uint32_t s = 126u - e; /* 14 ... 24 */
  uint32_t q = m >> s;
  uint32_t rem = m & ((1u << s) - 1u);
  uint32_t half = 1u << (s - 1u);
  if (rem > half || (rem == half && (q & 1u))) q++; /* may carry into 2^-14: still right */
  return (uint16_t)(sign | q);
}

/* ---- IEEE-rounded arithmetic that CPU and CUDA share bit for bit --------- */

TS_HD float ts_fmul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TS_HD float ts_fadd(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TS_HD float ts_fsub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TS_HD float ts_fdiv(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
TS_HD float ts_fsqrt(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return sqrtf(a);
#endif
}

#endif /* TS_BASE_FLOATS_H */
