/*
 * elementwise.h — per-element math shared by the CPU loops (kernels/cpu/)
 * and the CUDA kernels (kernels/cuda/): storage conversions, SiLU and the
 * AdamW element update.
 *
 * Every function is TS_HD: `__host__ __device__ __forceinline__` under nvcc,
 * `static inline` elsewhere, so gcc and nvcc compile the same source.
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
 *   ts_fsub/ts_fdiv, which are single IEEE-rounded operations on both sides
 *   (on the device, __fmul_rn etc. forbid nvcc's fused multiply-add). The
 *   host side relies on the compiler not contracting a*b+c into an FMA, which
 *   holds for the project's x86-64 flags (no -march=native, no -ffast-math).
 * - uint16_t is the storage type of bf16 and fp16 values.
 */
#ifndef TS_KERNELS_ELEMENTWISE_H
#define TS_KERNELS_ELEMENTWISE_H

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

/* ---- activations ------------------------------------------------------------ */

/* SiLU (Elfwing et al. 2018; Shazeer 2020 eq. 6): x * sigmoid(x) = x / (1 + e^-x).
 * For x -> -inf, e^-x overflows to inf and the result is -0, as in PyTorch. */
TS_HD float ts_silu(float x) { return x / (1.0f + expf(-x)); }

/* d silu / dx = s (1 + x (1 - s)), s = sigmoid(x). */
TS_HD float ts_silu_grad(float x) {
  float s = 1.0f / (1.0f + expf(-x));
  return s * (1.0f + x * (1.0f - s));
}

/* Both of the above from one exponential: *silu gets ts_silu(x)'s bits,
 * *grad gets ts_silu_grad(x)'s bits. */
TS_HD void ts_silu_and_grad(float x, float *silu, float *grad) {
  float d = 1.0f + expf(-x);
  float s = 1.0f / d;
  *silu = x / d;
  *grad = s * (1.0f + x * (1.0f - s));
}

/* ---- AdamW (Loshchilov & Hutter 2019, Algorithm 2; torch.optim.AdamW) ---- */

/* Per-step constants of the AdamW update, computed once on the host. */
typedef struct ts_adamw_coeffs {
  float beta1;      /* first-moment decay */
  float beta2;      /* second-moment decay */
  float eps;        /* added to the bias-corrected sqrt(v) */
  float decay;      /* 1 - lr * weight_decay (decoupled weight decay) */
  float step_size;  /* lr / (1 - beta1^t) */
  float bc2_sqrt;   /* sqrt(1 - beta2^t) */
  float grad_scale; /* multiplies the raw gradient first */
} ts_adamw_coeffs;

/* Host-side: the constants of step t >= 1. Bias corrections are computed in
 * double, as torch.optim.AdamW does with Python floats, then rounded. */
static inline ts_adamw_coeffs ts_adamw_make_coeffs(float lr, float beta1, float beta2, float eps,
                                                   float weight_decay, int step, float grad_scale) {
  ts_adamw_coeffs c;
  double bc1 = 1.0 - pow((double)beta1, (double)step);
  double bc2 = 1.0 - pow((double)beta2, (double)step);
  c.beta1 = beta1;
  c.beta2 = beta2;
  c.eps = eps;
  c.decay = (float)(1.0 - (double)lr * (double)weight_decay);
  c.step_size = (float)((double)lr / bc1);
  c.bc2_sqrt = (float)sqrt(bc2);
  c.grad_scale = grad_scale;
  return c;
}

/* One element of AdamW, in the order of torch's _single_tensor_adam:
 *   g = grad_scale * grad
 *   m = m + (1 - b1) (g - m)            (torch's lerp; = b1 m + (1-b1) g)
 *   v = b2 v + (1 - b2) g^2
 *   p = p * (1 - lr wd)
 *   p = p - step_size * (m / (sqrt(v) / sqrt(1 - b2^t) + eps))
 * m and v are updated in place; returns the new master value p. Every
 * operation is one IEEE-rounded fp32 operation on CPU and CUDA alike. */
TS_HD float ts_adamw_element(float p, float grad, float *m, float *v, ts_adamw_coeffs c) {
  float g = ts_fmul(c.grad_scale, grad);
  float mi = ts_fadd(*m, ts_fmul(ts_fsub(1.0f, c.beta1), ts_fsub(g, *m)));
  float vi = ts_fadd(ts_fmul(c.beta2, *v), ts_fmul(ts_fmul(ts_fsub(1.0f, c.beta2), g), g));
  float denom = ts_fadd(ts_fdiv(ts_fsqrt(vi), c.bc2_sqrt), c.eps);
  p = ts_fmul(p, c.decay);
  p = ts_fsub(p, ts_fmul(c.step_size, ts_fdiv(mi, denom))); /* addcdiv: value * (m / denom) */
  *m = mi;
  *v = vi;
  return p;
}

#endif /* TS_KERNELS_ELEMENTWISE_H */
