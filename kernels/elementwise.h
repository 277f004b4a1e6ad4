/*
 * elementwise.h — per-element math shared by the CPU loops (kernels/cpu/)
 * and the CUDA kernels (kernels/cuda/): SiLU, GELU (erf and tanh forms) and
 * the AdamW element update,
 * on top of base/floats.h (storage conversions and IEEE-rounded fp32
 * arithmetic, which this header re-exports).
 *
 * Every function is TS_HD (base/floats.h): host and device compile the same
 * source, and arithmetic both must agree on bit for bit goes through
 * ts_fmul/ts_fadd/ts_fsub/ts_fdiv/ts_fsqrt.
 */
#ifndef TS_KERNELS_ELEMENTWISE_H
#define TS_KERNELS_ELEMENTWISE_H

#include <math.h>
#include <stdint.h>

#include "base/floats.h"

/* ---- activations ------------------------------------------------------------ */

/* SiLU (Elfwing et al. 2018; Shazeer 2020 eq. 6): x * sigmoid(x) = x / (1 + e^-x).
 * For x -> -inf, e^-x overflows to inf and the result is -0, as in PyTorch. */
TS_HD float ts_silu(float x) { return x / (1.0f + expf(-x)); }

/* d silu / dx = s (1 + x (1 - s)), s = sigmoid(x). */
TS_HD float ts_silu_grad(float x) {
  float s = 1.0f / (1.0f + expf(-x));
  return s * (1.0f + x * (1.0f - s));
}

/* SiLU and its derivative from a given e^-x (exp_neg_x): the one body of
 * ts_silu_and_grad and of the CPU's vectorised form (cpu_common.h), which
 * passes its own exponential. */
TS_HD void ts_silu_and_grad_of(float x, float exp_neg_x, float *silu, float *grad) {
  float d = 1.0f + exp_neg_x;
  float s = 1.0f / d;
  *silu = x / d;
  *grad = s * (1.0f + x * (1.0f - s));
}

/* Both of the above from one exponential: *silu gets ts_silu(x)'s bits,
 * *grad gets ts_silu_grad(x)'s bits. */
TS_HD void ts_silu_and_grad(float x, float *silu, float *grad) {
  ts_silu_and_grad_of(x, expf(-x), silu, grad);
}

/* GELU (Hendrycks & Gimpel 2016) in PyTorch's fp32 operation order
 * (aten/src/ATen/native/cuda/ActivationGeluKernel.cu, GeluCUDAKernelImpl and
 * GeluBackwardCUDAKernelImpl; the CPU kernel computes the same expressions).
 * erff, expf and tanhf are libm's on the host and CUDA's on the device, so
 * the backends agree within a few ulps, not bit for bit. */
#define TS_GELU_SQRT1_2 0.70710678118654752440f     /* 1/sqrt(2): torch's kAlpha (M_SQRT1_2) */
#define TS_GELU_INV_SQRT_2PI 0.39894228040143267794f /* 1/sqrt(2 pi): erf backward's kBeta */
#define TS_GELU_SQRT_2_PI 0.79788456080286535588f    /* sqrt(2/pi): tanh form's kBeta */
#define TS_GELU_KAPPA 0.044715f                      /* tanh form's cubic coefficient */

/* Erf form, torch GELU(): x * 0.5 * (1 + erf(x / sqrt 2)). */
TS_HD float ts_gelu_erf(float x) { return x * 0.5f * (1.0f + erff(x * TS_GELU_SQRT1_2)); }

/* d gelu_erf / dx = cdf + x pdf: 0.5 (1 + erf(x / sqrt 2)) + x e^(-x^2/2) / sqrt(2 pi). */
TS_HD float ts_gelu_erf_grad(float x) {
  float cdf = 0.5f * (1.0f + erff(x * TS_GELU_SQRT1_2));
  float pdf = expf(-0.5f * x * x) * TS_GELU_INV_SQRT_2PI;
  return cdf + x * pdf;
}

/* Tanh form, torch GELU(approximate="tanh") (Hugging Face "gelu_new"):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
TS_HD float ts_gelu_tanh(float x) {
  float x_cube = x * x * x;
  float inner = TS_GELU_SQRT_2_PI * (x + TS_GELU_KAPPA * x_cube);
  return 0.5f * x * (1.0f + tanhf(inner));
}

/* d gelu_tanh / dx, as torch's GeluBackward (approximate="tanh"), t =
 * tanh(inner): 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2). */
TS_HD float ts_gelu_tanh_grad(float x) {
  float x_sq = x * x;
  float x_cube = x_sq * x;
  float inner = TS_GELU_SQRT_2_PI * (x + TS_GELU_KAPPA * x_cube);
  float t = tanhf(inner);
  float left = 0.5f * x;
  float right = 1.0f + t;
  float left_derivative = 0.5f * right;
  float tanh_derivative = 1.0f - t * t;
  float inner_derivative = TS_GELU_SQRT_2_PI * (1.0f + 3.0f * TS_GELU_KAPPA * x_sq);
  float right_derivative = left * tanh_derivative * inner_derivative;
  return left_derivative + right_derivative;
}

/* gelu(x) of the given form (kind: kernels.h's ts_gelu_kind, 0 erf, 1 tanh). */
TS_HD float ts_gelu(float x, int tanh_form) {
  return tanh_form ? ts_gelu_tanh(x) : ts_gelu_erf(x);
}

/* gelu'(x) of the given form. */
TS_HD float ts_gelu_grad(float x, int tanh_form) {
  return tanh_form ? ts_gelu_tanh_grad(x) : ts_gelu_erf_grad(x);
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

/* One element of AdamW, in the order of torch's _single_tensor_adam (its
 * formula; the bits differ where torch rounds 1 - beta from a double and
 * fuses in its vector kernels: tools/bench_adamw.sh counts them):
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
